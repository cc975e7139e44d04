"""The device planner: physical mapping and task organization fused for device masks.

The general planner (``mapping.map_to_tiles`` then ``tasks.build_task_queue``) runs on CuPy as
some eighty small array operations with five host synchronizations, milliseconds per plan. For
the common request -- a device mask, no restricted merges (``combine_threshold == 0``, the
default) -- three kernels of ``tessera/cuda/plan.cu`` do the same work:

1. ``plan_row_stats`` (shared with the general path): per mask row, its key spans, chunks and
   whether it equals the row before it;
2. ``plan_scan`` (one CTA): runs of identical rows, each run's spans, tiles and tasks, their
   offsets -- the tasks' already in launch order (``tasks.launch_keys``) -- and the totals;
3. ``plan_write_runs``: spans, tiles and the sorted tasks.

Aligned tiles (``Regime.align_tiles``) take the same path with the tiles in place of the mask
rows: ``plan_aligned_spans`` counts each tile's spans (the pieces of ``mapping._aligned_tiles``)
before the scan, where every tile is a run of its own, and writes them before step 3, which then
writes the tiles and tasks only.

**Sync-free** when no task may split (``tasks.may_split``: a never-split regime, or a shape with
many tasks per slot of the GPU): the arrays are buffers sized by bounds the mask's geometry
gives (at most a span per two key blocks a row, ...), the totals never leave the device, and
the attention kernels read the number of tasks from them. Nothing waits for the GPU, so a model
that plans a new mask per layer keeps the GPU fed. The host learns the real lengths only when
it asks for the plan's arrays (``Plan.tiles``/``Plan.queue``: one copy then).

A sync-free plan keeps its launches, whose arguments are the geometry's except the mask's dense
rows, so a later mask of its geometry is planned into the same buffers by launching them again
(``Plan.replan``; from the second planning on, one CUDA graph replayed): this is how
``tessera.attention`` serves a model's requests, a new mask each, with a kept plan.

A plan that must be sync-free (``PlanMode.CAPTURE``: a request captured into a
CUDA graph, whose regime never splits) takes bounds up to
:data:`REQUIRED_SYNC_FREE_WORKSPACE_LIMIT` instead, and is refused beyond.

**One sync** otherwise (or when the bounds would exceed :data:`SYNC_FREE_WORKSPACE_LIMIT`):
the totals are read after step 2 to size the arrays and to apply the split rule; when a task
must split, step 3 writes spans and tiles only and the general task organization
(``tasks.build_task_queue``) cuts and orders the tasks.

Either way the result is array for array the general planner's (tested on the GPU, and on the
CPU with numpy stand-ins for the kernels).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._array import Workspace, array_module, to_numpy
from ..capture import device_copy, stream_capturing
from ..cuda import loader
from ..cuda.variants import Variant
from ..mask import BlockMask
from .mapping import PhysicalTiles, aligned_geometry, device_dense_rows, straddling_tiles
from .planner_launches import device_bounds
from .queue import Combine, Span, Task, TaskQueue, Tile, Total
from .tasks import HEAVY_MEAN, HEAVY_SHARE, build_task_queue, head_assignments, split_limit

__all__ = ["plan_on_device", "SyncFreePlan", "SYNC_FREE_WORKSPACE_LIMIT",
           "REQUIRED_SYNC_FREE_WORKSPACE_LIMIT"]

# Most bytes the bounded buffers of a sync-free plan may take; beyond (e.g. HunyuanVideo's 930
# x 930 blocks per head, whose kernels take tens of milliseconds) the one-sync path sizes them.
SYNC_FREE_WORKSPACE_LIMIT = 64 << 20
# The limit for a plan that must be sync-free (``PlanMode.CAPTURE``, a request
# captured into a CUDA graph): bounds that large are still cheaper than no plan at all.
REQUIRED_SYNC_FREE_WORKSPACE_LIMIT = 1 << 30


@dataclass
class SyncFreePlan:
    """A sync-free plan's device buffers: ``tiles``, ``spans`` and ``tasks`` (in launch order)
    int32 ``[capacity, fields]`` in the layout of ``queue.py``, filled up to ``totals`` (device
    int64, ``queue.Total``), which stay on the device until
    :meth:`settle`. ``num_merged``: the aligned tiles that straddle (known from the geometry)."""

    tiles: Any
    spans: Any
    tasks: Any
    totals: Any
    tile_rows: int
    block_n: int
    heads_per_task: int
    num_merged: int = 0
    # Plans a mask of the same geometry into these buffers again: relaunch(dense rows).
    relaunch: Callable[[Any], None] | None = None

    def launch_queue(self) -> TaskQueue:
        """The queue the kernels read: the buffers, with the task count on the device."""
        return TaskQueue(tasks=self.tasks, spans=self.spans,
                         combine=_no_combine(array_module(self.tasks)), num_slots=0,
                         heads_per_task=self.heads_per_task, tile_rows=self.tile_rows,
                         count=self.totals[Total.TASKS:Total.TASKS + 1])

    def settle(self) -> tuple[PhysicalTiles, TaskQueue]:
        """The exact tiles and queue: views of the buffers cut at the totals (one copy of six
        numbers from the device, which waits for the planner's kernels)."""
        totals = to_numpy(self.totals)
        n_runs, n_spans = int(totals[Total.RUNS]), int(totals[Total.SPANS])
        n_tiles, n_tasks = int(totals[Total.TILES]), int(totals[Total.TASKS])
        tiles, spans = self.tiles[:n_tiles], self.spans[:n_spans]
        pt = _physical_tiles(tiles, spans, self.tile_rows, self.block_n, n_runs,
                             self.num_merged)
        queue = TaskQueue(tasks=self.tasks[:n_tasks], spans=spans,
                          combine=_no_combine(array_module(self.tasks)), num_slots=0,
                          heads_per_task=self.heads_per_task, tile_rows=self.tile_rows)
        return pt, queue


# Where a planner launch takes the mask's dense rows (the one argument a replan changes).
DENSE = object()


class _Launch:
    """One planner kernel launch with its arguments converted once: ``DENSE`` stands for the
    dense rows, given at each call."""

    def __init__(self, kernel: str, grid: tuple[int], args: tuple, block: int = 256) -> None:
        self.fn = loader.load_kernel(Variant("plan.cu", kernel))
        self.grid, self.block = grid, (block,)
        self.args = args
        self.dense_at = next((i for i, a in enumerate(args) if a is DENSE), None)

    def __call__(self, dense: Any) -> None:
        args = self.args
        if self.dense_at is not None:
            args = args[:self.dense_at] + (dense,) + args[self.dense_at + 1:]
        self.fn(self.grid, self.block, args)


class _Relaunch:
    """A sync-free plan's launches in order, run by each planning of the plan (holds the scratch
    they address by raw pointers). On CuPy, a replan replays them as one CUDA graph, captured
    at the first replan on a stream of its own, which reads the dense rows from a buffer that
    each replan fills by one copy: ~6 us of host time for the three planner launches instead of
    ~35 on the H200. A stream being captured by the caller
    takes the launches themselves."""

    def __init__(self, launches: tuple[_Launch, ...], scratch: Workspace, xp: Any) -> None:
        self.launches, self._scratch, self._xp = launches, scratch, xp
        self.graph = self._rows = None
        self._calls = 0

    def __call__(self, dense: Any) -> None:
        self._calls += 1
        xp = self._xp
        if xp is np or self._calls == 1 or _capturing(xp):
            for launch in self.launches:
                launch(dense)
            return
        if self.graph is None:
            self._rows = xp.empty_like(dense)
            capture = _capture_stream(xp)
            with capture:
                capture.begin_capture()
                try:
                    for launch in self.launches:
                        launch(self._rows)
                finally:
                    self.graph = capture.end_capture()
        stream = xp.cuda.get_current_stream()
        self._rows.data.copy_from_device_async(dense.data, dense.nbytes, stream)
        self.graph.launch(stream)


def _capturing(xp: Any) -> bool:
    """Whether CuPy's current stream is being captured into a CUDA graph."""
    return stream_capturing(xp.cuda.get_current_stream().ptr)


_capture_streams: dict[tuple[int, int], Any] = {}


def _capture_stream(xp: Any) -> Any:
    """A stream of the current device and thread that only ever captures planner graphs (two
    threads replanning at once must not capture on one stream)."""
    key = (xp.cuda.Device().id, threading.get_ident())
    stream = _capture_streams.get(key)
    if stream is None:
        stream = _capture_streams[key] = xp.cuda.Stream(non_blocking=True)
    return stream


def _no_combine(xp) -> Any:
    """The empty combine list of a plan without split tasks (one per device, not per plan)."""
    if xp is np:
        return np.zeros((0, len(Combine)), dtype=np.int32)
    return device_copy(("no_combine",), lambda: xp.zeros((0, len(Combine)), dtype=np.int32),
                       xp)


def _physical_tiles(tiles: Any, spans: Any, tile_rows: int, block_n: int,
                    n_runs: int, num_merged: int) -> PhysicalTiles:
    return PhysicalTiles(tile_rows=tile_rows, block_n=block_n, mask_bh=tiles[:, Tile.MASK_BH],
                         q0=tiles[:, Tile.Q_START], q1=tiles[:, Tile.Q_END],
                         span_begin=tiles[:, Tile.SPAN_BEGIN], span_end=tiles[:, Tile.SPAN_END],
                         chunks=tiles[:, Tile.CHUNKS], k0=spans[:, Span.K_START],
                         k1=spans[:, Span.K_END], r0=spans[:, Span.R_START],
                         r1=spans[:, Span.R_END], num_groups=n_runs,
                         num_merged=num_merged)


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


def _capacities(mask: BlockMask, n_rows: int, tile_rows: int, assignments: int
                ) -> tuple[int, int, int]:
    """Most spans, tiles and tasks any mask of this geometry can make (the sync-free buffers):
    a row has at most a span per two key blocks; a run of rows, at most one tile more than its
    tokens fill; every tile is expanded over the (batch, head) pairs that read its mask head,
    at most ``assignments`` per stored mask head all together."""
    n_kv, n_q = mask.num_kv_blocks, mask.num_q_blocks
    spans = n_rows * ((n_kv + 1) // 2)
    per_head_tiles = -(-mask.seq_len_q // tile_rows) + n_q
    tiles = mask.batch_heads[0] * mask.batch_heads[1] * per_head_tiles
    return spans, tiles, assignments * per_head_tiles


def plan_on_device(mask: BlockMask, *, tile_rows: int, block_n: int, heads_per_task: int,
                   batch: int, num_q_heads: int, num_kv_heads: int, batch_of: np.ndarray,
                   head_of: np.ndarray, split_ratio: float, min_split_chunks: int,
                   in_flight: int = 0, allow_split: bool = True, pack_keys: bool = False,
                   align_tiles: bool = False, require_sync_free: bool = False
                   ) -> tuple[PhysicalTiles, TaskQueue] | SyncFreePlan | None:
    """Tiles and task queue of a device mask without restricted merges, by the planner kernels.

    A :class:`SyncFreePlan` when ``allow_split`` is False (``tasks.may_split``) and its buffers
    fit :data:`SYNC_FREE_WORKSPACE_LIMIT`; else exact arrays after one synchronization; None
    when the mask's dense rows would be too large (the general planner then takes over).
    ``pack_keys``: task costs count each row's keys end to end (``Regime.pack_keys``).
    ``align_tiles``: tiles at multiples of ``tile_rows`` (``Regime.align_tiles``):
    ``plan_aligned_spans`` counts and writes each tile's spans, and the tiles take the place of
    the mask rows in the scan (each its own run of one tile) and in the task writing.
    ``require_sync_free``: a SyncFreePlan or a ValueError (buffers up to
    :data:`REQUIRED_SYNC_FREE_WORKSPACE_LIMIT`; ``allow_split`` must be False).
    """
    dense_rows = device_dense_rows(mask)
    if dense_rows is None:
        if require_sync_free:
            raise ValueError(f"block_mask {mask} is too large to plan without reading it back "
                             "(its dense block rows exceed the device planner's limit)")
        return None
    dense = mask.xp.ascontiguousarray(dense_rows).view(np.uint8)
    kit = _PlannerKit(mask, tile_rows, block_n, heads_per_task, batch, num_q_heads,
                      num_kv_heads, batch_of, head_of, in_flight, pack_keys, align_tiles)
    if require_sync_free and (allow_split or
                              kit.buffer_bytes > REQUIRED_SYNC_FREE_WORKSPACE_LIMIT):
        raise ValueError(f"block_mask {mask} cannot be planned without reading it back: "
                         + ("its tasks may split" if allow_split else
                            f"its bounded plan buffers would take {kit.buffer_bytes >> 20} MB"))
    limit = REQUIRED_SYNC_FREE_WORKSPACE_LIMIT if require_sync_free else \
        SYNC_FREE_WORKSPACE_LIMIT
    if not allow_split and kit.buffer_bytes <= limit:
        return kit.sync_free(dense)
    return kit.one_sync(dense, split_ratio, min_split_chunks, allow_split)


class _PlannerKit:
    """The fused planner's launches for one mask geometry and attention shape: their scratch
    (one allocation, passed as raw addresses; views on numpy), the launches that count
    (``first``: row statistics or aligned tiles' spans, then the scan) and those that write
    (:meth:`write_runs`), and the capacities of the sync-free buffers. Each launch's arguments
    are fixed for the geometry except the dense rows (``DENSE``): a sync-free plan keeps them
    and plans a later mask of its geometry by launching them again (``Plan.replan``)."""

    def __init__(self, mask: BlockMask, tile_rows: int, block_n: int, heads_per_task: int,
                 batch: int, num_q_heads: int, num_kv_heads: int, batch_of: np.ndarray,
                 head_of: np.ndarray, in_flight: int, pack_keys: bool,
                 align_tiles: bool) -> None:
        self.mask, self.xp, self.in_flight = mask, mask.xp, in_flight
        self.tile_rows, self.block_n, self.heads_per_task = tile_rows, block_n, heads_per_task
        self.shape = (batch, num_q_heads, num_kv_heads, batch_of, head_of)
        xp = self.xp
        self.qb, self.kb = device_bounds(mask.q_bounds, xp), device_bounds(mask.kv_bounds, xp)
        self.assign = _assignments(xp, batch, num_q_heads, num_kv_heads, heads_per_task,
                                   batch_of, head_of, mask.batch_heads)
        self.geo = aligned_geometry(mask.q_bounds, tile_rows, xp) if align_tiles else None
        self.num_merged = 0 if self.geo is None else straddling_tiles(mask, tile_rows)
        n_bh = mask.batch_heads[0] * mask.batch_heads[1]
        # Rows of the scan: the mask's, or its aligned tiles (virtual rows of tile_rows tokens).
        self.n_scan = (n_bh * mask.num_q_blocks if self.geo is None else n_bh * self.geo.per_bh)
        # Sort keys: one per possible task cost (key chunks of a row: at most one per block_n
        # keys, plus one per span for its partial last chunk; an aligned tile holds a key in at
        # most one piece per two of the blocks it meets) for the heavy tasks and for each
        # (batch, head) assignment.
        self.overlap = 1 if self.geo is None else -(-self.geo.reach // 2)
        n_keys = self.overlap * (-(-mask.seq_len_kv // block_n) + mask.num_kv_blocks) + 1
        self.scratch = _scratch(xp, self.n_scan, n_keys * (1 + int(self.assign[2].size)), n_bh)
        self.totals = self.scratch.view("totals")  # kept by the plan
        self.heavy = (np.int64(HEAVY_SHARE * max(in_flight, 1)), np.int64(HEAVY_MEAN))
        self.first = self._counting_launches(pack_keys)

    def _counting_launches(self, pack_keys: bool) -> list[_Launch]:
        """Row statistics (or the aligned tiles' span counts), then the scan."""
        m, geo, arg, i32, null = self.mask, self.geo, self.scratch.arg, np.int32, np.uint64(0)
        expansions, assign_off, assign_b, _ = self.assign
        if geo is None:
            # Per row: spans, chunks, whether it repeats the row before (count and token sums:
            # not needed here, left uncomputed).
            first = [_Launch("plan_row_stats", _rows_grid(self.n_scan),
                             (DENSE, i32(self.n_scan), i32(m.num_kv_blocks), i32(m.num_q_blocks),
                              self.kb, i32(self.block_n), null, arg("nspans"), null, null,
                              arg("chunks"), arg("identical"), i32(pack_keys), null, i32(0),
                              null))]
            self.scan_blocks, self.scan_bounds = m.num_q_blocks, self.qb
        else:
            first = [self._tile_spans(null, null)]
            self.scan_blocks, self.scan_bounds = geo.per_bh, geo.bounds
        first.append(_Launch("plan_scan", (1,),
                             (arg("identical"), arg("nspans"), arg("chunks"), i32(self.n_scan),
                              i32(self.scan_blocks), self.scan_bounds, i32(self.tile_rows),
                              expansions, assign_off, i32(assign_b.size), *self.heavy,
                              arg("hist"), arg("key_start"), arg("run_row0"),
                              arg("run_row1"), arg("span_off"), arg("tile_off"),
                              arg("task_off"), arg("bh_run0"), arg("heavy_runs"),
                              self.totals), block=1024))
        return first

    def _tile_spans(self, span_off: Any, spans: Any) -> _Launch:
        """plan_aligned_spans: counting (null ``span_off``) or writing the aligned tiles'."""
        m, geo, arg, i32 = self.mask, self.geo, self.scratch.arg, np.int32
        return _Launch("plan_aligned_spans", _rows_grid(self.n_scan),
                       (DENSE, i32(self.n_scan), i32(geo.per_bh), i32(m.num_q_blocks),
                        i32(m.num_kv_blocks), self.kb, self.qb, geo.lo, geo.hi,
                        i32(self.tile_rows), i32(m.seq_len_q), i32(self.block_n),
                        arg("nspans"), arg("chunks"), arg("identical"), span_off, spans))

    def write_runs(self, grid_runs: int, spans: Any, tiles: Any, tasks: Any) -> list[_Launch]:
        """The launches writing spans, tiles and (unless ``tasks`` is None) tasks, a warp for
        each of at most ``grid_runs`` runs."""
        arg, i32, null = self.scratch.arg, np.int32, np.uint64(0)
        expansions, assign_off, assign_b, assign_h0 = self.assign
        out = [] if self.geo is None else [self._tile_spans(arg("span_off"), spans)]
        if grid_runs:
            out.append(_Launch(
                "plan_write_runs", _rows_grid(grid_runs),
                (DENSE if self.geo is None else null, i32(self.mask.num_kv_blocks),
                 i32(self.scan_blocks), self.kb, self.scan_bounds, i32(self.tile_rows),
                 self.totals, arg("run_row0"), arg("run_row1"), arg("span_off"),
                 arg("tile_off"), arg("task_off"), arg("nspans"), arg("chunks"), expansions,
                 assign_off, assign_b, assign_h0, *self.heavy, arg("key_start"), spans, tiles,
                 null if tasks is None else tasks)))
        return out

    @property
    def capacities(self) -> tuple[int, int, int]:
        """Most spans, tiles and tasks any mask of this geometry can make."""
        n_assign = int(self.assign[2].size)
        if self.geo is None:
            return _capacities(self.mask, self.n_scan, self.tile_rows, n_assign)
        # A tile's pieces: at most one per two of its blocks at each key block, and for each
        # stretch of blocks at most a span per two key blocks.
        n_kv, reach = self.mask.num_kv_blocks, self.geo.reach
        per_tile = min(self.overlap * n_kv, reach * (reach + 1) // 2 * ((n_kv + 1) // 2))
        return self.n_scan * per_tile, self.n_scan, n_assign * self.geo.per_bh

    @property
    def buffer_bytes(self) -> int:
        spans, tiles, tasks = self.capacities
        return 4 * (4 * spans + 6 * tiles + 8 * tasks)

    def sync_free(self, dense: Any) -> SyncFreePlan:
        """Buffers of the capacities, the launches kept for replanning, run once."""
        xp, i32 = self.xp, np.int32
        cap_spans, cap_tiles, cap_tasks = self.capacities
        spans = xp.empty((cap_spans, len(Span)), dtype=i32)
        tiles = xp.empty((cap_tiles, len(Tile)), dtype=i32)
        tasks = xp.empty((cap_tasks, len(Task)), dtype=i32)
        # write_runs: a warp per row, the most runs there can be.
        launches = tuple(self.first + self.write_runs(self.n_scan, spans, tiles, tasks))
        relaunch = _Relaunch(launches, self.scratch, xp)
        relaunch(dense)
        return SyncFreePlan(tiles=tiles, spans=spans, tasks=tasks, totals=self.totals,
                            tile_rows=self.tile_rows, block_n=self.block_n,
                            heads_per_task=self.heads_per_task, num_merged=self.num_merged,
                            relaunch=relaunch)

    def one_sync(self, dense: Any, split_ratio: float, min_split_chunks: int,
                 allow_split: bool) -> tuple[PhysicalTiles, TaskQueue]:
        """The counts read back once to size the arrays exactly and to apply the split rule
        (``tasks.build_task_queue``'s, on the same totals)."""
        xp, i32 = self.xp, np.int32
        for launch in self.first:
            launch(dense)
        counts = [int(x) for x in to_numpy(self.totals)]
        n_runs, n_spans, n_tiles = counts[Total.RUNS], counts[Total.SPANS], counts[Total.TILES]
        limit = split_limit(split_ratio, min_split_chunks, counts[Total.TASKS],
                            counts[Total.TASK_CHUNKS], self.in_flight)
        split = allow_split and bool(n_tiles) and counts[Total.MAX_CHUNKS] > limit
        spans = xp.empty((n_spans, len(Span)), dtype=i32)
        tiles = xp.empty((n_tiles, len(Tile)), dtype=i32)
        tasks = None if split else xp.empty((counts[Total.TASKS], len(Task)), dtype=i32)
        for launch in self.write_runs(n_runs, spans, tiles, tasks):
            launch(dense)
        pt = _physical_tiles(tiles, spans, self.tile_rows, self.block_n, n_runs,
                             self.num_merged)
        if split:
            return pt, self._split_on_host(tiles, spans, n_runs, split_ratio, min_split_chunks)
        return pt, TaskQueue(tasks=tasks, spans=spans, combine=_no_combine(xp), num_slots=0,
                             heads_per_task=self.heads_per_task, tile_rows=self.tile_rows)

    def _split_on_host(self, tiles: Any, spans: Any, n_runs: int, split_ratio: float,
                       min_split_chunks: int) -> TaskQueue:
        """Heavy tiles cut into parts by the general task organization (array operations on
        these tiles, which equal the general mapping's), on the host: the plan has waited for
        the GPU once already, the tiles and spans come back in two copies, and its hundred
        small operations take a fraction of a millisecond in numpy, whereas as CuPy launches,
        with their own synchronizations, they took milliseconds (docs/decisions.md)."""
        xp = self.xp
        batch, num_q_heads, num_kv_heads, batch_of, head_of = self.shape
        host = _physical_tiles(to_numpy(tiles), to_numpy(spans), self.tile_rows, self.block_n,
                               n_runs, self.num_merged)
        q = build_task_queue(host, batch=batch, num_q_heads=num_q_heads,
                             num_kv_heads=num_kv_heads, heads_per_task=self.heads_per_task,
                             batch_of=batch_of, head_of=head_of,
                             mask_batch_heads=self.mask.batch_heads, split_ratio=split_ratio,
                             min_split_chunks=min_split_chunks, in_flight=self.in_flight)
        return TaskQueue(tasks=xp.asarray(q.tasks), spans=xp.asarray(q.spans),
                         combine=xp.asarray(q.combine), num_slots=q.num_slots,
                         heads_per_task=q.heads_per_task, tile_rows=q.tile_rows)


def _rows_grid(warps: int) -> tuple[int]:
    """A warp per row (or run, or tile), 256 threads a block."""
    return ((warps * 32 + 255) // 256,)


def _scratch(xp: Any, n_scan: int, n_hist: int, n_bh: int) -> Workspace:
    """The planner kernels' scratch in one allocation (each allocation costs microseconds)."""
    i32, i64 = np.int32, np.int64
    return Workspace(xp, (("totals", i64, len(Total)), ("run_row0", i64, n_scan),
                          ("run_row1", i64, n_scan), ("span_off", i64, n_scan),
                          ("tile_off", i64, n_scan), ("task_off", i64, n_scan),
                          ("hist", i64, n_hist), ("key_start", i64, n_hist),
                          ("bh_run0", i64, n_bh + 1), ("heavy_runs", i64, n_scan),
                          ("nspans", i32, n_scan), ("chunks", i32, n_scan),
                          ("identical", np.uint8, n_scan)))
