"""CPU tests of the mapping (tessera.runtime.mapping): retain / subdivide / combine of blocks into
physical tiles, aligned tiles and the tiling-pairs estimate, checked through ``tessera.plan``
and the emulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tessera
from tessera import BlockMask, Regime
from tests.runtime.runtime_helpers import (
    BASE_REGIMES,
    TILE_128x64,
    _np_plan_row_stats,
    cases,
    check_emulation,
    check_queue,
    random_qkv,
)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), heads=st.integers(1, 4), pairs=st.integers(1, 8),
       n_kv=st.integers(1, 12))
def test_identical_row_pairs_combine_for_free(seed, heads, pairs, n_kv):
    """64-row blocks whose rows come in identical pairs fill 128-row tiles with no waste."""
    rng = np.random.default_rng(seed)
    base = rng.random((heads, pairs, n_kv)) < 0.4
    base[..., 0, rng.integers(n_kv)] = True  # something selected in every head
    dense = np.repeat(base, 2, axis=-2)
    mask = BlockMask.from_dense(dense, block_size=64)
    plan = tessera.plan(mask, num_q_heads=heads, head_dim=64, regime=TILE_128x64)
    s = plan.stats()
    assert s.wasted_ratio == 1.0
    assert s.num_tiles == heads * pairs
    assert np.all(np.asarray(plan.tiles.q1) - np.asarray(plan.tiles.q0) == 128)
    check_queue(plan)


def test_identical_row_pairs_emulated():
    rng = np.random.default_rng(1)
    dense = np.repeat(rng.random((2, 4, 6)) < 0.5, 2, axis=-2)
    mask = BlockMask.from_dense(dense, block_size=64)
    plan = tessera.plan(mask, num_q_heads=2, head_dim=64, regime=TILE_128x64)
    assert plan.stats().num_tiles == 8
    check_emulation(plan, mask, *random_qkv(rng, 1, 2, 2, 512, 384), None)


def alternating_mask(n_q=8):
    """Adjacent 64-row blocks share one key block of eight: even rows select blocks 0..6 and 15,
    odd rows 7..13 and 15."""
    dense = np.zeros((n_q, 16), dtype=bool)
    dense[0::2, 0:7] = True
    dense[1::2, 7:14] = True
    dense[:, 15] = True
    return dense


def merge_waste(dense, qlen, klen):
    """Masked work / useful work of a restricted merge of each pair of adjacent rows."""
    out = []
    for i in range(dense.shape[0] - 1):
        a, b = dense[i], dense[i + 1]
        ka, kb_, ku = (klen * a).sum(), (klen * b).sum(), (klen * (a | b)).sum()
        useful = qlen[i] * ka + qlen[i + 1] * kb_
        out.append(((qlen[i] + qlen[i + 1]) * ku - useful) / useful)
    return np.array(out)


def test_mostly_different_neighbours_do_not_merge():
    dense = alternating_mask()
    waste = merge_waste(dense, np.full(8, 64), np.full(16, 64))
    assert np.all(waste > 0.3), "the mask is meant to make every merge too wasteful"
    mask = BlockMask.from_dense(dense, block_size=64)
    plan = tessera.plan(mask, num_q_heads=1, head_dim=64,
                        regime=TILE_128x64.with_(combine_threshold=0.3))
    assert plan.stats().num_merged == 0
    assert plan.stats().num_tiles == 8
    # ... while a threshold above their waste lets them merge (and stay exact)
    loose = tessera.plan(mask, num_q_heads=1, head_dim=64,
                         regime=TILE_128x64.with_(combine_threshold=1.0))
    assert loose.stats().num_merged == 4 and loose.stats().num_tiles == 4
    rng = np.random.default_rng(2)
    res = check_emulation(loose, mask, *random_qkv(rng, 1, 1, 1, 512, 1024), None)
    assert res.pairs_masked > 0


def test_neighbours_without_shared_keys_never_merge():
    """A restricted merge needs shared keys, however loose the threshold."""
    dense = np.zeros((8, 8), dtype=bool)
    dense[0::2, :4] = True
    dense[1::2, 4:] = True
    mask = BlockMask.from_dense(dense, block_size=32)
    for t in (1.0, 10.0):
        plan = tessera.plan(mask, num_q_heads=1, head_dim=64,
                            regime=TILE_128x64.with_(combine_threshold=t))
        assert plan.stats().num_merged == 0
        assert plan.stats().num_tiles == 8


@settings(max_examples=300, deadline=None)
@given(cases(BASE_REGIMES))
def test_threshold_zero_never_merges(case):
    """The device planner skips the merge cost model at threshold 0 (mapping.py): that is only
    sound if the model can never pick a merge there, on any geometry or selection."""
    from tessera.runtime import mapping

    mask = case[1]
    xp = mask.xp
    stats = mapping._row_stats(mask, xp)
    n_rows = mask.indptr.size - 1
    run_first, run_bh, run_q0, run_q1 = mapping._runs(stats, n_rows, mask.num_q_blocks,
                                                      np.asarray(mask.q_bounds), xp)
    for tile_rows in (16, 64, 128, 1 << 20):
        take = mapping._restricted_pairs(stats, run_first, run_q0, run_q1, run_bh, tile_rows,
                                         0.0, xp)
        assert not take.any()


def banded_mask(n=8):
    """Row i selects key blocks i-2 .. i+1 (clipped)."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    return (j >= i - 2) & (j <= i + 1)


@pytest.mark.parametrize("heads", [1, 3])
def test_banded_neighbours_merge_and_stay_exact(heads):
    dense = np.broadcast_to(banded_mask(), (heads, 8, 8))
    waste = merge_waste(dense[0], np.full(8, 64), np.full(8, 64))
    assert np.all(waste <= 0.3)
    mask = BlockMask.from_dense(dense, block_size=64)
    plan = tessera.plan(mask, num_q_heads=heads, head_dim=64,
                        regime=TILE_128x64.with_(combine_threshold=0.3))
    s = plan.stats()
    assert s.num_merged > 0
    assert s.num_tiles < 8 * heads
    # restrictions fall on whole 16-row groups here, so the kernels skip them: no waste counted
    assert s.wasted_ratio == 1.0
    check_queue(plan)
    rng = np.random.default_rng(3)
    res = check_emulation(plan, mask, *random_qkv(rng, 1, heads, heads, 512, 512), None)
    assert res.pairs_masked > 0  # the row restrictions really masked something


@pytest.mark.parametrize("split", [False, True])
def test_subdivide_384_token_blocks(split):
    rng = np.random.default_rng(4)
    n_q, n_kv, heads = 3, 2, 2
    dense = rng.random((heads, n_q, n_kv)) < 0.6
    dense[:, :, 0] = True
    dense[:, 1, 1] = ~dense[:, 0, 1]  # consecutive rows differ: no combining
    dense[:, 2, 1] = ~dense[:, 1, 1]
    mask = BlockMask.from_dense(dense, block_size=384)
    regime = TILE_128x64.with_(split_ratio=1.0, min_split_chunks=1) if split else TILE_128x64
    plan = tessera.plan(mask, num_q_heads=heads, head_dim=64, regime=regime)
    t = plan.tiles
    assert t.num_tiles == 3 * n_q * heads
    assert np.all(np.asarray(t.q1) - np.asarray(t.q0) == 128)
    assert sorted(np.asarray(t.q0).tolist()) == sorted(list(range(0, 1152, 128)) * heads)
    check_queue(plan)
    check_emulation(plan, mask, *random_qkv(rng, 1, heads, heads, 1152, 768), None)


@pytest.mark.parametrize("pack_keys", [False, True])
@pytest.mark.parametrize("combine_threshold", [0.0, 0.3])
@pytest.mark.parametrize("batch_heads, block_size, n_q, n_kv", [
    ((1, 3), 128, 5, 7), ((2, 2), 64, 9, 4), ((1, 1), 384, 2, 3), ((2, 1), 96, 1, 1)])
def test_a_mask_selecting_every_block_maps_as_the_three_steps_do(
        monkeypatch, batch_heads, block_size, n_q, n_kv, combine_threshold, pack_keys):
    """The arithmetic tiles of a mask that selects every block equal the general path's, array
    for array (the general path forced by hiding the count)."""
    from tessera.runtime import mapping

    mask = BlockMask.from_dense(np.ones((*batch_heads, n_q, n_kv), dtype=bool),
                                block_size=block_size)
    args = (mask, 128, 64, combine_threshold, pack_keys)
    fast = mapping.map_to_tiles(*args)
    monkeypatch.setattr(mapping, "selects_every_block", lambda m: False)
    general = mapping.map_to_tiles(*args)
    for name in ("tile_rows", "block_n", "num_groups", "num_merged"):
        assert getattr(fast, name) == getattr(general, name), name
    for name in ("mask_bh", "q0", "q1", "span_begin", "span_end", "chunks", "k0", "k1", "r0",
                 "r1"):
        a, b = np.asarray(getattr(fast, name)), np.asarray(getattr(general, name))
        assert a.dtype == b.dtype and np.array_equal(a, b), name


def test_a_mask_missing_one_block_takes_the_general_path():
    """One unselected block is enough to leave the arithmetic tiles: the spans then break."""
    from tessera.runtime import mapping

    dense = np.ones((1, 2, 4, 4), dtype=bool)
    dense[0, 1, 2, 1] = False
    tiles = mapping.map_to_tiles(BlockMask.from_dense(dense, block_size=128), 128, 64, 0.0)
    assert tiles.num_spans > 2 and tiles.num_groups > 2


def test_aligned_tiles_cut_the_waste_of_clusters():
    """Variable ~150-token clusters that select most keys: tiles cut from each block run their
    last tile mostly empty; aligned tiles share keys across the boundary and compute far less,
    exactly (emulated)."""
    rng = np.random.default_rng(7)
    n = 16
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, n))]
    kb = qb.copy()
    # Neighbouring clusters select mostly the same keys: row i a window of ~11 blocks around
    # i whose ends move by a block at random.
    i = np.arange(n)[None, :, None]
    lo = i - 5 - rng.integers(0, 2, (2, n, 1))
    hi = i + 5 + rng.integers(0, 2, (2, n, 1))
    j = np.arange(n)[None, None, :]
    dense = (j >= lo) & (j <= hi)
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    q, k, v = random_qkv(rng, 1, 2, 2, int(qb[-1]), int(kb[-1]))
    base = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                  combine_threshold=0.0)
    plain = tessera.plan(mask, num_q_heads=2, head_dim=64, regime=base)
    aligned = tessera.plan(mask, num_q_heads=2, head_dim=64, regime=base.with_(align_tiles=True))
    check_queue(aligned)
    check_emulation(aligned, mask, q, k, v, None)
    assert aligned.tiles.num_tiles == 2 * -(-int(qb[-1]) // 128)
    assert aligned.stats().num_merged > 0  # tiles that straddle a block boundary
    assert aligned.computed_pairs() < 0.85 * plain.computed_pairs()


def _tiling_pairs_by_loops(dense, qb, kb, tile_rows):
    """tiling_pairs written out block by block and tile by tile (the test's own reading)."""
    kv_tokens = np.diff(kb)
    plain = aligned = 0
    lq = int(qb[-1])
    for rows in dense.reshape(-1, *dense.shape[-2:]):
        for i, sel in enumerate(rows):
            plain += -(-(qb[i + 1] - qb[i]) // tile_rows) * tile_rows * kv_tokens[sel].sum()
        for t0 in range(0, lq, tile_rows):
            t1 = min(t0 + tile_rows, lq)
            meets = [i for i in range(len(rows)) if qb[i] < t1 and qb[i + 1] > t0]
            aligned += (t1 - t0) * kv_tokens[rows[meets].any(axis=0)].sum()
    return int(plain), int(aligned)


def _np_tiling_pairs(grid, block, args):
    """numpy stand-in for plan.cu's tiling_pairs, warp by warp: mask rows first (out[0]), then
    each mask (batch, head)'s aligned tiles (out[1])."""
    dense, n_rows, n_kv, n_q, per_bh, qb, kb, lo, hi, tile_rows, out = args
    dense = dense.reshape(-1, int(n_kv)).astype(bool)
    kv_tokens = np.diff(kb)
    for w in range(int(n_rows) + int(n_rows) // int(n_q) * int(per_bh)):
        if w < n_rows:
            first = last = w
            rows = -(-(qb[w % n_q + 1] - qb[w % n_q]) // tile_rows) * tile_rows
        else:
            bh, t = divmod(w - int(n_rows), int(per_bh))
            first, last = bh * n_q + lo[t], bh * n_q + hi[t]
            rows = min(t * tile_rows + tile_rows, qb[n_q]) - t * tile_rows
        out[0 if w < n_rows else 1] += np.uint64(
            rows * kv_tokens[dense[first:last + 1].any(axis=0)].sum())


def _random_variable_mask(seed: int):
    """Random variable blocks of 20-300 tokens over batch 2 and 3 heads, one block row empty:
    (the generator after it, the dense matrix, q and kv bounds, the mask)."""
    rng = np.random.default_rng(seed)
    n_q, n_kv = int(rng.integers(3, 14)), int(rng.integers(2, 14))
    qb = np.r_[0, np.cumsum(rng.integers(20, 300, n_q))]
    kb = np.r_[0, np.cumsum(rng.integers(20, 300, n_kv))]
    dense = rng.random((2, 3, n_q, n_kv)) < rng.uniform(0.1, 0.9)
    dense[0, 1, n_q // 2] = False
    return rng, dense, qb, kb, BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)


@pytest.mark.parametrize("seed", range(4))
def test_tiling_pairs_estimate(seed, monkeypatch):
    """The plain and aligned tilings' pairs as tiling_pairs estimates them equal the loop
    reading on random variable blocks (batch and heads, an empty block row); on clusters whose
    neighbours share keys the estimate is within 0.1 of the planned ratio."""
    from tessera.runtime.mapping import tiling_pairs

    rng, dense, qb, kb, mask = _random_variable_mask(seed)
    from tessera.cuda import loader
    from tessera.runtime import planner_launches
    from tessera.runtime.mapping import aligned_geometry

    monkeypatch.setattr(loader, "load_kernel",
                        lambda v: {"tiling_pairs": _np_tiling_pairs}[v.kernel])
    for rows in (64, 128):
        expected = _tiling_pairs_by_loops(dense, qb, kb, rows)
        assert tiling_pairs(mask, rows) == expected
        # The device path's launch (the kernel replaced by its numpy stand-in).
        geo = aligned_geometry(qb, rows, np)
        rows_u8 = mask.to_dense().reshape(-1, mask.num_kv_blocks).view(np.uint8)
        assert planner_launches.tiling_pairs(mask, rows_u8, geo.per_bh, geo.lo, geo.hi,
                                             rows) == expected
    n = 16
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, n))]
    i, j = np.arange(n)[None, :, None], np.arange(n)[None, None, :]
    near = np.abs(j - i) <= 5 + rng.integers(0, 2, (2, n, 1))
    mask = BlockMask.from_dense(near, q_bounds=qb, kv_bounds=qb)
    plain, aligned = tiling_pairs(mask, 128)
    base = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                  combine_threshold=0.0)
    planned = [tessera.plan(mask, num_q_heads=2, head_dim=64, regime=r).computed_pairs()
               for r in (base, base.with_(align_tiles=True))]
    assert abs(aligned / plain - planned[1] / planned[0]) < 0.1


def _key_walk_chunks_by_loops(dense, qb, kb, block_n, tile_rows):
    """key_walk_chunks read the slow way: per mask row, its spans (maximal runs of selected key
    blocks) in BN-chunks one by one, and its keys end to end, times the row's tiles."""
    span = packed = 0
    rows = dense.reshape(-1, dense.shape[-1])
    n_q = qb.size - 1
    for r, row in enumerate(rows):
        tiles = -(-(qb[r % n_q + 1] - qb[r % n_q]) // tile_rows)
        keys, c = 0, 0
        while c < row.size:
            if row[c]:
                e = c
                while e + 1 < row.size and row[e + 1]:
                    e += 1
                length = kb[e + 1] - kb[c]
                span += tiles * -(-length // block_n)
                keys += length
                c = e + 1
            else:
                c += 1
        packed += tiles * -(-keys // block_n)
    return int(span), int(packed)


@pytest.mark.parametrize("seed", range(4))
def test_key_walk_chunks_count_spans_and_packed_keys(seed, monkeypatch):
    """The span-by-span and packed key walks' chunks as key_walk_chunks counts them, on the host
    and through plan_row_stats' launch, equal the loop reading on random variable blocks (batch
    and heads, an empty row)."""
    from tessera.runtime.mapping import key_walk_chunks

    rng, dense, qb, kb, mask = _random_variable_mask(seed)
    from tessera.cuda import loader
    from tessera.runtime import planner_launches

    monkeypatch.setattr(loader, "load_kernel",
                        lambda v: {"plan_row_stats": _np_plan_row_stats}[v.kernel])
    for block_n, rows in ((64, 64), (128, 128)):
        expected = _key_walk_chunks_by_loops(dense, qb, kb, block_n, rows)
        assert key_walk_chunks(mask, block_n, rows) == expected
        # The device path's launch (the kernel replaced by its numpy stand-in).
        rows_u8 = mask.to_dense().reshape(-1, mask.num_kv_blocks).view(np.uint8)
        assert planner_launches.key_walk_chunks(mask, rows_u8, block_n, rows) == expected


def test_tiling_pairs_declines_tiny_blocks():
    """Blocks far smaller than a tile (more than ALIGNED_ESTIMATE_MAX_BLOCKS in one tile): no
    estimate, the plain tiling combines such blocks."""
    from tessera.runtime.mapping import ALIGNED_ESTIMATE_MAX_BLOCKS, tiling_pairs

    qb = np.arange(0, 40 * 4 + 1, 4)  # 4-token blocks: 32 in a 128-row tile
    mask = BlockMask.from_dense(np.ones((1, 40, 3), bool), q_bounds=qb,
                                kv_bounds=np.array([0, 64, 128, 192]))
    assert 128 // 4 > ALIGNED_ESTIMATE_MAX_BLOCKS and tiling_pairs(mask, 128) is None
    assert tiling_pairs(mask, 32) is not None  # 8 blocks a tile
