"""plan.stats() for every mask family on the WORKLOADS shapes (host planning, numpy).

``python benchmarks/plan_stats.py [--heads N]`` prints a markdown table: density, useful pairs,
wasted ratio (computed / useful pairs), tiles, restricted merges, tasks, splits, and the time to
build and to plan the mask on this machine's CPU.
"""

from __future__ import annotations

import argparse
import time

from tessera.runtime.plan import plan
from tessera.workloads import FAMILIES, WORKLOADS, example_mask


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=2, help="mask heads per family")
    ap.add_argument("--shapes", default="wan-1.3b-480p,cogvideox-5b,hunyuan-720p")
    args = ap.parse_args(argv)
    print("| shape | family | blocks | density | wasted | tiles | merges | tasks | splits | "
          "build ms | plan ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        w = WORKLOADS[shape]
        for fam in FAMILIES:
            t0 = time.perf_counter()
            vm = example_mask(w, fam, heads=args.heads)
            t1 = time.perf_counter()
            p = plan(vm.mask, num_q_heads=args.heads, head_dim=w.head_dim)
            t2 = time.perf_counter()
            s = p.stats()
            m = vm.mask
            print(f"| {shape} | {fam} | {m.num_q_blocks}x{m.num_kv_blocks} | {m.density:.3f} | "
                  f"{s.wasted_ratio:.3f} | {s.num_tiles} | {s.num_merged} | {s.num_tasks} | "
                  f"{s.num_split_jobs} | {(t1 - t0) * 1e3:.0f} | {(t2 - t1) * 1e3:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
