"""Host time of a request's phases, one call at a time with the GPU idle at its start (the
host's own costs, since a sync-free plan never waits for the GPU): building the mask object,
planning, launching a plan, and the whole ``tessera.attention`` call; plus the CUDA-event time
of one request alone and of the kernel. What #4's request target (1.5x FlexAttention's
request at ~10%) leaves to cut: request alone ~= host time + kernel time.

    python3 benchmarks/request_phases.py [--shape wan-1.3b-480p] [--density 0.1] [--n 300]
"""

import argparse
import cProfile
import io
import pstats
import sys
import time

import numpy as np

import tessera
from tessera.bench import cuda_time_ms

from request_hotspots import random_request  # this folder's: run as a script


def host_us(fn, n: int) -> float:
    """Median host microseconds of one call of ``fn``, the GPU idle when it starts (a
    synchronization between calls, not timed: back to back, the launch queue would fill and
    the host would wait for the GPU)."""
    import torch

    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return float(np.median(times))


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan-1.3b-480p")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="cProfile the whole call too")
    args = ap.parse_args(argv)
    h, d, (q, k, v), new_mask = random_request(args.shape, args.density)
    m = new_mask()
    p = tessera.plan(m, num_q_heads=h, head_dim=d)
    p.run(q, k, v)
    phases = {
        "mask object": lambda: new_mask(),
        "plan (mask given)": lambda: tessera.plan(m, num_q_heads=h, head_dim=d),
        "run (plan given)": lambda: p.run(q, k, v),
        "attention (all)": lambda: tessera.attention(q, k, v, new_mask()),
    }
    for name, fn in phases.items():
        print(f"{name:20} {host_us(fn, args.n):8.1f} us host")
    kernel = cuda_time_ms(lambda: p.run(q, k, v), 20)
    req = cuda_time_ms(lambda: tessera.attention(q, k, v, new_mask()), 20)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.n):
            tessera.attention(q, k, v, new_mask())
        prof.disable()
        torch.cuda.synchronize()
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(30)
            print(f"== by {key}\n" + s.getvalue().split("\n\n", 2)[-1])
    print(f"{args.shape} density {args.density}: kernel {kernel:.3f} ms, request alone {req:.3f} "
          f"ms, sync-free plan: {p.sync_free} ({p.regime.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
