"""One plan of a ``bench`` mask case, run a few times: a program for Nsight Compute to profile
(``ncu --kernel-name bsa_fwd_sm90 --launch-skip 2 --launch-count 1 python3
benchmarks/one_launch.py --shape S --case C``), which prints the regime and the plan's stats.

The masks are drawn as ``python -m tessera bench`` draws them (its generator seeded 0, the
case first in its list), bf16 ``[1, H, L, D]`` inputs; the regime is what a plan takes on this
GPU unless ``--regime`` names one.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    import cupy as cp
    import torch

    import tessera
    from tessera.families.common import variable_bounds
    from tessera.runtime.regime import regime_from_name
    from tessera.tools.bench import CASES
    from tessera.tools.workloads import WORKLOADS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--regime", help="a Regime name (default: the plan's own selection)")
    ap.add_argument("--runs", type=int, default=3, help="launches (profile the last)")
    args = ap.parse_args(argv)
    regime = None
    if args.regime:
        regime = regime_from_name(args.regime)
        if regime is None:
            ap.error(f"--regime: {args.regime!r} is not a regime name")
    w, c = WORKLOADS[args.shape], CASES[args.case]
    L = w.seq_len
    rng = np.random.default_rng(0)
    if c.sizes is not None:
        qb = variable_bounds(rng, L, *c.sizes)
    else:
        n = math.ceil(L / c.block)
        L = n * c.block if c.block < 128 else L  # bench pads 64-token cases to whole blocks
        qb = np.minimum(np.arange(n + 1) * c.block, L)
    blocks = cp.asarray(c.make(rng, w.heads, qb.size - 1))
    mask = tessera.BlockMask.from_dense(blocks, q_bounds=qb, kv_bounds=qb)
    q, k, v = (torch.randn(1, w.heads, L, w.head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    plan = tessera.plan(mask, num_q_heads=w.heads, head_dim=w.head_dim, dtype="bfloat16",
                        regime=regime)
    for _ in range(args.runs):
        plan.run(q, k, v)
    torch.cuda.synchronize()
    print(f"{args.shape} {args.case}: {plan.regime.name}; {plan.stats()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
