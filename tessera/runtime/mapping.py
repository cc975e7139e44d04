"""Physical mapping: logical blocks -> physical tiles of the shape a kernel wants, mask preserved.

The mapping works per stored mask row ``(b, h, i)`` (one CSR row of the logical mask) in three
vectorized steps, identical in numpy and CuPy so a device mask is planned on the device:

1. **Key spans.** Adjacent selected key blocks are contiguous in tokens, so a row's selection
   becomes a few contiguous key spans ``[k0, k1)``, consumed BN keys at a time with the last
   chunk masked at token level.
2. **Groups (combine for free).** Consecutive query blocks with identical key sets form one
   contiguous query token range with one span list. This covers both *retain* and *combine*.
3. **Restricted merge (combine with a cost model).** Two adjacent groups that are each short
   enough to share a tile merge when they share keys and the masked work the merge adds is at
   most ``combine_threshold`` of their useful work. Each span then carries the query-token range
   it applies to (its *row restriction*); rows outside it are masked.

Finally each group is cut into tiles of ``tile_rows`` query tokens (*subdivide*: a 384-token block
becomes three 128-row tiles). Tiles of one group share its span list.

With ``align_tiles`` steps 3 and subdivide are replaced: tiles sit at multiples of
``tile_rows`` tokens whatever the block boundaries, and each carries the union of the key spans
of the runs it meets, every span restricted to the rows that select it (:func:`_aligned_tiles`).

A host mask that selects every block (a dense layer) skips the three steps: each head is one
group with one span over all its keys, which :func:`_whole_mask_tiles` writes by arithmetic (the
same tiles, tested array for array).

A device mask built from a dense block matrix takes a shortcut for steps 1 and 2: two kernels
(tessera/cuda/plan.cu) compute the per-row statistics and write the spans straight from the
matrix; when the cost model picks any restricted merge, the general path above runs instead.
Both paths give the same tiles (tested array for array on the GPU). The device planner
(``device_planner.py``) builds aligned tiles with its own kernel, ``plan_aligned_spans``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._array import array_module, offsets_from_counts, segment_ids
from ..capture import device_copy
from ..mask import BlockMask
from . import planner_launches as launches
from .planner_launches import device_bounds
from .queue import Span

__all__ = ["PhysicalTiles", "map_to_tiles", "device_bounds", "tiling_pairs", "key_walk_chunks",
           "aligned_tile_blocks", "aligned_geometry", "AlignedGeometry", "straddling_tiles",
           "selects_every_block", "device_dense_rows", "use_device_planner"]


@dataclass
class PhysicalTiles:
    """Tiles for every stored mask (batch, head), in the mask's array module.

    Tile arrays (length T): ``mask_bh`` (stored mask batch*H + head), ``q0``/``q1`` (query token
    range, ``q1 - q0 <= tile_rows``), ``span_begin``/``span_end`` (range into the span arrays),
    ``chunks`` (BN-key steps the tile costs). Span arrays (length S): ``k0``/``k1`` (key token
    range) and ``r0``/``r1`` (query tokens the span applies to; a restriction narrower than the
    tile only where a restricted merge happened, or in aligned tiles that straddle blocks).
    ``num_merged`` counts the restricted merges (aligned tiles: the tiles that straddle a query
    block boundary, :func:`straddling_tiles`).
    """

    tile_rows: int
    block_n: int
    mask_bh: Any
    q0: Any
    q1: Any
    span_begin: Any
    span_end: Any
    chunks: Any
    k0: Any
    k1: Any
    r0: Any
    r1: Any
    num_groups: int
    num_merged: int

    @property
    def num_tiles(self) -> int:
        return int(self.q0.size)

    @property
    def num_spans(self) -> int:
        return int(self.k0.size)


@dataclass
class _RowStats:
    """Per-entry and per-row facts the mapping needs, from one pass over the CSR entries."""

    entry_row: Any  # CSR row of each entry
    j: Any  # key block of each entry (int64)
    span_start: Any  # entry starts a key span (first of its row, or not adjacent to the previous)
    count: Any  # per row: selected key blocks
    key_tokens: Any  # per row: selected key tokens
    overlap_tokens: Any  # per row: key tokens also selected by the previous row (same head)
    identical: Any  # per row: same selection as the previous row of the same head


def _segment_last(first: Any, total: int, xp) -> Any:
    """Last index of each segment, given the (sorted) first index of every segment of a
    length-``total`` sequence that the segments tile."""
    tail = xp.full(min(1, int(first.size)), total, dtype=first.dtype)
    return xp.concatenate([first[1:], tail]) - 1


def _row_sum(values: Any, indptr: Any, xp) -> Any:
    csum = offsets_from_counts(values, xp)
    return csum[indptr[1:]] - csum[indptr[:-1]]


def _in_previous_row(mask: BlockMask, entry_row: Any, j: Any, xp) -> Any:
    """For each entry (row r, block j): is block j also selected in row r-1? (row -1: False)."""
    n_kv = mask.num_kv_blocks
    prev = xp.maximum(entry_row - 1, 0)
    if mask.dense_rows is not None:
        hit = mask.dense_rows[prev, j]
    else:
        keys = entry_row * n_kv + j  # sorted: rows ascending, blocks ascending within a row
        probe = prev * n_kv + j
        if xp is np and keys.size and int(keys[-1]) < 64 * 2**20:
            hit = np.isin(probe, keys, kind="table")  # a bitmap lookup, O(n)
        else:
            pos = xp.minimum(xp.searchsorted(keys, probe), max(keys.size - 1, 0))
            hit = keys[pos] == probe if keys.size else probe < 0
    return hit & (entry_row > 0)


def _entries(mask: BlockMask, xp) -> tuple[Any, Any, Any]:
    """Per CSR entry: its row, its key block (int64), and whether it starts a key span."""
    indptr, nnz = mask.indptr, mask.indices.size
    entry_row = segment_ids(indptr, nnz, xp)
    j = mask.indices.astype(np.int64)
    span_start = xp.ones(nnz, dtype=bool)
    if nnz > 1:
        span_start[1:] = (j[1:] != j[:-1] + 1) | (entry_row[1:] != entry_row[:-1])
    return entry_row, j, span_start


def _row_stats(mask: BlockMask, xp) -> _RowStats:
    indptr = mask.indptr
    n_rows = indptr.size - 1
    klen = xp.asarray(np.diff(mask.kv_bounds))
    entry_row, j, span_start = _entries(mask, xp)
    in_prev = _in_previous_row(mask, entry_row, j, xp)
    count = xp.diff(indptr)
    kt = klen[j]
    overlap_count = _row_sum(in_prev.astype(np.int64), indptr, xp)
    first_of_head = (xp.arange(n_rows) % mask.num_q_blocks) == 0
    prev_count = xp.concatenate([xp.zeros(1, dtype=count.dtype), count[:-1]])
    identical = ~first_of_head & (count == prev_count) & (overlap_count == count)
    overlap_tokens = xp.where(first_of_head, 0, _row_sum(kt * in_prev, indptr, xp))
    return _RowStats(entry_row, j, span_start, count, _row_sum(kt, indptr, xp), overlap_tokens,
                     identical)


def _runs(stats: _RowStats, n_rows: int, n_q: int, qb: Any, xp) -> tuple[Any, Any, Any, Any]:
    """Maximal runs of identical consecutive rows: first row, mask (b, h), query token range."""
    run_first = xp.nonzero(~stats.identical)[0]
    run_last = _segment_last(run_first, n_rows, xp)
    return run_first, run_first // n_q, qb[run_first % n_q], qb[run_last % n_q + 1]


def _restricted_pairs(stats: _RowStats, run_first: Any, run_q0: Any, run_q1: Any,
                      run_bh: Any, tile_rows: int, threshold: float, xp) -> Any:
    """Choose pairs of adjacent short runs to merge; returns a bool per run: 'merges with next'.

    Rows within a run are identical, so the overlap of run a with run a+1 is the overlap of
    run a+1's first row with the row before it, already counted in ``stats``.
    """
    n_runs = run_first.size
    take = xp.zeros(n_runs, dtype=bool)
    if n_runs < 2:
        return take
    rows = (run_q1 - run_q0).astype(np.float64)
    ra, rb = rows[:-1], rows[1:]
    keys_a = stats.key_tokens[run_first[:-1]].astype(np.float64)
    keys_b = stats.key_tokens[run_first[1:]].astype(np.float64)
    keys_ab = stats.overlap_tokens[run_first[1:]].astype(np.float64)
    useful = ra * keys_a + rb * keys_b
    waste = (ra + rb) * (keys_a + keys_b - keys_ab) - useful
    fits = (run_bh[:-1] == run_bh[1:]) & (ra + rb <= tile_rows)
    ok = ((keys_ab > 0) & (waste <= threshold * useful)) | ((keys_a == 0) & (keys_b == 0))
    g = fits & ok
    if not bool(g.any()):
        return take
    # In each chain of consecutive good pairs take every other one, so no run merges twice.
    idx = xp.arange(n_runs - 1)
    chain_start = g & ~xp.concatenate([xp.zeros(1, dtype=bool), g[:-1]])
    starts = xp.nonzero(chain_start)[0]
    last_start = starts[xp.clip(xp.cumsum(chain_start) - 1, 0, None)]
    take[:-1] = g & (((idx - last_start) % 2) == 0)
    return take


def map_to_tiles(mask: BlockMask, tile_rows: int, block_n: int,
                 combine_threshold: float = 0.3, pack_keys: bool = False,
                 align_tiles: bool = False) -> PhysicalTiles:
    """Map a logical block mask onto physical tiles of ``tile_rows`` query tokens.

    ``block_n`` only sets how tile cost is counted (BN-key chunks per span, or with
    ``pack_keys`` per tile: its keys end to end). ``combine_threshold`` bounds the masked work a
    restricted merge may add (0 disables merging groups whose key sets differ; identical
    consecutive blocks always combine). ``align_tiles``: tiles at multiples of ``tile_rows``
    tokens instead (:func:`_aligned_tiles`).
    """
    xp = mask.xp
    n_q = mask.num_q_blocks
    n_rows = mask.batch_heads[0] * mask.batch_heads[1] * n_q
    qb = device_bounds(mask.q_bounds, xp)
    kb = device_bounds(mask.kv_bounds, xp)
    if align_tiles:
        stats = _row_stats(mask, xp)
        return _aligned_tiles(mask, stats, _runs(stats, n_rows, n_q, qb, xp), kb, tile_rows,
                              block_n, pack_keys, xp)
    if xp is np and selects_every_block(mask):
        return _whole_mask_tiles(mask, qb, kb, tile_rows, block_n, pack_keys, xp)
    dense = device_dense_rows(mask) if use_device_planner(xp) else None
    if dense is not None:
        tiles, runs = _map_dense_on_device(mask, dense, tile_rows, block_n, combine_threshold,
                                           pack_keys)
        if tiles is not None:
            return tiles
        # Restricted merges: keep the kernel's row statistics and runs; only the per-entry
        # arrays the merged spans need come from the CSR.
        stats, (run_first, run_bh, run_q0, run_q1), merge_next = runs
        stats = _RowStats(*_entries(mask, xp), stats.count, stats.key_tokens,
                          stats.overlap_tokens, stats.identical)
    else:
        stats = _row_stats(mask, xp)
        # Step 2: runs of identical consecutive rows.
        run_first, run_bh, run_q0, run_q1 = _runs(stats, n_rows, n_q, qb, xp)
        # Step 3: restricted merges of adjacent short runs.
        merge_next = _restricted_pairs(stats, run_first, run_q0, run_q1, run_bh, tile_rows,
                                       combine_threshold, xp)
    n_runs = int(run_first.size)
    merged_into_prev = xp.concatenate([xp.zeros(1, dtype=bool), merge_next[:-1]])
    num_merged = int(merge_next.sum())
    if num_merged:
        run_group = xp.cumsum(~merged_into_prev) - 1
        group_first_run = xp.nonzero(~merged_into_prev)[0]
    else:
        run_group = group_first_run = xp.arange(n_runs)
    num_groups = int(group_first_run.size)
    group_last_run = _segment_last(group_first_run, n_runs, xp)
    group_q0 = run_q0[group_first_run]
    group_q1 = run_q1[group_last_run]
    group_bh = run_bh[group_first_run]

    e_j, e_run, e_start = _run_entries(stats, run_first, xp)
    if num_merged:
        k0, k1, r0, r1, s_group = _merged_spans(e_j, e_run, run_group, merged_into_prev,
                                                run_q0, run_q1, group_q0, group_q1, kb, mask, xp)
    else:
        # Step 1: spans = maximal runs of adjacent key blocks within a row.
        first = xp.nonzero(e_start)[0]
        last = _segment_last(first, e_j.size, xp)
        s_group = e_run[first]
        k0, k1 = kb[e_j[first]], kb[e_j[last] + 1]
        r0, r1 = group_q0[s_group], group_q1[s_group]
    g_span_off, g_chunks = _owned_spans(s_group, num_groups, k0, k1, block_n, pack_keys, xp)
    return _subdivide(group_q0, group_q1, group_bh, g_span_off, g_chunks, k0, k1, r0, r1,
                      tile_rows, block_n, num_merged, xp)


def selects_every_block(mask: BlockMask) -> bool:
    """Whether ``mask`` selects every (query block, key block) pair of every stored head (a
    dense layer): one count, a scalar read back for a device mask."""
    total = int(np.prod(mask.shape, dtype=np.int64))
    return total > 0 and mask.nnz == total


def _whole_mask_tiles(mask: BlockMask, qb: Any, kb: Any, tile_rows: int, block_n: int,
                      pack_keys: bool, xp) -> PhysicalTiles:
    """The tiles of a mask that selects every block, by arithmetic: each head's rows are one
    run of identical rows (one group) with one span over all its keys -- what the three steps
    find, without their passes over every selected block (a dense layer of Wan-1.3B has
    786,432)."""
    n_bh = mask.batch_heads[0] * mask.batch_heads[1]
    owner = xp.arange(n_bh, dtype=np.int64)
    q0 = xp.full(n_bh, int(qb[0]), dtype=np.int64)
    q1 = xp.full(n_bh, int(qb[-1]), dtype=np.int64)
    k0 = xp.full(n_bh, int(kb[0]), dtype=np.int64)
    k1 = xp.full(n_bh, int(kb[-1]), dtype=np.int64)
    span_off, chunks = _owned_spans(owner, n_bh, k0, k1, block_n, pack_keys, xp)
    return _subdivide(q0, q1, owner, span_off, chunks, k0, k1, q0, q1, tile_rows, block_n, 0, xp)


def _run_entries(stats: _RowStats, run_first: Any, xp) -> tuple[Any, Any, Any]:
    """The CSR entries that define spans -- those of each run's first row (rows of a run are
    identical; all entries when no two consecutive rows are, the common case for dynamic
    masks): their key blocks, runs, and span starts."""
    e_j, e_row, e_start = stats.j, stats.entry_row, stats.span_start
    n_rows = int(stats.identical.size)
    if int(run_first.size) != n_rows:
        is_run_first = xp.zeros(n_rows, dtype=bool)
        is_run_first[run_first] = True
        keep = is_run_first[e_row]
        e_j, e_row, e_start = e_j[keep], e_row[keep], e_start[keep]
    row_run = xp.cumsum(~stats.identical) - 1  # run of each row
    return e_j, row_run[e_row], e_start


def _owned_spans(s_owner: Any, n_owners: int, k0: Any, k1: Any, block_n: int,
                 pack_keys: bool, xp) -> tuple[Any, Any]:
    """For spans sorted by owner (a group, or an aligned tile): each owner's span offsets
    (length n_owners + 1) and its cost in key chunks -- its spans' chunks, or with
    ``pack_keys`` its keys end to end."""
    counts = xp.bincount(s_owner, minlength=n_owners) if s_owner.size else \
        xp.zeros(n_owners, dtype=np.int64)
    span_off = offsets_from_counts(counts, xp)
    s_cost = (k1 - k0) if pack_keys else (k1 - k0 + block_n - 1) // block_n
    s_cost_off = offsets_from_counts(s_cost, xp)
    chunks = s_cost_off[span_off[1:]] - s_cost_off[span_off[:-1]]
    if pack_keys:
        chunks = (chunks + block_n - 1) // block_n
    return span_off, chunks


def _aligned_tiles(mask: BlockMask, stats: _RowStats, runs: tuple[Any, Any, Any, Any], kb: Any,
                   tile_rows: int, block_n: int, pack_keys: bool, xp) -> PhysicalTiles:
    """Tiles at multiples of ``tile_rows`` query tokens of each mask (batch, head), straddling
    query-block boundaries: for blocks that do not fill whole tiles (variable clusters of ~150
    tokens) each block's last tile would otherwise run mostly empty.

    A tile's spans are the union of the key blocks of the runs (of identical rows) it meets. A
    key block that consecutive runs of the tile all select is one piece restricted to their
    rows; pieces of adjacent key blocks with the same runs join into one span. Every (row, key)
    pair the mask selects is in exactly one span, so the restriction keeps the mask exact;
    what a tile costs is its union's chunks over all its rows (``pack_keys``: its keys end to
    end).
    """
    run_first, run_bh, run_q0, run_q1 = runs
    lq = int(mask.seq_len_q)
    per_bh = -(-lq // tile_rows)
    # (run, tile) pairs: every tile a run meets, in run order (so also in tile order).
    t_lo = run_q0 // tile_rows
    n_rt = (run_q1 - 1) // tile_rows - t_lo + 1
    rt_off = offsets_from_counts(n_rt, xp)
    n_pairs = int(rt_off[-1])
    rt_run = segment_ids(rt_off, n_pairs, xp)
    rt_tile = run_bh[rt_run] * per_bh + t_lo[rt_run] + (xp.arange(n_pairs) - rt_off[rt_run])
    # Entries of each run's first row, expanded over its tiles.
    e_j, e_run, _ = _run_entries(stats, run_first, xp)
    e_off = offsets_from_counts(n_rt[e_run], xp)
    n_ex = int(e_off[-1])
    x_entry = segment_ids(e_off, n_ex, xp)
    x_pair = rt_off[e_run[x_entry]] + (xp.arange(n_ex) - e_off[x_entry])
    x_tile, x_run, x_j = rt_tile[x_pair], e_run[x_entry], e_j[x_entry]
    # Sort keys count runs from each tile's first (fewer than tile_rows: runs are non-empty);
    # pairs come in tile order, so a tile's first pair holds its first run.
    n_kv = mask.num_kv_blocks
    n_tiles = int(mask.batch_heads[0] * mask.batch_heads[1]) * per_bh
    tile_start = xp.ones(n_pairs, dtype=bool)
    tile_start[1:] = rt_tile[1:] != rt_tile[:-1]
    tile_first_run = xp.zeros(n_tiles, dtype=np.int64)
    tile_first_run[rt_tile[tile_start]] = rt_run[tile_start]
    x_local = x_run - tile_first_run[x_tile]
    # Pieces: per (tile, key block), maximal stretches of consecutive runs selecting it.
    order = xp.argsort((x_tile * n_kv + x_j) * tile_rows + x_local)
    x_tile, x_run, x_j = x_tile[order], x_run[order], x_j[order]
    start = xp.ones(n_ex, dtype=bool)
    if n_ex > 1:
        start[1:] = (x_tile[1:] != x_tile[:-1]) | (x_j[1:] != x_j[:-1]) | \
            (x_run[1:] != x_run[:-1] + 1)
    first = xp.nonzero(start)[0]
    last = _segment_last(first, n_ex, xp)
    p_tile, p_j, p_lo, p_hi = x_tile[first], x_j[first], x_run[first], x_run[last]
    # Spans: pieces of adjacent key blocks serving the same runs of the same tile.
    n_p = int(first.size)
    lo, hi = p_lo - tile_first_run[p_tile], p_hi - tile_first_run[p_tile]
    order = xp.argsort(((p_tile * tile_rows + lo) * tile_rows + hi) * n_kv + p_j)
    p_tile, p_j, p_lo, p_hi = p_tile[order], p_j[order], p_lo[order], p_hi[order]
    start = xp.ones(n_p, dtype=bool)
    if n_p > 1:
        start[1:] = (p_tile[1:] != p_tile[:-1]) | (p_lo[1:] != p_lo[:-1]) | \
            (p_hi[1:] != p_hi[:-1]) | (p_j[1:] != p_j[:-1] + 1)
    first = xp.nonzero(start)[0]
    last = _segment_last(first, n_p, xp)
    s_tile = p_tile[first]
    k0, k1 = kb[p_j[first]], kb[p_j[last] + 1]
    t_row0 = (s_tile % per_bh) * tile_rows
    r0 = xp.maximum(run_q0[p_lo[first]], t_row0)
    r1 = xp.minimum(run_q1[p_hi[last]], xp.minimum(t_row0 + tile_rows, lq))
    # Every tile of every mask (batch, head) exists, with or without spans (empty rows are
    # written too).
    t_span_off, t_chunks = _owned_spans(s_tile, n_tiles, k0, k1, block_n, pack_keys, xp)
    tiles = xp.arange(n_tiles, dtype=np.int64)
    t_q0 = (tiles % per_bh) * tile_rows
    i32 = np.int32
    return PhysicalTiles(
        tile_rows=tile_rows, block_n=block_n, mask_bh=(tiles // per_bh).astype(i32),
        q0=t_q0.astype(i32), q1=xp.minimum(t_q0 + tile_rows, lq).astype(i32),
        span_begin=t_span_off[:-1].astype(i32), span_end=t_span_off[1:].astype(i32),
        chunks=t_chunks.astype(i32), k0=k0.astype(i32), k1=k1.astype(i32), r0=r0.astype(i32),
        r1=r1.astype(i32), num_groups=n_tiles,  # each tile has its own spans
        num_merged=straddling_tiles(mask, tile_rows))


# Most query blocks an aligned tile may meet for :func:`tiling_pairs` to estimate it: beyond
# that the blocks are far smaller than a tile and straddling them is the plain tiling's job
# (consecutive identical blocks combine there anyway).
ALIGNED_ESTIMATE_MAX_BLOCKS = 16


def aligned_tile_blocks(q_bounds: np.ndarray, tile_rows: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The aligned tiles of a query geometry (host int64 arrays, one entry a tile of a mask
    (batch, head)): their rows [t0, t1) -- multiples of ``tile_rows``, the last one short --
    and the first and last query blocks each meets, lo and hi (bounds are strictly
    increasing: no block is empty)."""
    qb = np.asarray(q_bounds, dtype=np.int64)
    lq = int(qb[-1])
    t0 = np.arange(0, lq, tile_rows, dtype=np.int64)
    t1 = np.minimum(t0 + tile_rows, lq)
    lo = np.searchsorted(qb, t0, side="right") - 1
    hi = np.searchsorted(qb, t1, side="left") - 1
    return t0, t1, lo, hi


@dataclass(frozen=True)
class AlignedGeometry:
    """Aligned tiles of one query geometry (``Regime.align_tiles``), for the device planner and
    the pair estimate: ``per_bh`` tiles of ``tile_rows`` rows a mask (batch, head), the query
    blocks each meets (``lo``/``hi``, int32 in the array module), their bounds as a virtual
    block geometry (``bounds``: multiples of tile_rows, int64), the most blocks one tile meets
    (``reach``) and how many tiles meet more than one (``straddling``)."""

    per_bh: int
    reach: int
    straddling: int
    lo: Any
    hi: Any
    bounds: Any


def aligned_geometry(q_bounds: np.ndarray, tile_rows: int, xp) -> AlignedGeometry:
    """The aligned tiles of a query geometry; on the device made and copied once per geometry
    (requests of a model reuse a few)."""
    qb = np.asarray(q_bounds, dtype=np.int64)

    def make():
        t0, _, lo, hi = aligned_tile_blocks(qb, tile_rows)
        return AlignedGeometry(per_bh=int(t0.size), reach=int((hi - lo).max(initial=0)) + 1,
                               straddling=int((hi > lo).sum()),
                               lo=xp.asarray(lo.astype(np.int32)),
                               hi=xp.asarray(hi.astype(np.int32)),
                               bounds=xp.asarray(np.r_[t0, qb[-1]].astype(np.int64)))

    if xp is np:
        return make()
    return device_copy(("aligned", qb.tobytes(), tile_rows), make, xp)


def straddling_tiles(mask: BlockMask, tile_rows: int) -> int:
    """How many aligned tiles of ``mask`` (over all its batch heads) meet more than one query
    block -- the aligned tiling's restricted merges, by geometry alone (both planners report it
    the same way, whichever rows the mask selects)."""
    straddling = aligned_geometry(mask.q_bounds, tile_rows, mask.xp).straddling
    return straddling * int(mask.batch_heads[0] * mask.batch_heads[1])


def tiling_pairs(mask: BlockMask, tile_rows: int) -> tuple[int, int] | None:
    """(query, key) token pairs the plain and the aligned tiling of ``mask`` compute with
    ``tile_rows``-row tiles, estimated from its dense block rows without building either: plain
    tiles cover each block's rows rounded up to whole tiles against the block's keys; an aligned
    tile covers its rows against the union of the keys of the blocks it meets. Key chunks are
    not rounded and identical neighbours are not combined (both tilings would share those).
    One scalar pair comes back from a device mask (a synchronization). None when the blocks
    are too small for the estimate (:data:`ALIGNED_ESTIMATE_MAX_BLOCKS`) or the dense rows
    too large to materialize."""
    xp = mask.xp
    n_q, n_kv = mask.num_q_blocks, mask.num_kv_blocks
    if n_q == 0 or n_kv == 0:
        return None
    geo = aligned_geometry(mask.q_bounds, tile_rows, xp)
    if geo.reach > ALIGNED_ESTIMATE_MAX_BLOCKS:
        return None
    if xp is not np:
        dense = device_dense_rows(mask)
        return None if dense is None else launches.tiling_pairs(
            mask, _uint8_rows(dense, n_kv), geo.per_bh, geo.lo, geo.hi, tile_rows)
    dense = mask.to_dense().reshape(-1, n_q, n_kv)
    # float64 products are exact here (pairs < 2^53) and take the BLAS path.
    kv_tokens = np.diff(np.asarray(mask.kv_bounds, dtype=np.float64))
    qb = np.asarray(mask.q_bounds, dtype=np.int64)
    block_rows = (-(-np.diff(qb) // tile_rows) * tile_rows).astype(np.float64)
    plain = (dense.astype(np.float64) @ kv_tokens * block_rows).sum()
    union = dense[:, geo.lo, :]  # [bh, tiles, n_kv]: the keys of the blocks each tile meets
    for r in range(1, geo.reach):
        union |= dense[:, np.minimum(geo.lo + r, geo.hi), :]  # (its last block again past the end)
    tile_tokens = np.diff(geo.bounds).astype(np.float64)
    aligned = (union.astype(np.float64) @ kv_tokens * tile_tokens).sum()
    return round(float(plain)), round(float(aligned))


def key_walk_chunks(mask: BlockMask, block_n: int, tile_rows: int) -> tuple[int, int] | None:
    """BN-key chunks the plain tiling of ``mask`` walks span by span and with its keys packed
    end to end (``Regime.pack_keys``), each mask row weighted by its ``tile_rows``-row tiles:
    how much of the key walk packing saves (a span of a few short blocks costs whole chunks
    span by span). A device mask's rows go through plan_row_stats once and one scalar pair
    comes back (a synchronization). None when the dense rows are too large to materialize."""
    n_q, n_kv = mask.num_q_blocks, mask.num_kv_blocks
    if n_q == 0 or n_kv == 0:
        return None
    if mask.xp is not np:
        dense = device_dense_rows(mask)
        return None if dense is None else launches.key_walk_chunks(
            mask, _uint8_rows(dense, n_kv), block_n, tile_rows)
    tiles = -(-np.diff(np.asarray(mask.q_bounds, dtype=np.int64)) // tile_rows)  # per q block
    dense = mask.to_dense().reshape(-1, n_kv)
    kv = np.diff(np.asarray(mask.kv_bounds, dtype=np.int64))
    tok = dense * kv  # key tokens per selected block
    c = np.cumsum(tok, axis=1)
    before = np.zeros_like(dense)
    before[:, 1:] = dense[:, :-1]
    after = np.zeros_like(dense)
    after[:, :-1] = dense[:, 1:]
    # each span's first key token: the running prefix where a span starts, carried to its end
    start = np.maximum.accumulate(np.where(dense & ~before, c - tok, 0), axis=1)
    span = np.where(dense & ~after, -(-(c - start) // block_n), 0).sum(1)
    packed = -(-c[:, -1] // block_n)
    w = np.tile(tiles, dense.shape[0] // n_q)
    return int((span * w).sum()), int((packed * w).sum())


def _subdivide(group_q0, group_q1, group_bh, g_span_off, g_chunks, k0, k1, r0, r1,
               tile_rows: int, block_n: int, num_merged: int, xp) -> PhysicalTiles:
    """Cut each group into tiles of ``tile_rows`` query tokens sharing the group's spans."""
    num_groups = int(group_q0.size)
    g_tiles = (group_q1 - group_q0 + tile_rows - 1) // tile_rows
    if bool((g_tiles == 1).all()):
        t_group = xp.arange(num_groups)
        t_q0, t_q1 = group_q0, group_q1
    else:
        t_off = offsets_from_counts(g_tiles, xp)
        n_tiles = int(t_off[-1])
        t_group = segment_ids(t_off, n_tiles, xp)
        t_q0 = group_q0[t_group] + (xp.arange(n_tiles, dtype=np.int64) - t_off[t_group]) * tile_rows
        t_q1 = xp.minimum(t_q0 + tile_rows, group_q1[t_group])

    i32 = np.int32
    return PhysicalTiles(
        tile_rows=tile_rows, block_n=block_n,
        mask_bh=group_bh[t_group].astype(i32), q0=t_q0.astype(i32), q1=t_q1.astype(i32),
        span_begin=g_span_off[:-1][t_group].astype(i32),
        span_end=g_span_off[1:][t_group].astype(i32), chunks=g_chunks[t_group].astype(i32),
        k0=k0.astype(i32), k1=k1.astype(i32), r0=r0.astype(i32), r1=r1.astype(i32),
        num_groups=num_groups, num_merged=num_merged)


# Largest dense block matrix (bytes) the device planner materializes for a mask that arrives as
# CSR: scattering it costs one memset and one scatter, far less than the ~40 array operations
# of the CSR path (e.g. 83 MB for HunyuanVideo's 24 heads at 64-token blocks).
DENSE_ON_DEVICE_LIMIT = 1 << 29


def _uint8_rows(dense_rows: Any, n_kv: int) -> Any:
    """Dense block rows as the planner kernels read them: contiguous uint8 ``[rows, nKB]``."""
    xp = array_module(dense_rows)
    return xp.ascontiguousarray(dense_rows).view(np.uint8).reshape(-1, n_kv)


def use_device_planner(xp) -> bool:
    """Device masks take the planner kernels (tests substitute numpy versions of them)."""
    return xp is not np


def device_dense_rows(mask: BlockMask) -> Any:
    """The mask's dense block rows ``[rows, nKB]`` on the device (its own when built from a
    dense matrix, else scattered from its CSR), or None when that would exceed the limit."""
    if mask.dense_rows is not None:
        return mask.dense_rows
    n_rows = mask.indptr.size - 1
    if n_rows * mask.num_kv_blocks > DENSE_ON_DEVICE_LIMIT:
        return None
    return mask.to_dense().reshape(n_rows, mask.num_kv_blocks)


def _map_dense_on_device(mask: BlockMask, dense_rows: Any, tile_rows: int, block_n: int,
                         combine_threshold: float,
                         pack_keys: bool = False) -> tuple[PhysicalTiles | None, Any]:
    """The device planner: row statistics and spans by two kernels over the dense block matrix
    (tessera/cuda/plan.cu), the rest on per-row arrays. Returns ``(tiles, None)``, or, when a
    restricted merge is chosen, ``(None, (row stats, runs, merge_next))`` for the general path
    to finish from (it needs the per-entry arrays the merged spans are cut from)."""

    xp = mask.xp
    dense = xp.ascontiguousarray(dense_rows).view(np.uint8)
    rows = launches.row_stats(mask, dense, block_n, pack_keys)
    nspans, chunks = rows.nspans, rows.chunks
    stats = _RowStats(None, None, None, rows.count, rows.key_tokens, rows.overlap_tokens,
                      rows.identical.view(bool))
    n_rows, n_kv = dense.shape
    n_q = mask.num_q_blocks
    qb = device_bounds(mask.q_bounds, xp)
    runs = _runs(stats, n_rows, n_q, qb, xp)
    run_first, run_bh, run_q0, run_q1 = runs
    # At threshold 0 no pair of runs can merge (a merge adding no masked work needs equal key
    # sets, i.e. identical rows, which are one run already): skip the cost model and its sync.
    if combine_threshold > 0:
        merge_next = _restricted_pairs(stats, run_first, run_q0, run_q1, run_bh, tile_rows,
                                       combine_threshold, xp)
        if bool(merge_next.any()):
            return None, (stats, runs, merge_next)
    g_span_off = offsets_from_counts(nspans[run_first].astype(np.int64), xp)
    n_spans = int(g_span_off[-1])
    span_dst = xp.full(n_rows, -1, dtype=np.int64)
    span_dst[run_first] = g_span_off[:-1]
    row_q0 = xp.zeros(n_rows, dtype=np.int64)
    row_q1 = xp.zeros(n_rows, dtype=np.int64)
    row_q0[run_first] = run_q0
    row_q1[run_first] = run_q1
    spans = xp.empty((n_spans, len(Span)), dtype=np.int32)
    launches.write_group_spans(mask, dense, span_dst, nspans, row_q0, row_q1, spans)
    g_chunks = chunks[run_first].astype(np.int64)
    return _subdivide(run_q0, run_q1, run_bh, g_span_off, g_chunks, spans[:, Span.K_START],
                      spans[:, Span.K_END], spans[:, Span.R_START], spans[:, Span.R_END],
                      tile_rows, block_n, 0, xp), None


def _merged_spans(e_j, e_run, run_group, merged_into_prev, run_q0, run_q1, group_q0, group_q1,
                  kb, mask, xp):
    """Spans of groups where restricted merges happened: the union of the two runs' key blocks,
    each labelled with the run(s) it serves, cut where the label or adjacency changes."""
    e_group = run_group[e_run]
    e_cls = xp.where(merged_into_prev[e_run], 2, 1).astype(np.int8)
    order = xp.argsort(e_group * mask.num_kv_blocks + e_j, kind="stable")
    e_j, e_group, e_cls, e_run = e_j[order], e_group[order], e_cls[order], e_run[order]
    total = int(e_j.size)
    dup = xp.zeros(total, dtype=bool)
    if total > 1:
        dup[1:] = (e_group[1:] == e_group[:-1]) & (e_j[1:] == e_j[:-1])
    e_cls[xp.nonzero(dup)[0] - 1] = 3  # the key block serves both runs
    keep = ~dup
    e_j, e_group, e_cls, e_run = e_j[keep], e_group[keep], e_cls[keep], e_run[keep]
    total = int(e_j.size)
    new_span = xp.ones(total, dtype=bool)
    if total > 1:
        new_span[1:] = ((e_group[1:] != e_group[:-1]) | (e_j[1:] != e_j[:-1] + 1)
                        | (e_cls[1:] != e_cls[:-1]))
    first = xp.nonzero(new_span)[0]
    last = _segment_last(first, total, xp)
    s_group, s_cls, s_run = e_group[first], e_cls[first], e_run[first]
    k0, k1 = kb[e_j[first]], kb[e_j[last] + 1]
    r0 = xp.where(s_cls == 3, group_q0[s_group], run_q0[s_run])
    r1 = xp.where(s_cls == 3, group_q1[s_group], run_q1[s_run])
    return k0, k1, r0, r1, s_group
