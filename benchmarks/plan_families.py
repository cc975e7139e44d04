"""Device planning cost per model shape x mask family (the request path's planning share).

``PYTHONPATH=. python3 benchmarks/plan_families.py [--profile]``: each family's mask
(``tessera.workloads.example_mask``, 4 heads) is moved to the device as CSR (``to_device``),
then ``tessera.plan`` is timed (wall clock to a device synchronize, median of 10). ``--profile``
prints the top of a cProfile of one shape's planning.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import tessera
from tessera.workloads import FAMILIES, WORKLOADS, example_mask

SHAPES = ("wan-1.3b-480p", "cogvideox-5b", "hunyuan-720p")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--heads", type=int, default=4)
    args = ap.parse_args()
    import cupy as cp

    sync = cp.cuda.Device().synchronize
    print(f"{'shape':15} {'family':18} {'density':>7} {'plan ms':>8} {'tasks':>7}")
    for shape in SHAPES:
        w = WORKLOADS[shape]
        for fam in FAMILIES:
            if fam == "semantic_clusters" and w.seq_len > 60000:
                continue  # host k-means at this size takes longer than the rest together
            m = example_mask(w, fam, heads=args.heads, head_dim=w.head_dim).mask.to_device()

            def once():
                p = tessera.plan(m, num_q_heads=args.heads, head_dim=w.head_dim)
                sync()
                return p

            p = once()
            times = []
            for _ in range(10):
                t = time.perf_counter()
                once()
                times.append((time.perf_counter() - t) * 1e3)
            print(f"{shape:15} {fam:18} {m.density:7.3f} {statistics.median(times):8.2f} "
                  f"{p.queue.num_tasks:7d}", flush=True)
            if args.profile and shape == "wan-1.3b-480p" and fam in ("topk_pooled",
                                                                    "random_blocks"):
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(5):
                    once()
                pr.disable()
                pstats.Stats(pr).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
