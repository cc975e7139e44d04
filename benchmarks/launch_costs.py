"""Host microseconds of the pieces of a request (a CuPy RawKernel launch with the attention
kernel's 29 arguments, allocations, stream and event calls, the mask object, planning, running):
where the request path's remaining host time goes. The GPU is idle at the start of every call.

    python3 benchmarks/launch_costs.py
"""

import cProfile
import math
import pstats
import time

import cupy as cp
import numpy as np
import torch

import tessera
from tessera import api
from tessera.cuda.loader import load_kernel, smem_bytes


def us(fn, n: int = 300) -> float:
    """Median host microseconds of one call of ``fn``."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return float(np.median(times)) * 1e6


def main() -> None:
    h, d, L = 12, 128, 32760
    q, k, v = (torch.randn(1, h, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    n = math.ceil(L / 128)
    blocks = torch.from_numpy(np.random.default_rng(0).random((h, n, n)) < 0.1).cuda()
    m = tessera.BlockMask.from_dense(blocks, block_size=128, seq_len_q=L, seq_len_kv=L)
    p = tessera.plan(m, num_q_heads=h, head_dim=d)
    p.run(q, k, v)
    fwd = p.regime.variant(d, True)
    fn = load_kernel(fwd)
    out = torch.empty_like(q)
    lq = p.launch_queue
    i64, i32, f32, ptr = np.int64, np.int32, np.float32, np.uint64

    def args():
        # max_tasks 0 and no device count: the one CTA launched returns at once.
        return (lq.tasks, lq.spans, ptr(q.data_ptr()), *map(i64, (1, 1, 1)),
                ptr(k.data_ptr()), *map(i64, (1, 1, 1)), ptr(v.data_ptr()), *map(i64, (1, 1, 1)),
                ptr(out.data_ptr()), *map(i64, (1, 1, 1)), ptr(0), i64(0), i64(0),
                ptr(0), ptr(0), i32(128), i32(1), f32(0.1), i32(0),
                ptr(0), ptr(0))

    a = args()
    s = cp.cuda.Stream.null
    rows = {
        "RawKernel launch (29 args, 1 CTA)": lambda: fn((1,), (fwd.threads,), a,
                                                         shared_mem=smem_bytes(fwd), stream=s),
        "argument tuple": args,
        "cp.empty(100)": lambda: cp.empty(100, dtype=cp.int64),
        "torch new_empty": lambda: q.new_empty((1, h, L, d)),
        "memsetAsync": lambda: cp.cuda.runtime.memsetAsync(out.data_ptr(), 0, 4, 0),
        "torch current_stream": lambda: torch.cuda.current_stream(0).cuda_stream,
        "_describe q, k, v": lambda: api._describe(q, k, v, "bhld"),
        "cupy Event + record": lambda: cp.cuda.Event(disable_timing=True).record(),
        "BlockMask.from_dense": lambda: tessera.BlockMask.from_dense(
            blocks, block_size=128, seq_len_q=L, seq_len_kv=L),
        "tessera.plan": lambda: tessera.plan(m, num_q_heads=h, head_dim=d),
        "Plan.run": lambda: p.run(q, k, v),
        "Plan.run(out=)": lambda: p.run(q, k, v, out=out),
        "tessera.attention": lambda: tessera.attention(q, k, v, m),
    }
    for name, f in rows.items():
        print(f"{name:36} {us(f):8.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        p.run(q, k, v, out=out)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
