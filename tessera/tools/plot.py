"""Pictures of plans: the logical mask, the physical tiles and key spans laid over it, and tasks
coloured by launch order. People read a mask faster than a table. Needs matplotlib (the `plot`
extra); imported only by the commands that draw.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..distribution import install_hint
from ..runtime.plan import Plan
from ..runtime.queue import Span, Task, records

__all__ = ["draw_plan"]


def draw_plan(p: Plan, path: str | Path, *, batch: int = 0, head: int = 0,
              title: str | None = None) -> Path:
    """Draw the plan of one (batch, query head) to a PNG at ``path``.

    Left: the logical mask in token coordinates (variable blocks keep their sizes). Right: each
    task's key spans as rectangles over the query rows they apply to, coloured by launch order
    (dark: launched first, the heaviest), split parts outlined.
    """
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
        from matplotlib.collections import PatchCollection  # noqa: PLC0415
        from matplotlib.patches import Rectangle  # noqa: PLC0415
    except ImportError as exc:
        raise RuntimeError(f"drawing plans needs matplotlib: {install_hint('plot')}") from exc

    mask = p.mask.to_host()
    dense = mask.to_dense()[mask.batch_index(p.batch)[batch],
                            mask.head_index(p.num_q_heads, p.num_kv_heads)[head]]
    tasks = records(p.queue.tasks, Task)
    spans = records(p.queue.spans, Span)
    hp, tr = p.queue.heads_per_task, p.queue.tile_rows
    mine = np.nonzero((tasks.batch == batch) & (tasks.q_head0 <= head) &
                      (head < tasks.q_head0 + hp))[0]

    fig, axes = plt.subplots(1, 2, figsize=(13, 6.5), sharex=True, sharey=True)
    lq, lk = mask.seq_len_q, mask.seq_len_kv
    axes[0].pcolormesh(mask.kv_bounds, mask.q_bounds, dense, cmap="Greys", vmin=0, vmax=1.6,
                       shading="flat")
    axes[0].set_title(f"logical mask: {mask.num_q_blocks}x{mask.num_kv_blocks} blocks, "
                      f"density {dense.mean():.3f}")
    rects, colors, split_rects = [], [], []
    order = np.linspace(0.0, 1.0, max(len(tasks), 1))  # task index in launch order -> colour
    for idx in mine:
        t = tasks[idx]
        qs, qe, sb, se, slot = t.q_start, t.q_end, t.span_begin, t.span_end, t.slot
        for s in spans[sb:se]:
            k0, k1, r0, r1 = s.k_start, s.k_end, s.r_start, s.r_end
            lo, hi = max(qs, r0), min(qe, r1)
            if hi <= lo:
                continue
            rects.append(Rectangle((k0, lo), k1 - k0, hi - lo))
            colors.append(order[idx])
            if slot >= 0:
                split_rects.append(Rectangle((k0, lo), k1 - k0, hi - lo))
    if rects:
        pc = PatchCollection(rects, cmap="viridis", alpha=0.85, linewidth=0)
        pc.set_array(np.asarray(colors))
        pc.set_clim(0, 1)
        axes[1].add_collection(pc)
        if split_rects:
            axes[1].add_collection(PatchCollection(split_rects, facecolor="none",
                                                   edgecolor="red", linewidth=0.6))
        fig.colorbar(pc, ax=axes[1], label="launch order (0 = first)")
    st = p.stats()
    axes[1].set_title(f"physical: {len(mine)} tasks for this head, tiles of {tr} rows x "
                      f"{p.regime.block_n}-key steps; wasted x{st.wasted_ratio:.2f}")
    for ax in axes:
        ax.set_xlim(0, lk)
        ax.set_ylim(lq, 0)
        ax.set_xlabel("key token")
    axes[0].set_ylabel("query token")
    fig.suptitle(title or f"Tessera plan, batch {batch}, head {head} ({p.regime.name})")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
