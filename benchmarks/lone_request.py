"""Where a lone call's and a lone request's time goes: the host's time in the call, and every
GPU kernel's duration (a CUDA profiler trace), for a prepared plan's run and for
``tessera.attention`` with a new mask, each issued after the GPU and the host have been idle a
few milliseconds (a lone request, as a layer that waits on something else issues it) and back to
back. Needs a GPU and PyTorch.

    python3 benchmarks/lone_request.py --shape wan-1.3b-480p,cogvideox-5b --case random-10
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any, Callable


def _host_ms(fn: Callable[[], Any], n: int, idle_s: float | None) -> float:
    """Median host time of ``fn`` (ms); with ``idle_s``, each call after a synchronization and
    that long a sleep."""
    import torch

    times = []
    for _ in range(n):
        if idle_s is not None:
            torch.cuda.synchronize()
            time.sleep(idle_s)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return 1e3 * statistics.median(times)


def _kernel_ms(fn: Callable[[], Any], n: int, idle_s: float) -> dict[str, float]:
    """Median GPU duration (ms) of each kernel or copy ``fn`` launches, over ``n`` lone calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            torch.cuda.synchronize()
            time.sleep(idle_s)
            fn()
        torch.cuda.synchronize()
    got: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            got.setdefault(e.name.split("(")[0][:32], []).append(e.device_time_total / 1e3)
    return {name: statistics.median(ts) for name, ts in got.items()}


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import torch

    import tessera
    from tessera.tools.bench import CASES
    from tessera.tools.timing import cuda_time_ms
    from tessera.tools.workloads import WORKLOADS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="wan-1.3b-480p,cogvideox-5b",
                    help="comma list of tessera.tools.workloads shapes")
    ap.add_argument("--case", default="random-10", choices=sorted(
        c for c, v in CASES.items() if v.sizes is None and v.block == 128))
    ap.add_argument("--calls", type=int, default=20, help="lone calls per figure")
    ap.add_argument("--idle-ms", type=float, default=3.0, help="idle time before a lone call")
    args = ap.parse_args(argv)
    shapes = args.shape.split(",")
    for s in shapes:
        if s not in WORKLOADS:
            ap.error(f"--shape: {s!r} is not one of {sorted(WORKLOADS)}")
    if args.calls < 1 or args.idle_ms < 0:
        ap.error("--calls must be at least 1 and --idle-ms at least 0")
    idle = args.idle_ms / 1e3
    for shape in shapes:
        w, c = WORKLOADS[shape], CASES[args.case]
        n = math.ceil(w.seq_len / c.block)
        bounds = np.minimum(np.arange(n + 1) * c.block, w.seq_len)
        blocks = torch.from_numpy(c.make(np.random.default_rng(0), w.heads, n)).cuda()
        q, k, v = (torch.randn(1, w.heads, w.seq_len, w.head_dim, device="cuda",
                               dtype=torch.bfloat16) for _ in range(3))

        def new_mask():
            return tessera.BlockMask.from_dense(blocks, q_bounds=bounds, kv_bounds=bounds)

        p = tessera.plan(new_mask(), num_q_heads=w.heads, head_dim=w.head_dim)
        run = lambda: p.run(q, k, v)  # noqa: E731
        request = lambda: tessera.attention(q, k, v, new_mask())  # noqa: E731
        for _ in range(5):
            run(), request()
        torch.cuda.synchronize()
        print(f"{shape} {args.case} ({p.regime.name}), ms:")
        print(f"  kernel, 10 calls back to back: {cuda_time_ms(run, 10, burst=10):.3f}; "
              f"lone call {cuda_time_ms(run, 10):.3f}; lone request "
              f"{cuda_time_ms(request, 10):.3f}")
        for label, fn in (("call", run), ("request", request)):
            print(f"  {label}: host time lone {_host_ms(fn, args.calls, idle):.3f}, back to back "
                  f"{_host_ms(fn, args.calls, None):.3f}; GPU, lone: " + ", ".join(
                      f"{name} {t:.4f}" for name, t in _kernel_ms(fn, args.calls, idle).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
