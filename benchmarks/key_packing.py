"""How much of the top-k cubes' computed work is waste, and how much packing each task's keys
end to end into full chunks would remove -- an estimate from the plans alone (no GPU needed).

Per task of a 64x64 and a 128x128 sm90 plan, computed pairs over useful pairs: as planned now
(every span walked block_n keys at a time, so a 16-token edge cube costs a whole chunk), with the
task's keys packed into ceil(keys / block_n) chunks, with exactly its keys (all tile rows), and
with exactly its keys and only its real rows.

    python3 benchmarks/key_packing.py
"""

import numpy as np

import tessera
from tessera.runtime.regime import Regime
from tessera.workloads import WORKLOADS, example_mask


def main() -> None:
    for shape in ("wan-1.3b-480p", "cogvideox-5b", "hunyuan-720p"):
        w = WORKLOADS[shape]
        m = example_mask(w, "topk_pooled", heads=w.heads, head_dim=w.head_dim).mask
        useful = int(m.selected_pairs(1, w.heads).sum())
        for bm, bn in ((64, 64), (128, 128)):
            r = Regime(family="sm90", block_m=bm, block_n=bn,
                       num_warps=bm // 16 + (4 if bm == 128 else 0), stages=3,
                       combine_threshold=0.0)
            p = tessera.plan(m, num_q_heads=w.heads, head_dim=w.head_dim, regime=r)
            tasks = np.asarray(p.queue.tasks, dtype=np.int64)
            spans = np.asarray(p.queue.spans, dtype=np.int64)
            keys = np.array([(spans[a:b, 1] - spans[a:b, 0]).sum() for a, b in tasks[:, 4:6]])
            rows = tasks[:, 3] - tasks[:, 2]
            now = (tasks[:, 7] * bn * bm).sum()
            packed = (-(-keys // bn) * bn * bm).sum()
            print(f"{shape:14} {bm}x{bn}: now x{now / useful:.2f}, keys packed "
                  f"x{packed / useful:.2f}, exact keys x{(keys * bm).sum() / useful:.2f}, "
                  f"exact keys and rows x{(keys * rows).sum() / useful:.2f}")


if __name__ == "__main__":
    main()
