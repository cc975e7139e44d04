"""The tail a launch order costs, without a GPU: greedy list scheduling of a plan's task costs
(key chunks) on the persistent grid's slots (one CTA an SM, each taking the next task when
free -- the sm90 kernel's rule), in the planner's order (tasks.launch_keys) and in cost order
(longest first over all heads, the order before the twelfth session). Prints each makespan over
the ideal (all chunks / slots); what L2 reuse gains is measured on the GPU
(benchmarks/task_order.py), this shows what the grouping risks in the tail.

    python3 benchmarks/order_makespan.py [--shape hunyuan-720p] [--family spatial_temporal ...]
"""

from __future__ import annotations

import argparse
import heapq

import numpy as np

import tessera
from tessera.runtime.regime import Regime
from tessera.runtime.tasks import launch_keys
from tessera.workloads import WORKLOADS, example_mask


def makespan(costs: np.ndarray, slots: int) -> int:
    """Finish time of the last task when ``slots`` workers take tasks in the given order."""
    free = [0] * slots
    for c in costs.tolist():
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="hunyuan-720p")
    ap.add_argument("--family", action="append", default=[],
                    help="mask family (tessera.masks); repeatable (default: three)")
    ap.add_argument("--slots", type=int, default=132, help="tasks in flight (H200: 132 SMs)")
    args = ap.parse_args(argv)
    w = WORKLOADS[args.shape]
    regime = Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=3,
                    combine_threshold=0.0, split_ratio=1e9)  # the H200 default, never split
    for fam in args.family or ["spatial_temporal", "sliding_tile", "random_blocks"]:
        mask = example_mask(w, fam, heads=w.heads, head_dim=w.head_dim).mask
        p = tessera.plan(mask, num_q_heads=w.heads, head_dim=w.head_dim, regime=regime)
        t = np.asarray(p.queue.tasks, dtype=np.int64)
        cost = t[:, 7]
        # The planner ran for no GPU (in_flight 0): order it for `slots` as a GPU plan would.
        group = p.task_assignments()
        grouped = cost[np.argsort(launch_keys(cost, group, args.slots), kind="stable")]
        by_cost = np.sort(cost)[::-1]
        ideal = cost.sum() / args.slots
        print(f"{args.shape} {fam:17} tasks {len(cost):6}  longest {cost.max():5} chunks, "
              f"{cost.max() / ideal:5.3f} of a slot's share | makespan / ideal: launch order "
              f"{makespan(grouped, args.slots) / ideal:.4f}, cost order "
              f"{makespan(by_cost, args.slots) / ideal:.4f}")


if __name__ == "__main__":
    main()
