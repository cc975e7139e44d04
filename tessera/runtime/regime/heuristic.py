"""The documented heuristic: the regime a plan takes when no table answers, from the GPU's
architecture, the head dim and the mask's block geometry (each rule with the measurement behind
it in docs/decisions.md)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ...mask import bounds_key
from .. import mapping
from ..mapping import selects_every_block  # a dense layer: the rules below ask the count
from .value import ROW_GROUP, Regime

__all__ = ["default_regime", "align_pays", "align_may_pay", "pack_pays", "blocks_ragged",
           "typical_q_block", "ALIGN_MIN_PADDING",
           "SM90_ROWS128", "SM90_ROWS64_D64", "SM90_PACKED_D64", "SM90_ROWS192_D64",
           "ALIGN_MAX_PAIR_RATIO",
           "rows192_pay", "ROWS192_MAX_ROW_RATIO", "selects_every_block",
           "ROWS128_MIN_DENSITY_D64",
           "RINGS_MIN_TASKS", "one_ring_where_few_tasks", "INT8_REGIME"]


# sm_90's regimes for blocks of 128 tokens and more: 128-row tiles warp-specialized (two consumer
# warpgroups and a producer), 128 keys a step, three stages; at head dim 64 64x64 tiles in four
# rings, one CTA an SM, each ring's consumer warpgroup on its own tasks (default_regime says
# why).
SM90_ROWS128 = Regime(family="sm90", block_m=128, num_warps=128 // ROW_GROUP + 4, block_n=128,
                      stages=3, combine_threshold=0.0)


# The 8-bit forwards' regime (both precisions, both head dims): its kernel is the TMA form of
# these 128x128 tiles (sm90/traits.cuh's INT8), the one form it is built in; requests never split.
INT8_REGIME = SM90_ROWS128


SM90_ROWS64_D64 = Regime(family="sm90", block_m=64, num_warps=4 * (64 // ROW_GROUP) + 4,
                         block_n=64, stages=3, combine_threshold=0.0)


# Its packed-key form where pack_pays: 64x128 tiles, two CTAs an SM (a packed walk is cp.async's,
# which rings are not), whose 128-key steps the packed walk was measured on (random 32-256-token
# blocks at 10% 1.18-1.30x faster packed than span by span).
SM90_PACKED_D64 = Regime(family="sm90", block_m=64, num_warps=64 // ROW_GROUP + 4, block_n=128,
                         stages=3, combine_threshold=0.0, pack_keys=True)


# sm_90 at head dim 64 where the query blocks fill 192-row tiles (rows192_pay): three consumer
# warpgroups taking turns and a TMA producer, 128 keys a step -- the turns hide the softmax,
# which at head dim 64 costs as much as half the matrix work, behind the other warpgroups'
# products. Its cp.async form steps 64 keys (Regime.variant).
SM90_ROWS192_D64 = Regime(family="sm90", block_m=192, num_warps=192 // ROW_GROUP + 4,
                          block_n=128, stages=3, combine_threshold=0.0)


# At head dim 64, the share of its blocks a host mask of large blocks (whose geometry leaves it
# the rings) must select to take 128-row tiles (SM90_ROWS128) instead: each K/V chunk read for
# twice the query rows. Random 128-token blocks on the H200 (docs/decisions.md), 128-row tiles
# against the rings: CogVideoX-5B / -2B at 30% 1.005x / 0.990x, 40% 1.026x / 1.016x, 50% 1.037x
# / 1.020x, 70% 1.026x / 1.030x, 85% 1.056x / 1.025x (192-row tiles 0.93-1.05x there). A device
# mask's count is a readback, which a request never waits for: it keeps the rings.
ROWS128_MIN_DENSITY_D64 = 0.4


# rows192_pay's bounds: the query blocks' median at least 192 tokens, and their rows rounded up to
# 192-row tiles at most this many times their rows rounded up to 64-row ones. Measured on the
# H200 (docs/decisions.md): CogVideoX's sliding tiles (median 288 tokens, ratio 1.25) 1.16x
# faster; 128-token blocks (ratio 1.5) 0.89-1.06x on random, banded, radial and
# spatial-temporal masks -- dense ones 1.18-1.21x, their identical rows merged by the planner
# into runs the geometry cannot show.
ROWS192_MAX_ROW_RATIO = 1.3


def rows192_pay(q_bounds: np.ndarray) -> bool:
    """Whether the query blocks of this geometry fill 192-row tiles (``SM90_ROWS192_D64``):
    their median is at least 192 tokens and 192-row tiles round their rows up by at most
    :data:`ROWS192_MAX_ROW_RATIO` times what 64-row tiles do. Host bounds alone."""
    return _rows192_pay(bounds_key(q_bounds))


@functools.lru_cache(maxsize=64)  # asked on every selection; a geometry's answer never changes
def _rows192_pay(bounds: bytes) -> bool:
    sizes = _block_sizes(bounds)
    if sizes.size == 0 or np.median(sizes) < 192:
        return False
    return bool(_tiled_rows(sizes, 192) <= ROWS192_MAX_ROW_RATIO * _tiled_rows(sizes, 64))


def _block_sizes(bounds: bytes) -> np.ndarray:
    """Block sizes of a geometry from its bounds' int64 bytes (``bounds_key``), the form the
    per-geometry caches below are keyed by."""
    return np.diff(np.frombuffer(bounds, dtype=np.int64))


def _tiled_rows(sizes: np.ndarray, tile_rows: int) -> int:
    """Rows that tiles of ``tile_rows`` cut from each block of ``sizes`` tokens cover."""
    return int((-(-sizes // tile_rows) * tile_rows).sum())


def default_regime(arch: int | None = None, head_dim: int = 128,
                   q_block: float | None = None, kv_bounds: np.ndarray | None = None) -> Regime:
    """The heuristic regime for a GPU with compute capability ``arch`` (e.g. 90), or None (CPU).

    Each rule, with the measurement behind it in docs/decisions.md ("Default regimes"):

    - sm_90, blocks of 128 tokens or more: the warp-specialized wgmma variant, 128-row tiles
      (two consumer warpgroups and a producer), 128 keys a step, three K/V stages -- the fastest
      sm90 shape at head dim 128. At head dim 64, 64x64 tiles in four rings (one CTA an SM
      of four consumer warpgroups, each on its own tasks, and a producer warpgroup; TMA copies,
      else one ring, two CTAs an SM): 0.99-1.07x the 64x128 two-CTA tiles on CogVideoX's
      random and banded 128-token masks by run, 0.99x dense (the 128-row ones still take aligned
      tiles, and query blocks that fill 192-row tiles take ``SM90_ROWS192_D64``:
      :func:`select_regime`, :func:`rows192_pay`).
    - sm_90, small query blocks (``q_block``, the median query block, <= 64 tokens): 64-row
      tiles and 64 keys a step (a 128-key step would be half masked on 64-token spans), with a
      producer warpgroup: at head dim 128 two CTAs an SM (Wan's top-k cubes 1.2-1.3x faster),
      at 64 three where its copies are TMA's (CogVideoX's 64-token blocks 1.12-1.14x faster;
      the cp.async form, two CTAs an SM, is within noise of the plain variant on the cubes),
      and there one CTA of four rings rather than three CTAs (``num_warps`` 20; TMA copies
      only, so not for a packed walk: four consumer warps an SM sub-partition instead of three;
      CogVideoX's 64-token top-k 1.08x, random 30% 1.06x faster); head dim 96 keeps the
      plain variant (not measured).
      Key geometries ragged against the step (:func:`blocks_ragged`: pooled top-k cubes with
      their edge cubes) take the packed key walk (``pack_keys``): walked span by span, each
      short span would cost a whole step. The 128-row regime (and the D=64 one) packs only
      where :func:`pack_pays` says so (:func:`select_regime` reads the mask): its span-by-span
      walk copies K/V by TMA, which a packed walk cannot (variable clusters 1.16-1.23x faster
      unpacked; random 32-256-token blocks at 10% 1.18-1.30x faster packed).
    - Elsewhere the portable family: 128-row tiles over 4 warps, 64 keys a step, double
      buffered, at every head dim (1.14-1.22x faster than 64-row tiles at head dim 64); sm_86
      and sm_89 allow 99 KB of shared memory per CTA, too little for 128 rows at head dim 128,
      so they take 64-row tiles there, as do small query blocks (a 128-row tile would run half
      empty: such blocks rarely share key sets).
    - Restricted merges are off (``combine_threshold=0``): on the profiled and held-out masks
      they cost more in planning and kernel time than they saved.
    """
    small_blocks = q_block is not None and q_block <= 64
    if arch == 90:
        if small_blocks:
            pack = kv_bounds is not None and blocks_ragged(kv_bounds, 64)
            return Regime(family="sm90", block_m=64, num_warps=sm90_warps(64, 64, head_dim),
                          block_n=64, stages=3, combine_threshold=0.0, pack_keys=pack)
        if head_dim == 64:
            return SM90_ROWS64_D64
        return SM90_ROWS128
    if small_blocks or (arch in (86, 87, 89) and head_dim > 96):
        return Regime(block_m=64, num_warps=4, combine_threshold=0.0)
    return Regime(combine_threshold=0.0)


# one_ring_where_few_tasks' bound: rings keep their lead with at least this many tasks a ring
# (each ring a consumer warpgroup on its own tasks; with few a ring the last ones run alone on
# their SMs). Measured on the H200 at CogVideoX-5B's shape, requests (no task splitting), 4-48
# of its 48 heads (docs/decisions.md): the one-ring tiles ran 1.04-1.12x faster at 4 heads (~2
# tasks a ring), 1.00-1.08x at 6 (~3.2); the rings 0.94-1.03x at 8 (~4.2), 1.04-1.11x at 12+.
RINGS_MIN_TASKS = 4


def one_ring_where_few_tasks(regime: Regime, tasks: int, sm_count: int,
                             q_block: float) -> Regime:
    """``regime``, or its one-ring tiles where its rings would get fewer than
    :data:`RINGS_MIN_TASKS` tasks each (``tasks`` on ``sm_count`` SMs, one CTA an SM): 64x64
    tiles three CTAs an SM for 64-token query blocks, else 64x128 tiles two an SM (the
    shapes the rings were measured against). ``sm_count`` 0 (no GPU) keeps ``regime``."""
    # A packed walk is cp.async's, which runs one task a CTA whatever the warps.
    rings = 1 if regime.pack_keys or not regime.tma_capable else regime.rings
    if rings == 1 or sm_count <= 0 or tasks >= RINGS_MIN_TASKS * rings * sm_count:
        return regime
    block_n = 64 if q_block <= 64 else 128
    return regime.with_(block_n=block_n, num_warps=regime.block_m // ROW_GROUP + 4)


def blocks_ragged(bounds: np.ndarray, step: int) -> bool:
    """Whether the blocks of this geometry (key or query token ``bounds``) end mid-step (mid key
    step, mid tile) often enough for a walk or tiling that ignores block ends to pay: at least a
    tenth of them are not a multiple of ``step`` tokens and the median block is under two
    steps. Keys, measured on the H200 (docs/decisions.md): CogVideoX's
    top-k cubes (40% ragged at 64) ran 1.12x faster packed with 64-key steps; masks of
    128-token blocks ran the same either way. In computed pairs: top-k cubes (19-40% ragged)
    25-42% fewer, variable clusters 10-12%; sliding tiles of 288/384-token blocks ~1% (spans
    there run over several blocks), too little to be sure of."""
    return _blocks_ragged(bounds_key(bounds), int(step))


@functools.lru_cache(maxsize=64)  # asked on every request; a geometry's answer never changes
def _blocks_ragged(bounds: bytes, step: int) -> bool:
    sizes = _block_sizes(bounds)
    if sizes.size == 0:
        return False
    return bool(np.mean(sizes % step != 0) >= 0.1 and np.median(sizes) < 2 * step)


# align_may_pay's bound: plain tiles round the query blocks' rows up by at least this factor.
# On the H200's held-out masks (docs/decisions.md) aligned tiles won only on semantic clusters,
# whose rows 128-row tiles pad 1.27-1.32x (median block 257-289 tokens, above the two-tile
# median blocks_ragged asks of keys); sliding tiles of 192/384-token blocks (padded
# 1.08-1.18x) ran 1.14-1.32x slower aligned, and are not read for the estimate.
ALIGN_MIN_PADDING = 1.2


def align_may_pay(q_bounds: np.ndarray, tile_rows: int) -> bool:
    """Whether aligned tiles could pay for this query geometry, from the host bounds alone: a
    tiling cut from each block rounds the rows up by at least :data:`ALIGN_MIN_PADDING`
    (the gate of :func:`align_pays`, which then reads the mask)."""
    if isinstance(tile_rows, bool) or not isinstance(tile_rows, (int, np.integer)) \
            or tile_rows <= 0:
        raise ValueError(f"tile_rows must be a positive int, got {tile_rows!r}")
    return _tile_padding(bounds_key(q_bounds), int(tile_rows)) >= ALIGN_MIN_PADDING


@functools.lru_cache(maxsize=64)  # asked on every request; a geometry's answer never changes
def _tile_padding(bounds: bytes, tile_rows: int) -> float:
    sizes = _block_sizes(bounds)
    if sizes.size == 0 or sizes.sum() == 0:
        return 1.0
    return _tiled_rows(sizes, tile_rows) / float(sizes.sum())


# align_pays answers yes when the aligned tiling's estimated computed pairs are at most this
# fraction of the plain tiling's: the estimate (mapping.tiling_pairs) runs up to ~0.1 below the
# exact ratio (no chunk rounding), and at 0.8 it still separates the masks where aligned tiles
# won on the H200 (semantic clusters, 0.62-0.65: kernels 1.37-1.41x faster; the held-out
# corpus's larger clusters 0.77, requests 1.05-1.13x faster) from those where they lose (random
# 100-200-token blocks at density <= 0.6: estimate >= 0.9, exact >= 1.02; sliding tiles
# 0.92-1.02; held-out CogVideoX clusters, 0.80, tie: 0.99x).
ALIGN_MAX_PAIR_RATIO = 0.8


def align_pays(mask: Any, tile_rows: int) -> bool:
    """Whether aligned tiles (``Regime.align_tiles``) make ``mask``'s kernel clearly cheaper:
    query blocks that plain tiles pad (:func:`align_may_pay`, host bounds alone) and an
    aligned tiling computing at most :data:`ALIGN_MAX_PAIR_RATIO` of the plain one's pairs.
    Reads the selection: one kernel and one synchronization for a device mask (~0.2 ms of a
    request on the H200), paid only by padded query geometries. Semantic clusters on the H200
    (docs/decisions.md): kernel 1.41x (Wan) / 1.46x (CogVideoX) faster aligned, request 1.35x /
    1.43x with the estimate included."""
    if not align_may_pay(mask.q_bounds, tile_rows):
        return False
    pairs = mapping.tiling_pairs(mask, tile_rows)
    return pairs is not None and pairs[0] > 0 and pairs[1] <= ALIGN_MAX_PAIR_RATIO * pairs[0]


# pack_pays answers yes when the span-by-span key walk takes at least this many times the
# chunks of the packed one. Measured on the H200 with 128-key steps (docs/decisions.md): random
# variable blocks of 32-256 tokens at 10%, 1.30x more chunks span by span, ran 1.30x (Wan,
# 128-row tiles) / 1.18x (CogVideoX, 64-row) faster packed; the semantic clusters, 1.11-1.14x,
# ran 1.16-1.23x faster span by span (whose chunks the TMA producer copies).
PACK_MIN_CHUNK_RATIO = 1.25


def pack_pays(mask: Any, block_n: int, tile_rows: int) -> bool:
    """Whether the packed key walk (``Regime.pack_keys``) pays for the sm90 regime of
    ``tile_rows``-row tiles and ``block_n``-key steps: key blocks ragged against the step
    (:func:`blocks_ragged`, host bounds alone) and the span-by-span walk taking at least
    :data:`PACK_MIN_CHUNK_RATIO` times the packed walk's chunks (mapping.key_walk_chunks;
    a synchronization for a device mask, paid only by ragged key geometries)."""
    if not blocks_ragged(mask.kv_bounds, block_n):
        return False
    chunks = mapping.key_walk_chunks(mask, block_n, tile_rows)
    return chunks is not None and chunks[1] > 0 and chunks[0] >= PACK_MIN_CHUNK_RATIO * chunks[1]


def sm90_producer(block_m: int, block_n: int, head_dim: int) -> bool:
    """Whether the sm90 regime of this tile shape takes a producer warpgroup, as
    :func:`default_regime` and the profiled candidates do (64-row tiles: at head dims 64 and
    128, where two or three CTAs an SM were measured faster with one)."""
    return block_m == 128 or head_dim in (64, 128)


def sm90_warps(block_m: int, block_n: int, head_dim: int) -> int:
    """Warps of the sm90 regime of this tile shape, as :func:`default_regime` and the profiled
    candidates take it: the rows' warps, in four rings for 64x64 tiles at head dim 64
    (sm90/traits.cuh RINGS: the TMA form's; a packed walk, copied by cp.async, runs one ring
    a CTA, Regime.variant), plus a producer warpgroup where :func:`sm90_producer` says (the
    three-CTA form of those tiles measured 1.06-1.08x slower on CogVideoX: docs/decisions.md)."""
    rings = 4 if (block_m, block_n, head_dim) == (64, 64, 64) else 1
    return block_m // ROW_GROUP * rings + (4 if sm90_producer(block_m, block_n, head_dim) else 0)


def typical_q_block(q_bounds: np.ndarray) -> float:
    """The median query block of a mask's geometry (cached: every request of a model asks it of
    the same few geometries, and a median costs ~30 us)."""
    return _median_block(bounds_key(q_bounds))


@functools.lru_cache(maxsize=64)
def _median_block(bounds: bytes) -> float:
    return float(np.median(_block_sizes(bounds)))
