"""Host microseconds of each step of a prepared plan's run (``api._launch`` taken apart, in its
order, on the default regime and a model shape's random 10% mask), then of a whole
``Plan.run``: where a run's host time goes. The GPU is idle at the start of every call.

    python3 benchmarks/launch_costs.py [--shape cogvideox-5b] [--n 300]
"""

import argparse
import math
import time

import cupy as cp
import numpy as np
import torch

import tessera
from tessera import api
from tessera.cuda.loader import blocks_per_sm, load_kernel, smem_bytes
from tessera.interop import empty_like_caller
from tessera.runtime.regime import device_sm_count, smem_limit_bytes
from tessera.workloads import WORKLOADS


def us(fn, n: int) -> float:
    """Median host microseconds of one call of ``fn``, the GPU idle when it starts."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return float(np.median(times)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="cogvideox-5b")
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    w = WORKLOADS[args.shape]
    h, d, L = w.heads, w.head_dim, w.seq_len
    q, k, v = (torch.randn(1, h, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    n = math.ceil(L / 128)
    blocks = torch.from_numpy(np.random.default_rng(0).random((h, n, n)) < 0.1).cuda()
    m = tessera.BlockMask.from_dense(blocks, block_size=128, seq_len_q=L, seq_len_kv=L)
    p = tessera.plan(m, num_q_heads=h, head_dim=d)
    out = torch.empty_like(q)
    p.run(q, k, v)
    ops = api._describe(q, k, v, "bhld")
    r = p.regime
    cc = api._device_cc()
    fwd = r.variant(d, True, tma=True)
    maps = api._tma_maps(p, ops, True)
    stream = api._caller_stream(ops)
    queue = api._device_queue(p, cp)
    fn = load_kernel(fwd)
    lq = p.launch_queue
    i64, i32, f32, ptr = np.int64, np.int32, np.float32, np.uint64
    counter = api._task_counter(p, cp, stream)
    grid = min(lq.num_tasks, blocks_per_sm(fwd) * device_sm_count())

    def kernel_args():
        return (queue["tasks"], queue["spans"],
                ptr(ops.q.ptr), *map(i64, ops.strides_q[:3]),
                ptr(ops.k.ptr), *map(i64, ops.strides_k[:3]),
                ptr(ops.v.ptr), *map(i64, ops.strides_v[:3]),
                ptr(out.data_ptr()), *map(i64, ops.strides_q[:3]),
                ptr(0), i64(0), i64(0), queue["part_o"], queue["part_lse"],
                i32(lq.tile_rows), i32(1), f32(0.1), i32(lq.num_tasks),
                ptr(0 if lq.count is None else lq.count.data.ptr),
                ptr(counter.data.ptr), maps)

    a = kernel_args()

    def enter_device_and_stream():
        with cp.cuda.Device(ops.q.device_id), stream:
            pass

    steps = {
        "_describe q, k, v": lambda: api._describe(q, k, v, "bhld"),
        "_check_mask": lambda: api._check_mask(p.mask, 1, h, h, L, L),
        "_device_cc": api._device_cc,
        "regime.runs_on": lambda: r.runs_on(cc),
        "_tma_maps (cached)": lambda: api._tma_maps(p, ops, True),
        "regime.variant": lambda: r.variant(d, True, tma=True),
        "smem_bytes + smem_limit_bytes": lambda: (smem_bytes(fwd), smem_limit_bytes(cc)),
        "_caller_stream": lambda: api._caller_stream(ops),
        "with Device, stream": enter_device_and_stream,
        "_wait_until_planned": lambda: api._wait_until_planned(p, stream),
        "_device_queue": lambda: api._device_queue(p, cp),
        "empty_like_caller (torch)": lambda: empty_like_caller(ops.q, (1, h, L, d), "bfloat16"),
        "load_kernel": lambda: load_kernel(fwd),
        "blocks_per_sm + device_sm_count": lambda: (blocks_per_sm(fwd), device_sm_count()),
        "_task_counter (memset)": lambda: api._task_counter(p, cp, stream),
        "argument tuple": kernel_args,
        "kernel launch (31 args, TMA maps)": lambda: fn((grid,), (fwd.threads,), a,
                                                        shared_mem=smem_bytes(fwd),
                                                        stream=stream),
        "Plan.run": lambda: p.run(q, k, v),
        "Plan.run(out=)": lambda: p.run(q, k, v, out=out),
    }
    total = 0.0
    for name, f in steps.items():
        t = us(f, args.n)
        if not name.startswith("Plan.run"):
            total += t
        print(f"{name:36} {t:8.1f} us")
    print(f"{'sum of the steps':36} {total:8.1f} us  ({args.shape}, {r.name})")


if __name__ == "__main__":
    main()
