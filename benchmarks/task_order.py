"""Kernel time of one plan's tasks launched in different orders (an experiment on K/V reuse in
L2): the planner's (tasks.launch_keys), longest first over all heads, longest first within each
(batch, head) with heads in order, and the plain (batch, head, row) order.

    python3 benchmarks/task_order.py [--shape cogvideox-5b] [--density 0.1] [--broadcast]
        [--family sliding_tile]

``--broadcast``: one random mask for all heads instead of one per head; ``--family``: a model
mask family (text rows included) instead of a random mask.
"""

import argparse
import dataclasses

import numpy as np

import tessera
from tessera.bench import cuda_time_ms
from tessera.runtime.regime import Regime
from tessera.runtime.tasks import TaskQueue
from tessera.workloads import WORKLOADS

from sweep import device_mask  # benchmarks/ (the script's directory)


def reordered(p, order: np.ndarray):
    import cupy as cp

    q = p.queue
    tasks = cp.ascontiguousarray(q.tasks[cp.asarray(order)])
    queue = TaskQueue(tasks=tasks, spans=q.spans, combine=q.combine, num_slots=q.num_slots,
                      heads_per_task=q.heads_per_task, tile_rows=q.tile_rows)
    return dataclasses.replace(p, launch_queue=queue, _exact=(p.tiles, queue), _cache={})


def main(argv=None):
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="cogvideox-5b")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--broadcast", action="store_true", help="one mask for all heads")
    ap.add_argument("--family", default=None,
                    help="a tessera.masks family (with the model's text rows) instead of random")
    args = ap.parse_args(argv)
    w = WORKLOADS[args.shape]
    b, h, L, d = 1, w.heads, w.seq_len, w.head_dim
    q, k, v = (torch.randn(b, h, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    m = device_mask(w, args.family, args.density, 1 if args.broadcast else h)
    if args.family:
        args.density = args.family
    flops = 4 * d * int(m.selected_pairs(b, h).sum())
    for r in (Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=3,
                     combine_threshold=0.0),
              Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=3,
                     combine_threshold=0.0)):
        p = tessera.plan(m, num_q_heads=h, head_dim=d, batch=b, regime=r)
        t = np.asarray(p.queue.tasks.get(), dtype=np.int64)
        ref = p.run(q, k, v)
        orders = {
            "planner": np.arange(len(t)),
            "longest first": np.argsort(-t[:, 7], kind="stable"),
            "head, then longest first": np.lexsort((-t[:, 7], t[:, 1], t[:, 0])),
            "head, row": np.lexsort((t[:, 2], t[:, 1], t[:, 0])),
        }
        for name, order in orders.items():
            pr = reordered(p, order)
            diff = float((pr.run(q, k, v).float() - ref.float()).abs().max())
            ms = cuda_time_ms(lambda: pr.run(q, k, v), 10)
            print(f"{args.shape} {args.density}{' broadcast' if args.broadcast else ''} "
                  f"{r.name:28} {name:26} {ms:7.3f} ms "
                  f"{flops / ms / 1e9:5.0f} TFLOP/s  (|diff| {diff:.0e})")


if __name__ == "__main__":
    main()
