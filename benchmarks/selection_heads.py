"""How the regime selection of a request fares by head count: for each ``bench`` case of a model's
shape at a few of its heads (a sequence-parallel shard's), the plan a request makes
(``tessera.plan(mode=PlanMode.REQUEST)``, the table in force and the heuristic's rules) timed in
one process against the heuristic's mask rules alone (``heuristic_choice`` without the shape: rings
where the head dim takes them) and, at head dim 64, the one-ring tiles (64x64 three CTAs an SM on
64-token blocks, else 64x128 two), none of them splitting tasks, as a request never does.

    python3 benchmarks/selection_heads.py --shape cogvideox-5b --heads 4,8,12,16,24,48

Printed per case: each plan's regime and median time over ``--rounds`` interleaved rounds
(``timing.interleaved_ms``), the rules' time over the selection's and the one-ring tiles' over
the rules'. Outputs are compared with the selection's (the largest difference printed).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    import torch  # noqa: PLC0415

    import tessera  # noqa: PLC0415
    from tessera.runtime.regime import heuristic_choice, regime_from_name  # noqa: PLC0415
    from tessera.tools.bench import BURST, CASES  # noqa: PLC0415
    from tessera.tools.timing import interleaved_ms  # noqa: PLC0415
    from tessera.tools.workloads import WORKLOADS  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="cogvideox-5b", choices=sorted(WORKLOADS))
    ap.add_argument("--heads", default="4,8,16", help="comma-separated query head counts")
    ap.add_argument("--case", default="random-10,random-30,topk64-10,random64-30",
                    help=f"comma-separated bench cases ({', '.join(sorted(CASES))})")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    try:
        heads_list = [int(h) for h in args.heads.split(",")]
    except ValueError:
        ap.error(f"--heads: comma-separated ints, got {args.heads!r}")
    if any(h < 1 for h in heads_list):
        ap.error(f"--heads must be at least 1, got {args.heads!r}")
    cases = args.case.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"--case: unknown {unknown}; accepted: {sorted(CASES)}")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if not torch.cuda.is_available():
        print("selection_heads: needs a CUDA GPU")
        return 1
    w = WORKLOADS[args.shape]
    rows = []
    for heads in heads_list:
        for case in cases:
            c = CASES[case]
            qb = c.bounds(w.seq_len)
            length = int(qb[-1])
            blocks = torch.from_numpy(c.make(np.random.default_rng(0), heads, qb.size - 1)).cuda()
            mask = tessera.BlockMask.from_dense(blocks, q_bounds=qb, kv_bounds=qb)
            q, k, v = (torch.randn(1, heads, length, w.head_dim, device="cuda",
                                   dtype=torch.bfloat16) for _ in range(3))
            kw = dict(num_q_heads=heads, head_dim=w.head_dim, dtype="bfloat16")
            rules = heuristic_choice(mask, 90, w.head_dim)[0].with_(min_split_chunks=10**6)
            plans = {"selected": tessera.plan(mask, mode=tessera.PlanMode.REQUEST, **kw),
                     "rules": tessera.plan(mask, regime=rules, **kw)}
            if w.head_dim == 64:
                one = regime_from_name("sm90_64x64_w8_s3[combine_threshold=0.0]" if c.block <= 64
                                       else "sm90_64x128_w8_s3[combine_threshold=0.0]")
                plans["one-ring"] = tessera.plan(mask, regime=one.with_(
                    min_split_chunks=10**6, pack_keys=rules.pack_keys), **kw)
            calls = {n: (lambda p=p: p.run(q, k, v)) for n, p in plans.items()}
            outs = {n: f().float() for n, f in calls.items()}
            torch.cuda.synchronize()
            diff = max((o - outs["selected"]).abs().max().item() for o in outs.values())
            times = interleaved_ms(calls, rounds=args.rounds, reps=3, burst=BURST, settle_s=0.5)
            t = {n: statistics.median(x) for n, x in times.items()}
            print(f"{args.shape} {heads} heads {case}: "
                  + "; ".join(f"{n} {p.regime.name} {t[n]:.3f} ms" for n, p in plans.items())
                  + f"; max diff {diff:.1e}", flush=True)
            rows.append((heads, case, t))
    print(f"\n{args.shape}: heads case | selected ms | rules/selected | one-ring/rules")
    for heads, case, t in rows:
        one = f"{t['one-ring'] / t['rules']:.3f}" if "one-ring" in t else "-"
        print(f"{heads:4d} {case:12s} | {t['selected']:.3f} | {t['rules'] / t['selected']:.3f} "
              f"| {one}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
