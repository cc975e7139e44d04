"""The backward pass's task queues: what the backward kernels (``cuda/sm80/bwd_*.cu``,
``cuda/sm90/bwd_*.cu``) walk, organized by the same planners as the forward, in both directions.

- ``dq``: query-major, as the forward's (tiles of query rows, GQA heads packed, each walking
  the key spans its rows select), never split: each dQ row has one task.
- ``dkdv``: key-major (``Direction.KEY_MAJOR``: the mask's transpose), one task per (batch, kv
  head, key tile) holding the query spans of *every* query head of the kv head's group, so
  that dK and dV sum the group in registers and each row has one writer. A query position
  of such a span is ``head_in_group * seq_q + token``: one span never leaves its head.

One writer per gradient row makes the pass deterministic without floating-point atomics or
an fp32 gradient buffer (docs/decisions.md, "Backward"). With ``config.deterministic_backward``
off the Hopper dK/dV kernel sums dQ by atomics as it walks the key-major queue instead; the
query-major queue is then not planned (``query_major=False``).

Where they are planned: a device mask is planned by the planner kernels
(``planners.DevicePlanner``) in both directions without reading anything back -- the queues are
the planner's bounded buffers with their task counts on the device, which the kernels read --
so a training step's backward never waits for the GPU. For GQA the key-major tiles are aligned
(every head of a group cuts the same ones) and array operations on the device merge a group's
tasks (:func:`_group_on_device`; the host's form is :func:`_group_key_tiles`). A host mask, or
one too large for the planner kernels or the merge's bounded buffers, is planned on the host (a
device mask read back once).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._array import array_module, to_numpy
from ..capture import capturing
from ..cuda.variants import backward_block_n
from ..launch import LaunchState
from ..mask import BlockMask
from .mode import Direction, PlanMode
from .planners import ArrayPlanner, DevicePlanner, PlanShape
from .device_planner import SYNC_FREE_WORKSPACE_LIMIT
from .queue import Combine, Span, Task, TaskQueue
from .regime.backward import BackwardRegime
from .regime.choice import RegimeChoice
from .regime.selection import select_backward_regime, selection_generation
from .regime.value import Regime
from .tasks import NEVER_SPLIT_RATIO

__all__ = ["BackwardQueues", "BackwardPlan", "backward_regime", "backward_queues"]


@dataclass(frozen=True)
class BackwardQueues:
    """The two queues of one mask's backward pass (see the module docstring): host arrays, or
    the device planner's buffers with the task count on the device (``TaskQueue.count``).

    Attributes:
        dq: the query-major queue (tile_rows query tokens of each of heads_per_task heads);
            None where it was not asked for (dQ summed by the dK/dV kernel).
        dkdv: the key-major queue: Q_HEAD0 is the group's first query head, Q_START..Q_END a
            key tile, spans' K_START..K_END query positions (head in group x seq_q + token)
            and R_START..R_END the key rows they apply to.
        group: query heads per kv head.
        seq_q: query tokens (the position stride of a head in ``dkdv``'s spans).
        block_m: rows a task holds (packed query heads' rows in ``dq``, keys in ``dkdv``).
        block_n: (dQ step in keys, dK/dV step in query rows) the queues' costs count.
    """

    dq: TaskQueue | None
    dkdv: TaskQueue
    group: int
    seq_q: int
    block_m: int
    block_n: tuple[int, int]

    @property
    def on_device(self) -> bool:
        """Whether the task counts stay on the device (the planner kernels' sync-free
        buffers, which the kernels read up to the counts)."""
        return any(x is not None and x.count is not None for x in (self.dq, self.dkdv))

    def settled(self) -> "BackwardQueues":
        """The same queues as exact host arrays (a device queue is cut at its task count: one
        copy, which waits for the planner's kernels)."""
        return BackwardQueues(None if self.dq is None else _settled(self.dq),
                              _settled(self.dkdv), self.group, self.seq_q, self.block_m,
                              self.block_n)


def _settled(queue: TaskQueue) -> TaskQueue:
    """``queue`` on the host, cut at its task count and at the spans its tasks read."""
    tasks = to_numpy(queue.tasks)
    if queue.count is not None:
        tasks = tasks[:int(to_numpy(queue.count)[0])]
    n_spans = int(tasks[:, Task.SPAN_END].max()) if len(tasks) else 0
    return TaskQueue(tasks=tasks, spans=to_numpy(queue.spans)[:n_spans],
                     combine=to_numpy(queue.combine), num_slots=queue.num_slots,
                     heads_per_task=queue.heads_per_task, tile_rows=queue.tile_rows)


@dataclass
class BackwardPlan:
    """A mask's backward pass for one attention shape: its backward regime and queues, chosen
    and made at the first run that needs them and kept (per GPU architecture and mode; per tile
    rows and steps), and the device state of its launches -- what
    ``backward_launch.run_backward_plan`` reads. ``tessera.attention_backward`` makes one per
    call; a :class:`~tessera.runtime.plan.Plan` keeps one for its mask. ``read_mask`` False:
    the regime selection reads nothing of a device mask (a request never waits for the GPU)."""

    mask: BlockMask
    shape: PlanShape
    launch_state: LaunchState = field(default_factory=LaunchState, repr=False)
    read_mask: bool = True
    _queues: dict = field(default_factory=dict, repr=False)
    _regimes: dict = field(default_factory=dict, repr=False)

    def backward_regime(self, arch: int | None, *, deterministic: bool = False,
                        portable: bool = False) -> BackwardRegime:
        """The backward regime for ``arch`` (:func:`~tessera.runtime.regime.selection.
        select_backward_regime`), chosen once per architecture, mode and table in force."""
        key = (arch, deterministic, portable, selection_generation())
        got = self._regimes.get(key)
        if got is None:
            s = self.shape
            # (Inside a CUDA-graph capture nothing may be read back: the geometry's answer.)
            got = self._regimes[key] = select_backward_regime(
                self.mask, arch=arch, head_dim=s.head_dim, dtype=s.dtype,
                num_q_heads=s.num_q_heads, batch=s.batch, deterministic=deterministic,
                portable=portable, read_mask=self.read_mask and not capturing())
        return got

    def backward_queues(self, block_m: int = 64, block_n: tuple[int, int] | None = None,
                        query_major: bool = True) -> BackwardQueues:
        """The queues (:func:`backward_queues`), planned at the first call and kept; a call
        without the query-major queue takes the kept queues of one with it."""
        got = self._queues.get((block_m, block_n, True))
        if got is None and not query_major:
            got = self._queues.get((block_m, block_n, False))
        if got is None:
            got = self._queues[(block_m, block_n, query_major)] = backward_queues(
                self.mask, self.shape, block_m=block_m, block_n=block_n,
                query_major=query_major)
        return got


def backward_regime(block_m: int, block_n: int) -> Regime:
    """The regime the backward queues are organized with: ``block_m``-row tiles (64: the
    portable kernels' and the Hopper kernels' for small blocks, 128: the Hopper kernels'
    otherwise), ``block_n``-wide steps (what the costs count), no merged rows (a key tile is
    then the same for every query head of a group), no splits."""
    return Regime(family="sm80", block_m=block_m, block_n=block_n, num_warps=block_m // 16,
                  stages=2, combine_threshold=0.0, split_ratio=NEVER_SPLIT_RATIO)


def backward_queues(mask: BlockMask, shape: PlanShape, *, block_m: int = 64,
                    block_n: tuple[int, int] | None = None,
                    query_major: bool = True) -> BackwardQueues:
    """Both queues of ``mask``'s backward pass for ``shape`` with ``block_m``-row tasks (or,
    unless ``query_major``, the key-major one alone: dQ summed by the dK/dV kernel): by the
    planner kernels without a synchronization where they apply (a device mask; GQA's groups
    merged on the device), else on the host (a device mask is copied back once; see the module
    docstring). ``block_n``: the kernels' steps (dQ's, dK/dV's); None: the portable kernels'
    (:func:`~tessera.cuda.variants.backward_block_n`)."""
    if block_n is None:
        block_n = (backward_block_n(shape.head_dim, False), backward_block_n(shape.head_dim, True))
    group = shape.num_q_heads // shape.num_kv_heads
    dq_regime = backward_regime(block_m, block_n[0])
    seq_q, seq_kv = int(mask.q_bounds[-1]), int(mask.kv_bounds[-1])
    # (The planner kernels read the mask on the current stream, after its writes.)
    with mask.reading():
        planned = _on_device(mask, shape, dq_regime if query_major else None,
                             backward_regime(block_m, block_n[1]).with_(align_tiles=group > 1))
        if planned is not None and group > 1:
            planned = (planned[0], _group_on_device(planned[1], group, seq_q, seq_kv, shape))
    if planned is not None and planned[1] is not None:
        return BackwardQueues(*planned, group, seq_q, block_m, (dq_regime.block_n, block_n[1]))
    host = mask.to_host()
    planner = ArrayPlanner()

    def organized(direction: Direction, regime: Regime) -> TaskQueue:
        choice = RegimeChoice(regime, True, True, 0, False)
        return planner.organize(host, shape, PlanMode.EXACT, choice, direction).exact[1]

    # The query heads of a group must cut the same key tiles. A head's tiles start at the
    # bounds of its runs of key blocks, which differ between heads unless every block bound is
    # a multiple of block_m; then tiles are aligned at multiples of block_m whatever each head
    # selects (a span applies to the key rows that select it). Alignment costs host time (a
    # dense Wan layer 0.18 s of 0.24): taken only where it is needed.
    aligned = group > 1 and bool(np.any(np.asarray(host.kv_bounds[:-1]) % block_m))
    kv_regime = backward_regime(block_m, block_n[1]).with_(align_tiles=aligned)
    dq = organized(Direction.QUERY_MAJOR, dq_regime) if query_major else None
    per_head = organized(Direction.KEY_MAJOR, kv_regime)
    dkdv = _group_key_tiles(per_head, group, seq_q, seq_kv, shape)
    return BackwardQueues(dq, dkdv, group, seq_q, block_m,
                          (dq_regime.block_n, kv_regime.block_n))


def _on_device(mask: BlockMask, shape: PlanShape, dq_regime: Regime | None,
               kv_regime: Regime) -> tuple[TaskQueue | None, TaskQueue] | None:
    """The (dq, key-major) queues by the planner kernels, sync-free (no task splits; no dq
    queue without ``dq_regime``); None where they do not apply (a host mask, dense rows past
    their limit). The key-major tasks hold one query head each: with one query head per kv
    head such a task is already the dK/dV task (its query positions are the head's tokens);
    with GQA a group's are merged (:func:`_group_on_device`)."""
    planner = DevicePlanner()
    queues = []
    for direction, regime in ((Direction.QUERY_MAJOR, dq_regime),
                              (Direction.KEY_MAJOR, kv_regime)):
        if regime is None:
            queues.append(None)
            continue
        choice = RegimeChoice(regime, True, True, 0, False)
        if not planner.applies(mask, choice):
            return None
        got = planner.organize(mask, shape, PlanMode.REQUEST, choice, direction)
        if got is None:
            return None
        queues.append(got.launch_queue)
    return queues[0], queues[1]


def _group_on_device(queue: TaskQueue, group: int, seq_q: int, seq_kv: int,
                     shape: PlanShape) -> TaskQueue | None:
    """:func:`_group_key_tiles` on the planner kernels' key-major queue of aligned tiles (its
    task count on the device, or exact), by array operations that read nothing back: every
    (batch, query head) has a task for each tile of ``tile_rows`` keys, so the merged tasks --
    one per (batch, kv head, tile) -- are known from the shape, and each (merged task, head in
    group) pair's spans get a slot of a bounded spans buffer (the per-head spans times the most
    (batch, head) pairs reading one stored mask head). None where that buffer would exceed
    SYNC_FREE_WORKSPACE_LIMIT."""
    xp = array_module(queue.tasks)
    tasks, src_spans, bm = queue.tasks, queue.spans, queue.tile_rows
    per_head = -(-seq_kv // bm)  # aligned tiles of each (batch, query head)
    hkv = shape.num_kv_heads
    n_merged = shape.batch * hkv * per_head
    reuse = int(np.bincount(shape.batch_of).max()) * int(np.bincount(shape.head_of).max())
    cap_spans = int(src_spans.shape[0]) * reuse
    if 4 * len(Span) * cap_spans > SYNC_FREE_WORKSPACE_LIMIT or not n_merged:
        return None
    i64 = np.int64
    col = lambda f: tasks[:, f].astype(i64)  # noqa: E731
    # Rows past a device count are garbage (a one-sync plan's queue is exact: no count).
    valid = xp.arange(tasks.shape[0]) < (tasks.shape[0] if queue.count is None
                                         else queue.count[0])
    head = col(Task.Q_HEAD0)
    slots = n_merged * group  # one per (merged task, head in group); slot `slots`: the rest
    key = xp.where(valid, ((col(Task.BATCH) * hkv + head // group) * per_head
                           + col(Task.Q_START) // bm) * group + head % group, slots)
    count, owner, cost = (xp.zeros(slots + 1, i64) for _ in range(3))
    count[key] = xp.where(valid, col(Task.SPAN_END) - col(Task.SPAN_BEGIN), 0)
    owner[key] = xp.arange(tasks.shape[0])
    cost[key] = xp.where(valid, col(Task.COST), 0)
    ends = xp.cumsum(count[:slots])
    starts = ends - count[:slots]
    # Each span slot j: the (merged task, head) pair whose range holds it, the span it copies.
    j = xp.arange(cap_spans)
    pair = xp.minimum(xp.searchsorted(ends, j, side="right"), slots - 1)
    src = col(Task.SPAN_BEGIN)[owner[pair]] + j - starts[pair]
    spans = src_spans[xp.clip(src, 0, src_spans.shape[0] - 1)].astype(np.int32)
    shift = ((pair % group) * seq_q).astype(np.int32)  # positions: head in group x seq_q
    spans[:, Span.K_START] += shift
    spans[:, Span.K_END] += shift
    m = xp.arange(n_merged)
    out = xp.empty((n_merged, len(Task)), np.int32)
    out[:, Task.BATCH] = m // (hkv * per_head)
    out[:, Task.Q_HEAD0] = (m // per_head) % hkv * group
    out[:, Task.Q_START] = m % per_head * bm
    out[:, Task.Q_END] = xp.minimum(m % per_head * bm + bm, seq_kv)
    out[:, Task.SPAN_BEGIN] = starts[m * group]
    out[:, Task.SPAN_END] = ends[m * group + group - 1]
    out[:, Task.SLOT] = -1
    out[:, Task.COST] = xp.minimum(cost[:slots].reshape(n_merged, group).sum(axis=1),
                                   np.iinfo(np.int32).max)
    longest = xp.argsort(-out[:, Task.COST].astype(i64))
    return TaskQueue(tasks=xp.ascontiguousarray(out[longest]), spans=spans,
                     combine=xp.zeros((0, len(Combine)), np.int32), num_slots=0,
                     heads_per_task=1, tile_rows=bm)


def _group_key_tiles(queue: TaskQueue, group: int, seq_q: int, seq_kv: int,
                     shape: PlanShape) -> TaskQueue:
    """The key-major queue of one query head a task made one task per (batch, kv head, key
    tile): each task's spans, in query-head order, moved to positions head in group x seq_q +
    token; tasks longest first. Every key row of every (batch, kv head) must be in exactly one
    tile (the same for each query head: see backward_queues)."""
    tasks = np.asarray(queue.tasks)
    spans = np.asarray(queue.spans)
    if queue.num_slots:
        raise AssertionError("the backward's key-major queue must not split tasks")
    head = tasks[:, Task.Q_HEAD0].astype(np.int64)
    kvh, local = head // group, head % group
    b = tasks[:, Task.BATCH].astype(np.int64)
    start = tasks[:, Task.Q_START].astype(np.int64)
    order = np.lexsort((local, start, kvh, b))
    tasks, kvh, local, b, start = tasks[order], kvh[order], local[order], b[order], start[order]
    first = np.ones(len(tasks), bool)
    first[1:] = (b[1:] != b[:-1]) | (kvh[1:] != kvh[:-1]) | (start[1:] != start[:-1])
    owner = np.cumsum(first) - 1
    n_out = int(first.sum())
    # Spans in the new task order, their query ranges moved to the head's positions.
    counts = (tasks[:, Task.SPAN_END] - tasks[:, Task.SPAN_BEGIN]).astype(np.int64)
    idx = (np.repeat(tasks[:, Task.SPAN_BEGIN].astype(np.int64) - np.cumsum(counts) + counts,
                     counts) + np.arange(int(counts.sum())))
    moved = spans[idx].copy()
    offset = np.repeat(local * seq_q, counts)
    moved[:, Span.K_START] += offset.astype(np.int32)
    moved[:, Span.K_END] += offset.astype(np.int32)
    span_start = np.zeros(n_out + 1, np.int64)
    np.add.at(span_start, owner + 1, counts)
    span_start = np.cumsum(span_start)
    cost = np.zeros(n_out, np.int64)
    np.add.at(cost, owner, tasks[:, Task.COST].astype(np.int64))
    out = tasks[first].copy()
    ends = np.zeros(n_out, np.int64)
    np.maximum.at(ends, owner, tasks[:, Task.Q_END].astype(np.int64))
    if np.any(ends != out[:, Task.Q_END]) or np.any(
            np.minimum.reduceat(tasks[:, Task.Q_END], np.flatnonzero(first)) != ends):
        raise AssertionError("the query heads of a group cut their key tiles differently")
    out[:, Task.Q_HEAD0] = (kvh[first] * group).astype(np.int32)
    out[:, Task.SPAN_BEGIN] = span_start[:-1].astype(np.int32)
    out[:, Task.SPAN_END] = span_start[1:].astype(np.int32)
    out[:, Task.COST] = np.minimum(cost, np.iinfo(np.int32).max).astype(np.int32)
    covered = (out[:, Task.Q_END] - out[:, Task.Q_START]).astype(np.int64).sum()
    if covered != shape.batch * shape.num_kv_heads * seq_kv:
        raise AssertionError(f"the key tiles cover {covered} key rows, not "
                             f"{shape.batch * shape.num_kv_heads * seq_kv}")
    longest = np.argsort(-out[:, Task.COST].astype(np.int64), kind="stable")
    return TaskQueue(tasks=np.ascontiguousarray(out[longest]),
                     spans=np.ascontiguousarray(moved.astype(np.int32)),
                     combine=np.zeros((0, np.asarray(queue.combine).shape[1]), np.int32),
                     num_slots=0, heads_per_task=1, tile_rows=queue.tile_rows)
