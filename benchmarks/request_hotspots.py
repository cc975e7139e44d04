"""Where a request's host time goes: ``tessera.attention(q, k, v, new_mask())`` repeated under
cProfile (the functions with the most own and cumulative time), next to its CUDA-event time
and the kernel alone -- what to cut to bring request time towards kernel time (#4, #5).

    python3 benchmarks/request_hotspots.py [--shape wan-1.3b-480p] [--density 0.1] [--n 200]
        [--regime NAME]   (a plan.regime.name, e.g. the portable family's on any GPU)
        [--what request|run|plan]   (profile the whole request, a prepared plan's run, or
                                     planning a new mask object)
        [--new-plans]   (tessera.attention keeps no plan: every request plans anew)
"""

import argparse
import cProfile
import io
import math
import pstats
import sys
import time

import numpy as np

import tessera
from tessera.bench import cuda_time_ms
from tessera.workloads import WORKLOADS


def random_request(shape: str, density: float):
    """A model shape's random q/k/v (torch bf16, B = 1) and a maker of new mask objects over one
    random 128-token block matrix of that density: (heads, head dim, (q, k, v), new_mask)."""
    import torch

    w = WORKLOADS[shape]
    h, d, L = w.heads, w.head_dim, w.seq_len
    q, k, v = (torch.randn(1, h, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    n = math.ceil(L / 128)
    blocks = torch.from_numpy(np.random.default_rng(0).random((h, n, n)) < density).cuda()

    def new_mask():
        return tessera.BlockMask.from_dense(blocks, block_size=128, seq_len_q=L, seq_len_kv=L)

    return h, d, (q, k, v), new_mask


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan-1.3b-480p")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--n", type=int, default=200, help="requests profiled")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--regime", default=None, help="a regime name instead of the default")
    ap.add_argument("--what", choices=("request", "run", "plan"), default="request",
                    help="what is profiled")
    ap.add_argument("--new-plans", action="store_true",
                    help="tessera.attention keeps no plans between requests")
    args = ap.parse_args(argv)
    if args.new_plans:
        from tessera import api

        api.request_plans_kept = 0
    h, d, (q, k, v), new_mask = random_request(args.shape, args.density)
    from tessera.runtime.regime import regime_from_name

    regime = regime_from_name(args.regime) if args.regime else None

    def request():
        return tessera.attention(q, k, v, new_mask(), regime=regime)

    p = tessera.plan(new_mask(), num_q_heads=h, head_dim=d, regime=regime)
    profiled = {"request": request, "run": lambda: p.run(q, k, v),
                "plan": lambda: tessera.plan(new_mask(), num_q_heads=h, head_dim=d,
                                             regime=regime)}[args.what]
    kernel = cuda_time_ms(lambda: p.run(q, k, v), 20)
    req = cuda_time_ms(request, 20)
    plan = cuda_time_ms(lambda: tessera.plan(new_mask(), num_q_heads=h, head_dim=d,
                                             regime=regime), 20)
    mask = cuda_time_ms(new_mask, 20)
    # Back to back, one synchronization per 20 requests: what a model's layer loop sees when the
    # host runs ahead of the GPU (host time hidden unless it exceeds the device's).
    burst = cuda_time_ms(lambda: [request() for _ in range(20)], 5) / 20
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.n):
        profiled()
    host = (time.perf_counter() - t0) * 1e3 / args.n
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(args.n):
        profiled()
    torch.cuda.synchronize()
    prof.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.top)
        print(f"== by {key} ({args.n} x {args.what})\n" + s.getvalue().split("\n\n", 2)[-1])
    print(f"{args.shape} density {args.density}: kernel {kernel:.3f} ms, request {req:.3f} ms, "
          f"plan {plan:.3f} ms, mask object {mask:.3f} ms, back-to-back {burst:.3f} ms/request, "
          f"host {host:.3f} ms per {args.what} ({p.regime.name}"
          f"{', new plans' if args.new_plans else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
