"""Kernel-only timing of several regimes on one mask (used to pick defaults and to build tables).

``python benchmarks/sweep.py [--shape wan-1.3b-480p] [--density 0.1 | --family topk_pooled]
[--only PART | --regime NAME ...] [--burst N] [--no-tma]``: prints ms and useful TFLOP/s per regime,
fastest first. Each figure is the GPU time per run over a burst of N runs between two events
(10 unless told, as ``tessera bench``'s "kernel" column); up to the fifteenth session's
``call_zz48.sh`` it timed one run alone (``--burst 1``), whose host launch work -- ~0.1-0.3 ms,
varying between processes -- sat inside the figure.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import tessera
from tessera.runtime.regime import Regime

from tessera.bench import cuda_time_ms as bench
from tessera.workloads import WORKLOADS

REGIMES = [
    Regime(block_m=128, block_n=64, num_warps=4, stages=2),
    Regime(block_m=128, block_n=32, num_warps=4, stages=2),
    Regime(block_m=128, block_n=32, num_warps=4, stages=3),
    Regime(block_m=128, block_n=48, num_warps=4, stages=2),
    Regime(block_m=128, block_n=64, num_warps=8, stages=2),
    Regime(block_m=64, block_n=64, num_warps=4, stages=2),
    Regime(block_m=64, block_n=64, num_warps=2, stages=2),
    # The Hopper family (sm_90 only; fails elsewhere with a clear message).
    Regime(family="sm90", block_m=128, block_n=128, num_warps=8, stages=3),
    Regime(family="sm90", block_m=128, block_n=64, num_warps=8, stages=3),
    Regime(family="sm90", block_m=128, block_n=64, num_warps=8, stages=4),
    Regime(family="sm90", block_m=128, block_n=64, num_warps=8, stages=5),
    Regime(family="sm90", block_m=64, block_n=128, num_warps=4, stages=3),
    Regime(family="sm90", block_m=64, block_n=64, num_warps=8, stages=3),
    Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=3),
    Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=4),
    # The packed key walk (Regime.pack_keys): spans share chunks (64-token and variable blocks).
    Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=3, combine_threshold=0.0,
           pack_keys=True),
    Regime(family="sm90", block_m=64, block_n=128, num_warps=4, stages=3,
           combine_threshold=0.0, pack_keys=True),
    Regime(family="sm90", block_m=64, block_n=64, num_warps=8, stages=3,
           combine_threshold=0.0, pack_keys=True),
    Regime(family="sm90", block_m=128, block_n=64, num_warps=12, stages=4,
           combine_threshold=0.0, pack_keys=True),
    Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=3,
           combine_threshold=0.0, pack_keys=True),
    # Tiles at multiples of block_m tokens, straddling variable blocks (Regime.align_tiles).
    Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=3,
           combine_threshold=0.0, align_tiles=True),
    Regime(family="sm90", block_m=128, block_n=64, num_warps=12, stages=4,
           combine_threshold=0.0, align_tiles=True),
    # Three consumer warpgroups (192-row tiles; 64-key steps at head dims 64/96).
    Regime(family="sm90", block_m=192, block_n=64, num_warps=16, stages=3),
    Regime(family="sm90", block_m=192, block_n=64, num_warps=16, stages=4),
    # Warp-specialized: a producer warpgroup (four more warps than the rows need).
    Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=3),
    # Deeper K/V rings: they fit at head dims 64 and 96 only (none was faster, seventh session).
    Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=4),
    Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=5),
    Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=6),
    Regime(family="sm90", block_m=128, block_n=64, num_warps=12, stages=4),
    Regime(family="sm90", block_m=64, block_n=128, num_warps=8, stages=3),
]


def device_mask(w, family: str | None, density: float, mask_heads: int) -> tessera.BlockMask:
    """The device mask a kernel-only benchmark times: ``family`` of tessera.masks at the
    model's parameters (text rows included), or random 128-token blocks at ``density`` over
    ``mask_heads`` heads (1: one mask for all heads), seed 0."""
    import torch

    if family:
        from tessera.workloads import example_mask

        m = example_mask(w, family, heads=w.heads, head_dim=w.head_dim).mask
        return tessera.BlockMask.from_dense(torch.from_numpy(m.to_dense()).cuda(),
                                            q_bounds=m.q_bounds, kv_bounds=m.kv_bounds)
    L = w.seq_len
    n = math.ceil(L / 128)
    dense = np.random.default_rng(0).random((mask_heads, n, n)) < density
    return tessera.BlockMask.from_dense(torch.from_numpy(dense).cuda(), block_size=128,
                                        seq_len_q=L, seq_len_kv=L)


def main(argv=None):
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan-1.3b-480p")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--family", default=None, help="a tessera.masks family instead of random")
    ap.add_argument("--only", default="", help="time only regimes whose name contains this")
    ap.add_argument("--regime", action="append", default=[],
                    help="time this regime (a name as plan.regime.name prints it) instead of the "
                         "list; repeatable")
    ap.add_argument("--burst", type=int, default=10,
                    help="runs timed between two events (1: a lone run, launch work included)")
    ap.add_argument("--one-task-ctas", action="store_true",
                    help="launch persistent kernels with one CTA per task (A/B of persistence)")
    ap.add_argument("--no-tma", action="store_true",
                    help="copy K/V by cp.async in every variant (the form operands TMA cannot "
                         "describe get)")
    args = ap.parse_args(argv)
    if args.one_task_ctas:
        tessera.api.persistent_grid_cap = 0
    if args.no_tma:
        tessera.api.use_tma = False
    w = WORKLOADS[args.shape]
    b, h, L, d = 1, w.heads, w.seq_len, w.head_dim
    q, k, v = (torch.randn(b, h, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    m = device_mask(w, args.family, args.density, h)
    if args.family:
        args.density = args.family
    flops = 4 * d * int(m.selected_pairs(b, h).sum())
    rows = []
    from tessera.runtime.regime import regime_from_name

    chosen = [regime_from_name(n) for n in args.regime] or [r for r in REGIMES
                                                           if args.only in r.name]
    if None in chosen:
        ap.error(f"--regime: not a regime name among {args.regime}")
    for r in chosen:
        try:
            p = tessera.plan(m, num_q_heads=h, head_dim=d, batch=b, regime=r)
            t = bench(lambda: p.run(q, k, v), 10, burst=args.burst)
            rows.append((t, r.name))
        except Exception as exc:
            print(r.name, "failed:", str(exc).splitlines()[0])
    for t, name in sorted(rows):
        print(f"{args.shape} density {args.density}: {name:40} {t:7.3f} ms "
              f"{flops / t / 1e9:6.0f} TFLOP/s")


if __name__ == "__main__":
    main()
