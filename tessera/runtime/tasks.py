"""Task organization: physical tiles -> the task queue every kernel family reads
(layout: ``runtime/queue.py``): GQA head packing, the split rule for heavy tasks, their cut
into parts merged by the combine step, and the launch order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._array import array_module, offsets_from_counts, segment_ids, to_numpy
from ..cuda.variants import WIDE_SLACK, WIDE_SPANS
from .mapping import PhysicalTiles
from .queue import Combine, Span, Task, TaskQueue, stack_fields

__all__ = ["build_task_queue", "split_limit", "may_split", "tasks_lower_bound",
           "wide_step_tasks", "whole_span_tasks", "launch_keys", "fill_last_wave",
           "last_wave_parts", "FILL_MIN_GAIN", "task_groups", "SpanArrays", "HEAVY_SHARE",
           "HEAVY_MEAN", "NEVER_SPLIT_RATIO"]


def head_assignments(batch: int, num_q_heads: int, num_kv_heads: int, heads_per_task: int,
                     batch_of: np.ndarray, head_of: np.ndarray, mask_heads: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (batch, first query head) a task is made for, and the stored mask (b, h) it reads.

    Returned sorted by mask (b, h), with CSR offsets over mask (b, h), so tiles of one mask head
    expand to all the (batch, head) pairs that read it.
    """
    b = np.repeat(np.arange(batch), num_q_heads // heads_per_task)
    h0 = np.tile(np.arange(0, num_q_heads, heads_per_task), batch)
    bh = batch_of[b] * mask_heads + head_of[h0]
    order = np.argsort(bh, kind="stable")
    return b[order], h0[order], bh[order]


def task_groups(tasks: np.ndarray, batch: int, num_q_heads: int, num_kv_heads: int,
                heads_per_task: int, batch_of: np.ndarray, head_of: np.ndarray,
                mask_heads: int) -> np.ndarray:
    """Each host task's (batch, head) assignment: its index in :func:`head_assignments`' list,
    the group :func:`launch_keys` orders by (found from the task's batch and first query
    head; -1 for a pair that is no assignment)."""
    a_b, a_h0, _ = head_assignments(batch, num_q_heads, num_kv_heads, heads_per_task,
                                    batch_of, head_of, mask_heads)
    index = np.full((batch, num_q_heads), -1, dtype=np.int64)
    index[a_b, a_h0] = np.arange(a_b.size)
    return index[tasks[:, Task.BATCH], tasks[:, Task.Q_HEAD0]]


def split_limit(split_ratio: float, min_split_chunks: int, total_tasks: int, total_chunks: int,
                in_flight: int = 0) -> int:
    """The most key chunks a task may have before it is split (both planners' one rule).

    A task is split when it exceeds ``split_ratio`` x the mean task and ``min_split_chunks``,
    and -- when ``in_flight`` (tasks the GPU runs at once; 0: unknown) is given -- also the
    work each of those slots gets on average: in any launch order, a task no longer than
    that finishes within the time the rest of the queue takes anyway, so cutting it would
    only add partials, a combine step and planning work (the text rows of video models, which
    attend to every key, are such tasks on full-size shapes).
    """
    mean = total_chunks / max(total_tasks, 1)
    limit = max(int(min_split_chunks), int(np.ceil(split_ratio * mean)))
    if in_flight > 0:
        limit = max(limit, -(-total_chunks // in_flight))
    return limit


# Split ratios from this one up mean "never split" (the profiler's candidates use 1e9).
NEVER_SPLIT_RATIO = 1e6
# Planning for a GPU that runs S tasks at once, a shape that guarantees at least this many tasks
# per slot is never split (see may_split).
SPLIT_FREE_TASKS_PER_SLOT = 16


def tasks_lower_bound(batch: int, num_q_heads: int, heads_per_task: int, seq_len_q: int,
                      tile_rows: int) -> int:
    """The fewest tasks any mask of this shape makes: every (batch, head group) covers all its
    query tokens with tiles of at most ``tile_rows`` rows."""
    return batch * (num_q_heads // heads_per_task) * -(-seq_len_q // tile_rows)


def may_split(split_ratio: float, tasks_bound: int, in_flight: int) -> bool:
    """Whether a plan may split heavy tasks at all, decided before the mask is read (both
    planners' one rule; the device planner then needs no host synchronization at all).

    Never for a never-split ratio; nor, planning for a GPU with ``in_flight`` task slots, when
    the shape guarantees ``tasks_bound`` >= SPLIT_FREE_TASKS_PER_SLOT tasks per slot: launched
    in any order, the queue then finishes within its average work per slot plus the heaviest
    task, and a task only exceeds that average when it is 16 times the mean -- the text rows of
    full-size video models, which split_limit keeps whole anyway (docs/decisions.md).
    """
    if split_ratio >= NEVER_SPLIT_RATIO:
        return False
    return not (in_flight > 0 and tasks_bound >= SPLIT_FREE_TASKS_PER_SLOT * in_flight)


# A task is heavy when it holds more than 1/HEAVY_SHARE of the work each task slot of the GPU
# gets on average, or more than HEAVY_MEAN times the mean task (see launch_keys).
HEAVY_SHARE = 8
HEAVY_MEAN = 2


def launch_keys(cost: Any, group: Any, in_flight: int) -> Any:
    """Sort keys (int64, ascending = launch order) of tasks of ``cost`` key chunks made for
    (batch, head) assignment ``group`` (the index into :func:`head_assignments`' list: the
    query heads of one task, which read one kv head), for a GPU running ``in_flight`` tasks at
    once (0: unknown, taken as 1). Heavy tasks (more than 1/HEAVY_SHARE of the chunks per slot,
    or HEAVY_MEAN times the mean task: the text rows of video models, which see every key)
    come first, longest first: they set the tail. The rest follow one assignment at a time,
    longest first within it, so the tasks running together read the same K/V and find it in
    L2 -- ordering every task by cost alone interleaves the heads, and K/V came from DRAM
    (random 10% masks on the H200: 9-10% slower kernels, docs/decisions.md); a mask shared
    by all heads is taken head by head too. Any order finishes within the work per slot plus
    the heaviest task (list scheduling), which is what tasks.may_split counts on; a long task
    left in the last head's group is what the heavy rule keeps from the tail
    (a list-scheduling bound, docs/decisions.md). Stable sorts on these keys give both planners'
    order
    (plan.cu's plan_scan mirrors it)."""
    xp = array_module(cost)
    cost = cost.astype(np.int64)
    total = cost.sum()
    heavy = (cost * (HEAVY_SHARE * max(int(in_flight), 1)) > total) | (
        cost * cost.size > HEAVY_MEAN * total)
    rank = xp.where(heavy, 0, group.astype(np.int64) + 1)
    return rank * (1 << 32) + ((1 << 31) - 1 - cost)


def wide_step_tasks(tasks: np.ndarray, spans: np.ndarray, block_n: int, wide_bn: int
                    ) -> np.ndarray:
    """Which tasks a kernel with a ``wide_bn``-key step (sm90/traits.cuh ``WIDE_BN``) walks
    at that width: those of at most :data:`WIDE_SPANS` spans whose keys, rounded up to whole
    wide steps, exceed their keys rounded up to ``block_n``-key steps by at most
    1/:data:`WIDE_SLACK` -- long spans, where fewer steps pay and padding costs little. The
    kernel decides this per task, by the same constants (the loader passes them); this host
    mirror lets tests and statistics see the decision (host arrays in, bool out)."""
    tasks, spans = np.asarray(tasks), np.asarray(spans)
    begin = tasks[:, Task.SPAN_BEGIN].astype(np.int64)
    end = tasks[:, Task.SPAN_END].astype(np.int64)
    length = (spans[:, Span.K_END] - spans[:, Span.K_START]).astype(np.int64)
    narrow = -(-length // block_n) * block_n
    wide = -(-length // wide_bn) * wide_bn
    n_sum, w_sum = offsets_from_counts(narrow, np), offsets_from_counts(wide, np)
    n_task, w_task = n_sum[end] - n_sum[begin], w_sum[end] - w_sum[begin]
    return (end - begin <= WIDE_SPANS) & (w_task <= n_task + n_task // WIDE_SLACK)


def whole_span_tasks(tasks: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Which tasks the sm90 rings at head dim 64 walk as whole-span tasks (sm90/walks.cuh
    ``whole_span_task``): one span whose row restriction covers the task's query rows, so its
    chunks need no per-chunk fields. The kernel decides this per task; this host mirror lets
    tests and statistics see the decision (host arrays in, bool out)."""
    tasks, spans = np.asarray(tasks), np.asarray(spans)
    begin = tasks[:, Task.SPAN_BEGIN].astype(np.int64)
    one = tasks[:, Task.SPAN_END].astype(np.int64) - begin == 1
    first = spans[np.minimum(begin, max(spans.shape[0] - 1, 0))] if spans.size else \
        np.zeros((tasks.shape[0], len(Span)), np.int32)
    return one & (first[:, Span.R_START] <= tasks[:, Task.Q_START]) & (
        first[:, Span.R_END] >= tasks[:, Task.Q_END])


def build_task_queue(tiles: PhysicalTiles, *, batch: int, num_q_heads: int, num_kv_heads: int,
                     heads_per_task: int, batch_of: np.ndarray, head_of: np.ndarray,
                     mask_batch_heads: tuple[int, int], split_ratio: float,
                     min_split_chunks: int, in_flight: int = 0,
                     allow_split: bool = True) -> TaskQueue:
    """Expand tiles over the (batch, head) pairs that read them, split heavy tiles, order by cost.

    A tile longer than :func:`split_limit` allows is cut into near-equal parts (spans are cut
    at chunk boundaries); each part writes a partial that the combine step merges by
    log-sum-exp, in part order, so results are deterministic. ``allow_split=False``
    (:func:`may_split`) keeps every tile whole.
    """
    xp = array_module(tiles.q0)
    a_b, a_h0, a_bh = head_assignments(batch, num_q_heads, num_kv_heads, heads_per_task,
                                       batch_of, head_of, mask_batch_heads[1])
    per_bh = np.bincount(a_bh, minlength=mask_batch_heads[0] * mask_batch_heads[1])
    bh_off = xp.asarray(np.concatenate([[0], np.cumsum(per_bh)]))
    a_b, a_h0 = xp.asarray(a_b), xp.asarray(a_h0)
    expansions = xp.asarray(per_bh)[tiles.mask_bh]
    limit = _tile_split_limit(tiles, expansions, allow_split, split_ratio, min_split_chunks,
                              in_flight, xp)
    parts = _Parts.of(tiles, limit, xp)
    t_part, t_local = _expanded(per_bh, expansions, parts, xp)
    t_tile = parts.tile[t_part]
    t_assign = bh_off[tiles.mask_bh[t_tile]] + t_local
    jobs = _Jobs.of(parts, expansions, t_tile, t_part, t_local, xp)
    tasks = stack_fields(Task, {
        Task.BATCH: a_b[t_assign], Task.Q_HEAD0: a_h0[t_assign],
        Task.Q_START: tiles.q0[t_tile], Task.Q_END: tiles.q1[t_tile],
        Task.SPAN_BEGIN: parts.begin[t_part], Task.SPAN_END: parts.end[t_part],
        Task.SLOT: jobs.task_slot, Task.COST: parts.cost[t_part]}, xp)
    # The hardware dispatches CTAs roughly in index order (and persistent CTAs take tasks in
    # it): heavy tasks first, then one (batch, head) assignment at a time (launch_keys).
    order = xp.argsort(launch_keys(tasks[:, Task.COST], t_assign, in_flight), kind="stable")
    tasks = xp.ascontiguousarray(tasks[order])
    if jobs.count:
        j_assign = bh_off[tiles.mask_bh[jobs.tile]] + (xp.arange(jobs.count) -
                                                        jobs.offsets[jobs.tile])
        combine = stack_fields(Combine, {
            Combine.BATCH: a_b[j_assign], Combine.Q_HEAD0: a_h0[j_assign],
            Combine.Q_START: tiles.q0[jobs.tile], Combine.Q_END: tiles.q1[jobs.tile],
            Combine.SLOT_BEGIN: jobs.slot_offsets[:-1], Combine.PARTS: jobs.parts}, xp)
    else:
        combine = xp.zeros((0, len(Combine)), dtype=np.int32)
    spans = xp.ascontiguousarray(stack_fields(Span, {
        Span.K_START: parts.k0, Span.K_END: parts.k1, Span.R_START: parts.r0,
        Span.R_END: parts.r1}, xp))
    return TaskQueue(tasks=tasks, spans=spans, combine=xp.ascontiguousarray(combine),
                     num_slots=jobs.num_slots, heads_per_task=heads_per_task,
                     tile_rows=tiles.tile_rows)


def _tile_split_limit(tiles: PhysicalTiles, expansions: Any, allow_split: bool,
                      split_ratio: float, min_split_chunks: int, in_flight: int, xp) -> float:
    """The split rule's limit, decided per tile (every expansion of a tile splits the same
    way); the three totals it needs come back from the device in one transfer."""
    if tiles.num_tiles and allow_split:
        chunks = tiles.chunks.astype(np.int64)
        totals = xp.stack([expansions.sum(), (chunks * expansions).sum(), chunks.max()])
        total_tasks, total_chunks, max_chunks = (int(x) for x in to_numpy(totals))
    else:
        total_tasks = total_chunks = max_chunks = 0
    limit = split_limit(split_ratio, min_split_chunks, total_tasks, total_chunks, in_flight)
    return limit if max_chunks > limit else float("inf")


@dataclass
class _Parts:
    """The tasks' parts, tile-major: an unsplit tile is one part over its own spans; the spans
    of split tiles are cut into parts appended after the tiles' span list. Without splits (the
    common case) the parts are the tiles."""

    count: int
    tile: Any      # each part's tile
    begin: Any     # its span range and key chunks
    end: Any
    cost: Any
    pieces: Any    # per tile, its parts (None without splits)
    split: Any     # per tile, whether it splits (None without splits)
    offsets: Any   # per tile, its first part (None without splits)
    k0: Any        # the span list, the split tiles' parts' spans appended
    k1: Any
    r0: Any
    r1: Any

    @classmethod
    def of(cls, tiles: PhysicalTiles, limit: float, xp) -> "_Parts":
        chunks = tiles.chunks.astype(np.int64)
        if limit == float("inf"):
            return cls(tiles.num_tiles, xp.arange(tiles.num_tiles), tiles.span_begin,
                       tiles.span_end, chunks, None, None, None, tiles.k0, tiles.k1, tiles.r0,
                       tiles.r1)
        pieces = xp.maximum((chunks + limit - 1) // limit, 1).astype(np.int64)
        split = pieces > 1
        offsets = offsets_from_counts(pieces, xp)
        count = int(offsets[-1])
        tile = segment_ids(offsets, count, xp)
        begin = tiles.span_begin[tile].astype(np.int64)
        end = tiles.span_end[tile].astype(np.int64)
        cost = chunks[tile]
        st = xp.nonzero(split)[0]
        k0, k1, r0, r1, pb, pe, pc = _cut_parts(
            tiles.span_begin[st], tiles.span_end[st], tiles.chunks[st], tiles, pieces[st], xp)
        # Split tiles' parts sit at offsets[t] .. offsets[t] + pieces[t] - 1, in order.
        sp_off = offsets_from_counts(pieces[st], xp)
        sp_tile = segment_ids(sp_off, int(sp_off[-1]), xp)
        dest = offsets[st][sp_tile] + (xp.arange(sp_tile.size) - sp_off[sp_tile])
        begin[dest] = pb + tiles.num_spans
        end[dest] = pe + tiles.num_spans
        cost[dest] = pc
        return cls(count, tile, begin, end, cost, pieces, split, offsets,
                   *(xp.concatenate([a, b.astype(np.int32)]) for a, b in
                     ((tiles.k0, k0), (tiles.k1, k1), (tiles.r0, r0), (tiles.r1, r1))))


def _expanded(per_bh: np.ndarray, expansions: Any, parts: _Parts, xp) -> tuple[Any, Any]:
    """Parts expanded over their (batch, head) assignments, part-major: each task's part and
    its assignment's index among its mask head's."""
    used = per_bh[per_bh > 0]
    if used.size and (used == used[0]).all() and bool((per_bh > 0).all()):
        # Every mask head is read by the same number of (batch, head) pairs: no scan needed.
        e = int(used[0])
        n_tasks = parts.count * e
        return xp.arange(n_tasks) // e, xp.arange(n_tasks) % e
    p_off = offsets_from_counts(expansions[parts.tile], xp)
    n_tasks = int(p_off[-1])
    t_part = segment_ids(p_off, n_tasks, xp)
    return t_part, xp.arange(n_tasks) - p_off[t_part]


@dataclass
class _Jobs:
    """The combine jobs: each (split tile, assignment) owns ``parts`` consecutive workspace
    slots, one per part in part order; ``task_slot`` is each task's slot (-1: unsplit)."""

    count: int
    num_slots: int
    task_slot: Any
    tile: Any = None
    offsets: Any = None
    parts: Any = None
    slot_offsets: Any = None

    @classmethod
    def of(cls, parts: _Parts, expansions: Any, t_tile: Any, t_part: Any, t_local: Any,
           xp) -> "_Jobs":
        none = cls(0, 0, xp.full(t_tile.size, -1, dtype=np.int64))
        if parts.split is None:
            return none
        offsets = offsets_from_counts(xp.where(parts.split, expansions, 0), xp)
        count = int(offsets[-1])
        if not count:
            return none
        tile = segment_ids(offsets, count, xp)
        job_parts = parts.pieces[tile]
        slot_offsets = offsets_from_counts(job_parts, xp)
        t_split = parts.split[t_tile]
        t_job = xp.where(t_split, offsets[t_tile] + t_local, 0)
        task_slot = xp.where(t_split, slot_offsets[t_job] + t_part - parts.offsets[t_tile], -1)
        return cls(count, int(slot_offsets[-1]), task_slot, tile, offsets, job_parts,
                   slot_offsets)


@dataclass(frozen=True)
class SpanArrays:
    """A queue's span columns as :func:`_cut_parts` reads them (the tiles' have the same
    names): key ranges ``k0``/``k1``, row restrictions ``r0``/``r1``, walked ``block_n`` keys a
    step."""

    k0: np.ndarray
    k1: np.ndarray
    r0: np.ndarray
    r1: np.ndarray
    block_n: int


# The least share of a queue's time a filled last wave must promise (its arithmetic: the
# part-full wave's task time less one part's, over the waves'), else the queue is left whole.
# The fills measured gave about half of what they promised (Wan-1.3B dense 1.4-1.6% of a
# promised 2.8%), while the fill's host work -- the queue copied back and sorted again -- grows
# with the queue: HunyuanVideo's top-k 64-token plan (7.5M spans, 170 waves, 0.5% promised)
# took 110 ms with it and 2 ms without (docs/decisions.md).
FILL_MIN_GAIN = 0.02


def last_wave_parts(num_tasks: int, in_flight: int, chunks: int, min_chunks: int
                    ) -> tuple[int, int]:
    """How :func:`fill_last_wave` cuts a queue of ``num_tasks`` equal tasks of ``chunks`` key
    chunks each on a GPU running ``in_flight`` at once: ``(tail, parts)``, the last ``tail``
    tasks (those of the last, part-full wave) each into ``parts`` pieces of at least
    ``min_chunks`` chunks, so that the pieces fill that wave; ``(0, 1)`` where no cut shortens
    it by ``FILL_MIN_GAIN`` of the queue's time. The queue then ends after its full waves plus
    one piece, not one whole task: Wan-1.3B's dense layer, 3,072 tasks on 132 SMs, ends after
    23 1/3 task times instead of 24."""
    if in_flight <= 0 or num_tasks <= 0 or chunks <= 0:
        return 0, 1
    tail = num_tasks % in_flight
    if tail == 0:
        return 0, 1
    parts = min(in_flight // tail, chunks // max(int(min_chunks), 1))
    if parts < 2 or (1 - 1 / parts) < FILL_MIN_GAIN * (num_tasks // in_flight + 1):
        return 0, 1
    # As many parts as a step of ceil(chunks / parts) chunks gives: none of them empty.
    step = -(-chunks // parts)
    return tail, -(-chunks // step)


def fill_last_wave(queue: TaskQueue, groups: Callable[[np.ndarray], np.ndarray], block_n: int,
                   in_flight: int, min_chunks: int) -> TaskQueue:
    """``queue`` with its last wave filled: where every task costs the same (a mask selecting
    every block, a band away from its ends) and the last wave of ``in_flight`` task slots would
    run part-full, the last tasks in launch order are cut by key chunks into parts that fill
    it (:func:`last_wave_parts`), each part writing a partial that the combine step merges.

    Queues of the span-by-span walk (a packed walk's chunks are not cut span by span) that
    split nothing else, with exact arrays: on the host, or a device planner's that synchronized
    already (its costs are read back; a sync-free queue, whose task count only the device
    knows, is returned as it is, as is any other). ``groups`` maps host tasks to their (batch,
    head) assignments (:func:`task_groups`), which the parts keep, for the launch order
    (:func:`launch_keys`): the tasks before the last wave keep their places, the parts follow
    them, longest first within an assignment. The result's arrays are in the queue's array
    module; only a queue that is cut is copied to the host."""
    if queue.num_slots or queue.count is not None or queue.tasks.shape[0] == 0:
        return queue
    xp = array_module(queue.tasks)
    cost = queue.tasks[:, Task.COST]
    lo, hi = (int(x) for x in to_numpy(xp.stack([cost.min(), cost.max()])))
    if lo != hi:
        return queue
    tail, parts = last_wave_parts(queue.tasks.shape[0], in_flight, lo, min_chunks)
    if tail == 0:
        return queue
    tasks = to_numpy(queue.tasks)
    group = groups(tasks)
    head, cut = tasks[:-tail], tasks[-tail:]
    sp = to_numpy(queue.spans)
    spans = SpanArrays(k0=sp[:, Span.K_START], k1=sp[:, Span.K_END], r0=sp[:, Span.R_START],
                       r1=sp[:, Span.R_END], block_n=block_n)
    k0, k1, r0, r1, pb, pe, pc = _cut_parts(
        cut[:, Task.SPAN_BEGIN], cut[:, Task.SPAN_END], cut[:, Task.COST], spans,
        np.full(tail, parts, np.int64), np)
    base = sp.shape[0]
    # Parts task-major: task i's parts are rows i * parts .. i * parts + parts - 1 and slots.
    parted = np.repeat(cut, parts, axis=0)
    parted[:, Task.SPAN_BEGIN] = pb + base
    parted[:, Task.SPAN_END] = pe + base
    parted[:, Task.SLOT] = np.arange(tail * parts)
    parted[:, Task.COST] = pc
    combine = stack_fields(Combine, {
        Combine.BATCH: cut[:, Task.BATCH], Combine.Q_HEAD0: cut[:, Task.Q_HEAD0],
        Combine.Q_START: cut[:, Task.Q_START], Combine.Q_END: cut[:, Task.Q_END],
        Combine.SLOT_BEGIN: np.arange(tail) * parts, Combine.PARTS: np.full(tail, parts)}, np)
    new_spans = np.concatenate([sp, stack_fields(Span, {
        Span.K_START: k0, Span.K_END: k1, Span.R_START: r0, Span.R_END: r1}, np)])
    tasks = np.concatenate([head, parted])
    group = np.concatenate([group[:-tail], np.repeat(group[-tail:], parts)])
    order = np.argsort(launch_keys(tasks[:, Task.COST], group, in_flight), kind="stable")
    return TaskQueue(tasks=xp.asarray(np.ascontiguousarray(tasks[order])),
                     spans=xp.asarray(np.ascontiguousarray(new_spans)),
                     combine=xp.asarray(np.ascontiguousarray(combine)), num_slots=tail * parts,
                     heads_per_task=queue.heads_per_task, tile_rows=queue.tile_rows)


def _cut_parts(span_begin: Any, span_end: Any, chunks: Any, spans: Any, parts: Any, xp):
    """Cut span lists -- item i's spans are ``spans``' [span_begin[i], span_end[i]) and cost
    ``chunks[i]`` key chunks -- into ``parts[i]`` near-equal pieces by key chunks. ``spans``:
    span arrays ``k0``/``k1``/``r0``/``r1`` and the step ``block_n`` as attributes (the tiles',
    or a queue's as :class:`SpanArrays`).

    Spans are cut at chunk boundaries, so every piece still starts a chunk where the kernel
    would. Returns the new spans (k0, k1, r0, r1) and per part (item-major, part order) its span
    range in the new list and its cost in chunks.
    """
    bn = spans.block_n
    t_ns = (span_end - span_begin).astype(np.int64)
    ts_off = offsets_from_counts(t_ns, xp)
    n_ts = int(ts_off[-1])
    ts_tile = segment_ids(ts_off, n_ts, xp)  # the item of each span
    ts_src = span_begin[ts_tile].astype(np.int64) + (xp.arange(n_ts) - ts_off[ts_tile])
    k0 = spans.k0[ts_src].astype(np.int64)
    k1 = spans.k1[ts_src].astype(np.int64)
    c = (k1 - k0 + bn - 1) // bn
    c_off = offsets_from_counts(c, xp)
    cs = c_off[:-1] - c_off[ts_off[:-1]][ts_tile]  # first chunk of each span within its item
    ce = cs + c
    step = (chunks.astype(np.int64) + parts - 1) // parts  # chunks per part
    st = step[ts_tile]
    p_first = cs // st
    p_last = (ce - 1) // st
    pieces = p_last - p_first + 1
    pc_off = offsets_from_counts(pieces, xp)
    n_pc = int(pc_off[-1])
    pc_span = segment_ids(pc_off, n_pc, xp)
    pc_part = p_first[pc_span] + (xp.arange(n_pc) - pc_off[pc_span])
    pc_cs = xp.maximum(cs[pc_span], pc_part * st[pc_span])
    pc_ce = xp.minimum(ce[pc_span], (pc_part + 1) * st[pc_span])
    base = k0[pc_span] - cs[pc_span] * bn
    new_k0 = base + pc_cs * bn
    new_k1 = xp.minimum(k1[pc_span], base + pc_ce * bn)
    new_r0 = spans.r0[ts_src][pc_span]
    new_r1 = spans.r1[ts_src][pc_span]
    part_off = offsets_from_counts(parts, xp)
    n_parts = int(part_off[-1])
    piece_part = part_off[:-1][ts_tile[pc_span]] + pc_part  # non-decreasing
    per_part = xp.bincount(piece_part, minlength=n_parts)
    pp_off = offsets_from_counts(per_part, xp)
    part_cost = xp.bincount(piece_part, weights=(pc_ce - pc_cs), minlength=n_parts)
    return (new_k0, new_k1, new_r0, new_r1, pp_off[:-1], pp_off[1:],
            part_cost.astype(np.int64))
