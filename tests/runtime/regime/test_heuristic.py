"""CPU tests of the default-regime heuristic (tessera.runtime.regime.heuristic)."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
import tessera.runtime.mapping
from tessera.families.common import variable_bounds
from tessera.runtime import regime as R
from tessera.runtime.regime import default_regime
from tests.runtime.regime.regime_helpers import clean_selection  # noqa: F401 (autouse fixture)


def test_defaults_per_architecture():
    """sm_90 takes the Hopper family (warp-specialized 128x128 tiles; at head dim 64 64x64
    producer tiles in four rings; 64-row tiles and 64-key steps for small query blocks);
    every other GPU the portable family."""
    assert default_regime(90, 128).name == "sm90_128x128_w12_s3[combine_threshold=0.0]"
    assert default_regime(90, 64).name == "sm90_64x64_w20_s3[combine_threshold=0.0]"
    assert default_regime(90, 64).variant(64).min_blocks == 2
    assert default_regime(90, 64).variant(64, tma=True).rings == 4
    assert default_regime(90, 96).producer
    # Small query blocks: 64-row tiles, with a producer warpgroup at head dims 64 and 128 (two
    # CTAs an SM; at head dim 64 with TMA copies one CTA of four rings, its cp.async form two
    # CTAs of one), the plain variant at 96.
    assert default_regime(90, 128, q_block=64).name == "sm90_64x64_w8_s3[combine_threshold=0.0]"
    assert default_regime(90, 64, q_block=64).name == "sm90_64x64_w20_s3[combine_threshold=0.0]"
    for d in (64, 128):
        assert default_regime(90, d, q_block=64).variant(d).min_blocks == 2
        assert default_regime(90, d, q_block=64).variant(d).rings == 1
    rings = default_regime(90, 64, q_block=64).variant(64, tma=True)
    assert (rings.rings, rings.min_blocks, rings.threads) == (4, 1, 640)
    assert default_regime(90, 128, q_block=64).variant(128, tma=True).min_blocks == 2
    # A packed key walk (ragged keys) is cp.async's: one ring, two CTAs an SM.
    ragged = np.array([0, 64, 128, 144, 208, 272, 288, 300, 364])
    packed = default_regime(90, 64, 64.0, ragged)
    assert packed.pack_keys and not packed.tma_capable
    assert (packed.variant(64).rings, packed.variant(64).min_blocks) == (1, 2)
    assert default_regime(90, 96, q_block=64).name == "sm90_64x64_w4_s3[combine_threshold=0.0]"
    for arch in (80, 86, 89, 100, None):
        assert default_regime(arch, 128).family == "sm80"
    # The portable family: 128-row tiles at every head dim (two row tiles a warp), 64-row ones
    # where 128 rows do not fit (sm_86/sm_89 at head dim 128) or query blocks are small.
    for arch in (80, 100, None):
        for d in (64, 96, 128):
            assert default_regime(arch, d).name == "sm80_128x64_w4_s2[combine_threshold=0.0]"
    assert default_regime(89, 64).block_m == 128 and default_regime(89, 128).block_m == 64
    assert default_regime(80, 64, q_block=64).block_m == 64
    for arch in (80, 86, 89, 90, 100):
        for d in (64, 96, 128):
            assert R.regime_fits(default_regime(arch, d), d, arch)


def test_packed_keys_default_on_ragged_key_geometry():
    """sm_90 takes the packed key walk with 64-row tiles where key blocks end mid-step (top-k
    cubes with edge cubes), not on aligned or long blocks, and never off sm_90; the 128-row
    heuristic alone does not (its walk copies by TMA: only select_regime's reading of the mask,
    pack_pays, packs it)."""
    from tessera.tools.workloads import WORKLOADS, example_mask

    aligned = np.arange(0, 4097, 128)
    assert not R.blocks_ragged(aligned, 128) and not R.blocks_ragged(aligned, 64)
    cubes = np.array([0, 64, 128, 144, 208, 272, 288])  # a third of them 16-token edge cubes
    assert R.blocks_ragged(cubes, 64)
    assert not R.blocks_ragged(np.r_[np.arange(0, 20 * 64 + 1, 64), 20 * 64 + 16], 64)  # 1/21
    tiles = np.arange(0, 288 * 20 + 1, 288)  # long blocks: spans run over several of them
    assert not R.blocks_ragged(tiles, 128)
    assert not R.blocks_ragged(np.array([0]), 64)  # no key blocks
    assert default_regime(90, 128, 64.0, cubes).pack_keys
    assert not default_regime(90, 128, 64.0, aligned).pack_keys
    assert not default_regime(90, 128, 150.0, cubes).pack_keys  # 128-row tiles: pack_pays decides
    assert default_regime(90, 128, 64.0, cubes) == default_regime(90, 128, 64.0).with_(
        pack_keys=True)
    for arch in (80, 89, 100, None):
        assert not default_regime(arch, 128, 64.0, cubes).pack_keys
    for shape in ("cogvideox-5b", "hunyuan-720p"):  # top-k cubes 40% / 19% ragged at 64
        w = WORKLOADS[shape]
        for family, packed in (("topk_pooled", True), ("semantic_clusters", False),
                               ("random_blocks", False), ("sliding_tile", False)):
            m = example_mask(w, family, heads=2, head_dim=w.head_dim).mask
            r = R.select_regime(m, arch=90, head_dim=w.head_dim, dtype=np.dtype("float16"),
                                num_q_heads=w.heads, batch=1)
            assert r.pack_keys == packed, (shape, family)
    w = WORKLOADS["cogvideox-5b"]
    m = example_mask(w, "topk_pooled", heads=w.heads, head_dim=w.head_dim).mask
    r = R.select_regime(m, arch=90, head_dim=w.head_dim, dtype=np.dtype("float16"),
                        num_q_heads=w.heads, batch=1)
    assert tessera.plan(m, num_q_heads=w.heads, head_dim=w.head_dim, arch=90).regime == r


def test_aligned_tiles_chosen_where_they_pay(monkeypatch):
    """The sm90 heuristic aligns its 128-row tiles for the semantic clusters (variable blocks
    whose neighbours share keys) and not for random variable blocks at low density, nor off
    sm_90; masks whose query blocks are not ragged never pay for the estimate."""
    from tessera.mask import BlockMask
    from tessera.tools.workloads import WORKLOADS, example_mask

    def pick(m, arch=90):
        return R.select_regime(m, arch=arch, head_dim=64, dtype=np.dtype("float16"),
                               num_q_heads=2, batch=1)

    for shape in ("wan-1.3b-480p", "cogvideox-5b"):
        m = example_mask(WORKLOADS[shape], "semantic_clusters", heads=2, head_dim=64).mask
        assert R.align_pays(m, 128), shape
        assert pick(m).align_tiles and pick(m).block_m == 128 and not pick(m).pack_keys, shape
        assert not pick(m, arch=80).align_tiles
        assert tessera.plan(m, num_q_heads=2, head_dim=64, arch=90).regime.align_tiles
    rng = np.random.default_rng(0)
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, 60))]
    sparse = BlockMask.from_dense(rng.random((2, 60, 60)) < 0.3, q_bounds=qb, kv_bounds=qb)
    assert R.blocks_ragged(qb, 128) and not R.align_pays(sparse, 128)
    assert not pick(sparse).align_tiles
    dense = BlockMask.from_dense(rng.random((2, 60, 60)) < 0.95, q_bounds=qb, kv_bounds=qb)
    assert R.align_pays(dense, 128) and pick(dense).align_tiles

    def no_estimate(*a, **k):
        raise AssertionError("estimated the tilings of a mask with aligned query blocks")

    monkeypatch.setattr(tessera.runtime.mapping, "tiling_pairs", no_estimate)
    for family in ("sliding_tile", "random_blocks"):
        m = example_mask(WORKLOADS["wan-1.3b-480p"], family, heads=2, head_dim=64).mask
        assert not R.align_pays(m, 128) and not pick(m).align_tiles, family
    # Small query blocks take the 64-row heuristic, which never asks.
    m = example_mask(WORKLOADS["wan-1.3b-480p"], "topk_pooled", heads=2, head_dim=64).mask
    assert pick(m).block_m == 64 and not pick(m).align_tiles


def test_the_align_gate_is_how_much_plain_tiles_pad():
    """align_may_pay (host bounds alone) lets the estimate run where 128-row tiles cut from each
    block pad its rows by 1.2x or more: the held-out corpus's clusters (median 257-289 tokens,
    which the two-tile median of blocks_ragged refuses) pass and align; 128- and 384-token
    blocks and the held-out sliding tiles (padded ~1.1x) are not read."""
    from tessera.tools import profile as prof

    held = {c.label: c for c in prof.build_heldout_corpus(["wan-1.3b-720p-13f"], heads=2)}
    m = held["wan-1.3b-720p-13f/semantic_clusters"].build()
    assert np.median(np.diff(m.q_bounds)) > 256 and not R.blocks_ragged(m.q_bounds, 128)
    assert R.align_may_pay(m.q_bounds, 128) and R.align_pays(m, 128)
    sta = held["wan-1.3b-720p-13f/sliding_tile"].build()
    assert not R.align_may_pay(sta.q_bounds, 128) and not R.align_pays(sta, 128)
    assert not R.align_may_pay(np.arange(0, 10 * 128 + 1, 128), 128)
    assert not R.align_may_pay(np.arange(0, 10 * 384 + 1, 384), 128)
    assert R.align_may_pay(np.arange(0, 10 * 150 + 1, 150), 128)  # 256 rows for 150
    assert not R.align_may_pay(np.arange(0, 10 * 120 + 1, 120), 128)  # 128 rows for 120
    assert not R.align_may_pay(np.array([0]), 128)
    for bad in (0, True, 128.0):
        with pytest.raises(ValueError, match="tile_rows must be a positive int"):
            R.align_may_pay(np.arange(0, 10 * 150 + 1, 150), bad)


def test_packed_keys_chosen_where_spans_are_short_and_ragged():
    """sm_90's 128-row (D=128) and D=64 regimes walk packed keys (at D=64 on 64x128 tiles,
    whose 128-key steps the rule was measured with) on random variable
    blocks of 32-256 tokens at 10% (span by span ~1.3x the chunks), not on 128-token blocks
    (never ragged: nothing read) nor where the walk would save little (dense rows of the same
    blocks: spans run over many blocks)."""
    rng = np.random.default_rng(0)
    b = variable_bounds(rng, 32_760, 32, 256)
    n = b.size - 1
    sparse = tessera.BlockMask.from_dense(rng.random((4, n, n)) < 0.1, q_bounds=b, kv_bounds=b)
    full = tessera.BlockMask.from_dense(np.ones((4, n, n), bool), q_bounds=b, kv_bounds=b)
    uniform = tessera.BlockMask.from_dense(rng.random((4, 64, 64)) < 0.1,
                                           q_bounds=np.arange(0, 64 * 128 + 1, 128),
                                           kv_bounds=np.arange(0, 64 * 128 + 1, 128))
    for d in (64, 128):
        def pick(m):
            return R.select_regime(m, arch=90, head_dim=d, dtype=np.dtype("float16"),
                                   num_q_heads=4, batch=1)

        span, packed = tessera.runtime.mapping.key_walk_chunks(sparse, 128, pick(sparse).block_m)
        assert span >= R.PACK_MIN_CHUNK_RATIO * packed
        assert pick(sparse).pack_keys and not pick(sparse).align_tiles
        assert pick(sparse) == (R.heuristic.SM90_PACKED_D64 if d == 64 else
                                default_regime(90, d).with_(pack_keys=True))
        assert not pick(full).pack_keys and not pick(uniform).pack_keys
        assert not R.select_regime(sparse, arch=80, head_dim=d, dtype=np.dtype("float16"),
                                   num_q_heads=4, batch=1).pack_keys


def test_192_row_tiles_where_query_blocks_fill_them():
    """At head dim 64 on sm_90, query blocks that fill 192-row tiles (median at least 192
    tokens, rows rounded up to 192 at most ROWS192_MAX_ROW_RATIO times those rounded up to 64)
    take three consumer warpgroups: CogVideoX's sliding tiles (288-token blocks), 384-token
    blocks; 128-token blocks, 256-token ones (1.5x the rows) and the 32-256-token variable ones
    do not, nor head dim 128 or other GPUs. The cp.async form of that regime steps 64 keys."""
    from tessera.runtime.regime.heuristic import (ROWS192_MAX_ROW_RATIO, SM90_ROWS192_D64,
                                                  rows192_pay)
    from tessera.tools import workloads

    def rows(b, t):
        s = np.diff(b)
        return (-(-s // t) * t).sum()

    sta = workloads.example_mask(workloads.WORKLOADS["cogvideox-5b"], "sliding_tile",
                                 heads=2).mask
    rng = np.random.default_rng(0)
    variable = variable_bounds(rng, 17_776, 32, 256)
    for bounds, fills in ((np.asarray(sta.q_bounds), True), (np.arange(0, 12 * 384 + 1, 384), True),
                          (np.arange(0, 12 * 192 + 1, 192), True),
                          (np.arange(0, 12 * 128 + 1, 128), False),
                          (np.arange(0, 12 * 256 + 1, 256), False), (variable, False)):
        ratio = rows(bounds, 192) / rows(bounds, 64)
        assert rows192_pay(bounds) == fills == (
            np.median(np.diff(bounds)) >= 192 and ratio <= ROWS192_MAX_ROW_RATIO), bounds
    m = tessera.BlockMask.from_dense(rng.random((2, 12, 12)) < 0.3,
                                     q_bounds=np.arange(0, 12 * 384 + 1, 384),
                                     kv_bounds=np.arange(0, 12 * 384 + 1, 384))
    for arch, d, want in ((90, 64, SM90_ROWS192_D64), (90, 128, default_regime(90, 128)),
                          (80, 64, default_regime(80, 64))):
        assert R.select_regime(m, arch=arch, head_dim=d, dtype=np.dtype("float16"),
                               num_q_heads=2, batch=1) == want
    assert R.select_regime(sta, arch=90, head_dim=64, dtype=np.dtype("float16"),
                           num_q_heads=2, batch=1) == SM90_ROWS192_D64
    assert SM90_ROWS192_D64.variant(64, tma=True).macro("BN") == 128
    assert SM90_ROWS192_D64.variant(64).macro("BN") == 64


def test_rings_give_way_to_one_ring_tiles_where_tasks_are_few():
    from tessera.runtime.regime.heuristic import (RINGS_MIN_TASKS, SM90_PACKED_D64,
                                                  SM90_ROWS64_D64, SM90_ROWS128,
                                                  one_ring_where_few_tasks)
    rings = SM90_ROWS64_D64
    assert rings.rings == 4
    edge = RINGS_MIN_TASKS * 4 * 132
    one = one_ring_where_few_tasks(rings, edge - 1, 132, 128.0)
    assert (one.block_m, one.block_n, one.num_warps, one.rings) == (64, 128, 8, 1)
    assert one.split_ratio == rings.split_ratio and one.stages == rings.stages
    assert one_ring_where_few_tasks(rings, edge, 132, 128.0) == rings
    small = default_regime(90, 64, q_block=64)
    assert small.rings == 4
    one = one_ring_where_few_tasks(small, 100, 132, 64.0)
    assert (one.block_m, one.block_n, one.num_warps) == (64, 64, 8)
    # One ring already, a packed walk (cp.async: one task a CTA), or no GPU: unchanged.
    for r, sms in ((SM90_ROWS128, 132), (SM90_PACKED_D64, 132),
                   (rings.with_(pack_keys=True), 132), (rings, 0)):
        assert one_ring_where_few_tasks(r, 1, sms, 128.0) == r


def test_heuristic_choice_counts_the_shapes_tasks_for_the_rings():
    # CogVideoX-5B's length, 128-token blocks: 275 64-row tiles a head.
    qb = np.minimum(np.arange(0, 17550 + 128, 128), 17550)
    rng = np.random.default_rng(1)
    for heads, ring in ((4, 1), (6, 1), (8, 4), (48, 4)):
        blocks = rng.random((1, heads, qb.size - 1, qb.size - 1)) < 0.1
        mask = tessera.BlockMask.from_dense(blocks, q_bounds=qb, kv_bounds=qb)
        got, _ = R.heuristic_choice(mask, 90, 64, num_q_heads=heads, batch=1, sm_count=132)
        assert got.rings == ring, (heads, got.name)
        # Without the shape or the GPU the rings stay.
        assert R.heuristic_choice(mask, 90, 64)[0].rings == 4
        assert R.heuristic_choice(mask, 90, 64, num_q_heads=heads, sm_count=0)[0].rings == 4

