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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._array import offsets_from_counts, segment_ids
from ..mask import BlockMask

__all__ = ["PhysicalTiles", "map_to_tiles"]


@dataclass
class PhysicalTiles:
    """Tiles for every stored mask (batch, head), in the mask's array module.

    Tile arrays (length T): ``mask_bh`` (stored mask batch*H + head), ``q0``/``q1`` (query token
    range, ``q1 - q0 <= tile_rows``), ``span_begin``/``span_end`` (range into the span arrays),
    ``chunks`` (BN-key steps the tile costs). Span arrays (length S): ``k0``/``k1`` (key token
    range) and ``r0``/``r1`` (query tokens the span applies to; a restriction narrower than the
    tile only where a restricted merge happened).
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


def _runs_of_identical_rows(mask: BlockMask, xp) -> tuple[Any, Any]:
    """First and last CSR row of each maximal run of consecutive identical rows (within a head)."""
    indptr, indices = mask.indptr, mask.indices
    n_q = mask.num_q_blocks
    n_rows = indptr.size - 1
    counts = xp.diff(indptr)
    prev_counts = xp.concatenate([xp.zeros(1, dtype=counts.dtype), counts[:-1]])
    first_of_head = (xp.arange(n_rows) % n_q) == 0
    same_count = (counts == prev_counts) & ~first_of_head
    nnz = indices.size
    if nnz:
        entry_row = segment_ids(indptr, nnz, xp)
        # The entry at the same position in the previous row; only meaningful where counts match.
        partner = xp.arange(nnz, dtype=np.int64) - prev_counts[entry_row]
        partner = xp.clip(partner, 0, nnz - 1)
        mismatch = same_count[entry_row] & (indices != indices[partner])
        csum = offsets_from_counts(mismatch.astype(np.int64), xp)
        row_mismatch = csum[indptr[1:]] - csum[indptr[:-1]]
        same = same_count & (row_mismatch == 0)
    else:
        same = same_count
    starts = xp.nonzero(~same)[0]
    ends = xp.concatenate([starts[1:], xp.full(1, n_rows, dtype=starts.dtype)]) - 1
    return starts, ends


def _restricted_pairs(mask: BlockMask, run_first_row: Any, run_q0: Any, run_q1: Any,
                      run_bh: Any, tile_rows: int, threshold: float, xp) -> Any:
    """Choose pairs of adjacent short runs to merge; returns a bool per run: 'merges with next'."""
    n_runs = run_first_row.size
    take = xp.zeros(n_runs, dtype=bool)
    if n_runs < 2:
        return take
    rows = run_q1 - run_q0
    cand = ((run_bh[:-1] == run_bh[1:]) & (rows[:-1] + rows[1:] <= tile_rows))
    cand_idx = xp.nonzero(cand)[0]
    if cand_idx.size == 0:
        return take
    indptr, indices = mask.indptr, mask.indices
    klen = xp.asarray(np.diff(mask.kv_bounds))
    n_kv = mask.num_kv_blocks

    def entries(rows_of_runs):
        start = indptr[rows_of_runs]
        cnt = indptr[rows_of_runs + 1] - start
        off = offsets_from_counts(cnt, xp)
        total = int(off[-1])
        seg = segment_ids(off, total, xp)
        pos = start[seg] + (xp.arange(total, dtype=np.int64) - off[seg])
        return seg, indices[pos].astype(np.int64), cnt

    # Keys of A (first run of the pair) and of B, keyed by (pair, key block) for a membership test.
    seg_a, j_a, _ = entries(run_first_row[cand_idx])
    seg_b, j_b, _ = entries(run_first_row[cand_idx + 1])
    key_a = seg_a * n_kv + j_a  # sorted: pairs in order, blocks sorted within a row
    key_b = seg_b * n_kv + j_b
    n_c = cand_idx.size
    keys_a = xp.bincount(seg_a, weights=klen[j_a], minlength=n_c)
    keys_b = xp.bincount(seg_b, weights=klen[j_b], minlength=n_c)
    if key_a.size and key_b.size:
        pos = xp.clip(xp.searchsorted(key_a, key_b), 0, key_a.size - 1)
        shared = key_a[pos] == key_b
        keys_ab = xp.bincount(seg_b, weights=klen[j_b] * shared, minlength=n_c)
    else:
        keys_ab = xp.zeros(n_c, dtype=np.float64)
    ra = rows[cand_idx].astype(np.float64)
    rb = rows[cand_idx + 1].astype(np.float64)
    useful = ra * keys_a + rb * keys_b
    union = keys_a + keys_b - keys_ab
    waste = (ra + rb) * union - useful
    ok = (keys_ab > 0) & (waste <= threshold * useful)
    ok = ok | ((keys_a == 0) & (keys_b == 0))  # two empty groups: merging costs nothing
    good = xp.zeros(n_runs, dtype=bool)
    good[cand_idx[ok]] = True
    # In each chain of consecutive good pairs take every other one, so no run merges twice.
    g = good[:-1]
    idx = xp.arange(n_runs - 1)
    chain_start = g & ~xp.concatenate([xp.zeros(1, dtype=bool), g[:-1]])
    starts = xp.nonzero(chain_start)[0]
    if starts.size == 0:
        return take
    last_start = starts[xp.clip(xp.cumsum(chain_start) - 1, 0, None)]
    take[:-1] = g & (((idx - last_start) % 2) == 0)
    return take


def map_to_tiles(mask: BlockMask, tile_rows: int, block_n: int,
                 combine_threshold: float = 0.3) -> PhysicalTiles:
    """Map a logical block mask onto physical tiles of ``tile_rows`` query tokens.

    ``block_n`` only sets how tile cost is counted (BN-key chunks per span). ``combine_threshold``
    bounds the masked work a restricted merge may add (0 disables merging groups whose key sets
    differ; identical consecutive blocks always combine).
    """
    xp = mask.xp
    n_q = mask.num_q_blocks
    qb = xp.asarray(mask.q_bounds)
    kb = xp.asarray(mask.kv_bounds)

    # Step 2: groups of identical consecutive rows (step 1's spans are built per group below).
    run_first, run_last = _runs_of_identical_rows(mask, xp)
    run_bh = run_first // n_q
    run_q0 = qb[run_first % n_q]
    run_q1 = qb[run_last % n_q + 1]

    # Step 3: restricted merges of adjacent short runs.
    merge_next = _restricted_pairs(mask, run_first, run_q0, run_q1, run_bh, tile_rows,
                                   combine_threshold, xp)
    merged_into_prev = xp.concatenate([xp.zeros(1, dtype=bool), merge_next[:-1]])
    run_group = xp.cumsum(~merged_into_prev) - 1
    num_groups = int(run_group[-1]) + 1 if run_group.size else 0
    num_merged = int(merge_next.sum())
    group_first_run = xp.nonzero(~merged_into_prev)[0]
    group_q0 = run_q0[group_first_run]
    group_q1 = run_q1[xp.concatenate([group_first_run[1:] - 1,
                                      xp.full(1, run_first.size - 1, dtype=group_first_run.dtype)])]
    group_bh = run_bh[group_first_run]

    # Entries of every run's first row, labelled by group and by the run's class bit
    # (1: first run of its group, 2: second run of a merged pair).
    indptr, indices = mask.indptr, mask.indices
    cnt = indptr[run_first + 1] - indptr[run_first]
    off = offsets_from_counts(cnt, xp)
    total = int(off[-1])
    e_run = segment_ids(off, total, xp)
    e_pos = indptr[run_first][e_run] + (xp.arange(total, dtype=np.int64) - off[e_run])
    e_j = indices[e_pos].astype(np.int64)
    e_group = run_group[e_run]
    e_cls = xp.where(merged_into_prev[e_run], 2, 1).astype(np.int8)
    if num_merged:
        order = xp.argsort(e_group * mask.num_kv_blocks + e_j, kind="stable")
        e_j, e_group, e_cls, e_run = e_j[order], e_group[order], e_cls[order], e_run[order]
        dup = xp.zeros(total, dtype=bool)
        if total > 1:
            dup[1:] = (e_group[1:] == e_group[:-1]) & (e_j[1:] == e_j[:-1])
        dup_pos = xp.nonzero(dup)[0]
        e_cls[dup_pos - 1] = 3  # the key block serves both runs
        keep = ~dup
        e_j, e_group, e_cls, e_run = e_j[keep], e_group[keep], e_cls[keep], e_run[keep]
        total = int(e_j.size)
    else:
        e_cls = xp.full(total, 3, dtype=np.int8)  # every span applies to the whole group

    # Step 1: spans = maximal runs of consecutive key blocks with the same group and class.
    new_span = xp.ones(total, dtype=bool)
    if total > 1:
        new_span[1:] = ((e_group[1:] != e_group[:-1]) | (e_j[1:] != e_j[:-1] + 1)
                        | (e_cls[1:] != e_cls[:-1]))
    span_first = xp.nonzero(new_span)[0]
    span_last = xp.concatenate([span_first[1:], xp.full(1, total, dtype=span_first.dtype)]) - 1
    s_group = e_group[span_first]
    s_cls = e_cls[span_first]
    k0 = kb[e_j[span_first]]
    k1 = kb[e_j[span_last] + 1]
    # Row restriction: the whole group, or the run the class bit names.
    s_run = e_run[span_first]
    r0 = xp.where(s_cls == 3, group_q0[s_group], run_q0[s_run])
    r1 = xp.where(s_cls == 3, group_q1[s_group], run_q1[s_run])
    g_spans = xp.bincount(s_group, minlength=num_groups) if s_group.size else \
        xp.zeros(num_groups, dtype=np.int64)
    g_span_off = offsets_from_counts(g_spans, xp)
    s_chunks = (k1 - k0 + block_n - 1) // block_n
    s_chunk_off = offsets_from_counts(s_chunks, xp)
    g_chunks = s_chunk_off[g_span_off[1:]] - s_chunk_off[g_span_off[:-1]]

    # Subdivide each group into tiles of tile_rows query tokens.
    g_tiles = (group_q1 - group_q0 + tile_rows - 1) // tile_rows
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
