"""The one-sync device planner: physical mapping and task organization fused for device masks.

The general planner (``mapping.map_to_tiles`` then ``tasks.build_task_queue``) runs on CuPy as
some eighty small array operations with five host synchronizations, milliseconds per plan. For
the common request -- a device mask, no restricted merges (``combine_threshold == 0``, the
default), no task heavy enough to split -- three kernels of ``tessera/cuda/plan.cu`` do the
same work:

1. ``plan_row_stats`` (shared with the general path): per mask row, its key spans, chunks and
   whether it equals the row before it;
2. ``plan_scan`` (one CTA): runs of identical rows, each run's spans, tiles and tasks, their
   offsets, and the totals the split decision needs;
3. after the one synchronization that reads those totals, ``plan_write_runs``: spans, tiles and
   tasks, followed by the longest-first sort of the tasks.

When the totals call for a split (a few rows far heavier than the mean, e.g. text tokens that
attend to everything), step 3 writes spans and tiles only and the general task organization
(``tasks.build_task_queue``) cuts and orders the tasks. The result is array for array the
general planner's (tested on the GPU, and on the CPU with numpy stand-ins for the kernels).
"""

from __future__ import annotations

import numpy as np

from .._array import device_copy, to_numpy
from ..mask import BlockMask
from .mapping import PhysicalTiles, _device_dense_rows, device_bounds, row_stats_on_device
from .tasks import TaskQueue, build_task_queue, head_assignments, split_limit

__all__ = ["plan_on_device"]

def _assignments(xp, batch: int, num_q_heads: int, num_kv_heads: int, hp: int,
                 batch_of: np.ndarray, head_of: np.ndarray, mask_batch_heads: tuple[int, int]):
    """Per mask (b, h): how many (batch, first query head) pairs read it, where they start in the
    assignment list, and the list itself -- on the device, copied once per attention shape."""
    def make():
        a_b, a_h0, a_bh = head_assignments(batch, num_q_heads, num_kv_heads, hp, batch_of,
                                           head_of, mask_batch_heads[1])
        per_bh = np.bincount(a_bh, minlength=mask_batch_heads[0] * mask_batch_heads[1])
        off = np.concatenate([[0], np.cumsum(per_bh)[:-1]])
        return tuple(xp.asarray(a.astype(np.int32)) for a in (per_bh, off, a_b, a_h0))

    if xp is np:
        return make()
    key = ("assignments", batch, num_q_heads, num_kv_heads, hp, batch_of.tobytes(),
           head_of.tobytes(), mask_batch_heads)
    return device_copy(key, make, xp)


def plan_on_device(mask: BlockMask, *, tile_rows: int, block_n: int, heads_per_task: int,
                   batch: int, num_q_heads: int, num_kv_heads: int, batch_of: np.ndarray,
                   head_of: np.ndarray, split_ratio: float, min_split_chunks: int,
                   in_flight: int = 0) -> tuple[PhysicalTiles, TaskQueue] | None:
    """Tiles and task queue of a device mask without restricted merges, by the planner kernels;
    None when the mask's dense rows would be too large (the general planner then takes over)."""
    from ..cuda.loader import Variant, load_kernel  # noqa: PLC0415 - device only

    xp = mask.xp
    dense_rows = _device_dense_rows(mask)
    if dense_rows is None:
        return None
    dense, stats, nspans, chunks = row_stats_on_device(mask, dense_rows, block_n)
    n_rows, n_kv = dense.shape
    n_q = mask.num_q_blocks
    qb = device_bounds(mask.q_bounds, xp)
    kb = device_bounds(mask.kv_bounds, xp)
    expansions, assign_off, assign_b, assign_h0 = _assignments(
        xp, batch, num_q_heads, num_kv_heads, heads_per_task, batch_of, head_of,
        mask.batch_heads)
    i32, i64 = np.int32, np.int64
    run_row0, run_row1, span_off, tile_off, task_off = (xp.empty(n_rows, dtype=i64)
                                                        for _ in range(5))
    totals = xp.empty(6, dtype=i64)
    load_kernel(Variant("plan.cu", "plan_scan"))(
        (1,), (1024,), (stats.identical.view(np.uint8), nspans, chunks, i32(n_rows), i32(n_q),
                        qb, i32(tile_rows), expansions, run_row0, run_row1, span_off, tile_off,
                        task_off, totals))
    n_runs, n_spans, n_tiles, n_tasks, task_chunks, max_chunks = (int(x) for x in
                                                                  to_numpy(totals))
    # The split policy of tasks.build_task_queue, on the same totals.
    limit = split_limit(split_ratio, min_split_chunks, n_tasks, task_chunks, in_flight)
    split = bool(n_tiles) and max_chunks > limit
    spans = xp.empty((n_spans, 4), dtype=i32)
    tiles = xp.empty((n_tiles, 6), dtype=i32)
    tasks = None if split else xp.empty((n_tasks, 8), dtype=i32)
    if n_runs:
        load_kernel(Variant("plan.cu", "plan_write_runs"))(
            ((n_runs * 32 + 255) // 256,), (256,),
            (dense, i32(n_kv), i32(n_q), kb, qb, i32(tile_rows), i32(n_runs), run_row0,
             run_row1, span_off, tile_off, task_off, nspans, chunks, expansions, assign_off,
             assign_b, assign_h0, spans, tiles, np.uint64(0) if split else tasks))
    pt = PhysicalTiles(tile_rows=tile_rows, block_n=block_n, mask_bh=tiles[:, 0], q0=tiles[:, 1],
                       q1=tiles[:, 2], span_begin=tiles[:, 3], span_end=tiles[:, 4],
                       chunks=tiles[:, 5], k0=spans[:, 0], k1=spans[:, 1], r0=spans[:, 2],
                       r1=spans[:, 3], num_groups=n_runs, num_merged=0)
    if split:
        # Heavy tiles are cut into parts by the general task organization (array operations on
        # these tiles, which equal the general mapping's).
        return pt, build_task_queue(pt, batch=batch, num_q_heads=num_q_heads,
                                    num_kv_heads=num_kv_heads, heads_per_task=heads_per_task,
                                    batch_of=batch_of, head_of=head_of,
                                    mask_batch_heads=mask.batch_heads, split_ratio=split_ratio,
                                    min_split_chunks=min_split_chunks, in_flight=in_flight)
    # Longest first (stable, as the general planner orders them).
    tasks = xp.ascontiguousarray(tasks[xp.argsort(-tasks[:, 7], kind="stable")])
    queue = TaskQueue(tasks=tasks, spans=spans, combine=xp.zeros((0, 6), dtype=i32),
                      num_slots=0, heads_per_task=heads_per_task, tile_rows=tile_rows)
    return pt, queue
