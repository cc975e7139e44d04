"""Regimes: whole execution plans (kernel variant, tile shape, mapping and split policy).

A regime is a small frozen value so it can be named, compared, stored in a table and passed to
``tessera.plan(..., regime=...)``.

Selection (``tessera.plan(..., regime=None)``, :func:`select_regime`):

1. A regime table in force for the plan's architecture (:func:`active_table`): chosen by
   :func:`use_table`, else by ``$TESSERA_REGIME_TABLE`` (a file; ``none`` for no table), else
   ``tables/<gpu-slug>.json`` beside the package (``"NVIDIA H200"`` -> ``nvidia-h200.json``)
   when it exists. Tables are written offline by ``python -m tessera profile``
   (tessera/runtime/profile.py).

   The table is consulted where its choice matters: when the heuristic regime's plan may split
   tasks (``tasks.may_split``: shapes with fewer than 16 tasks per slot of the GPU -- few heads,
   short clips -- whose plans synchronize once anyway). There the mask's :class:`MaskFeatures`
   (one kernel and a 16-byte copy on the device) are looked up (:meth:`RegimeTable.lookup`);
   the H200 table picks within 5% of the oracle on 91% of held-out 4-head masks, 1.09x faster
   than the heuristic. At the models' full head counts no task may split, the plan needs no
   synchronization, and the heuristic is kept: profiled at those head counts the table's
   picks equal the heuristic's (x1.000 over 32 held-out masks, 97% within 5% of the oracle,
   benchmarks/RESULTS.md, sixth session), so measuring the mask there would only cost a
   synchronization.
2. Otherwise, or when the table has no entry for the head dim / dtype / geometry, the
   documented heuristic :func:`default_regime`. Plans without an architecture (``arch=None``
   with a host mask: a CPU-only machine) always take the heuristic. A table that is corrupt or
   was profiled on another GPU warns once and is ignored: planning never fails because of one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import re
import tempfile
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .mapping import tiling_pairs

__all__ = ["Regime", "default_regime", "ROW_GROUP", "candidate_regimes", "MaskFeatures",
           "MaskMeasures", "mask_features", "mask_measures", "RegimeTable", "use_table",
           "active_table", "select_regime", "selected_regime", "gpu_slug", "TABLES_DIR",
           "ENV_TABLE", "tasks_in_flight", "device_arch", "device_sm_count"]

# Rows one warp owns in every kernel family (the M of one mma.sync / a quarter of a wgmma M=64).
# Row groups with no valid row may skip their matrix work (the portable kernel skips per warp of
# 16 or 32 rows), so stats count computed pairs per group: an approximation of what runs.
ROW_GROUP = 16
# Kernel families: "sm80" (mma.sync, every target) and "sm90" (wgmma, Hopper only).
KNOWN_FAMILIES = ("sm80", "sm90")


@dataclass(frozen=True)
class Regime:
    """One execution plan.

    Attributes:
        family: kernel family ("sm80": mma.sync, runs on sm_80 and newer; "sm90": wgmma,
            sm_90 only, 64 rows per warpgroup of 4 warps, 64 or 128 keys a step; four more
            warps than the rows need select its warp-specialized variant).
        block_m: physical tile rows (BM) per task; with GQA packing, shared by the packed heads.
        block_n: keys consumed per inner step (BN); key spans are walked BN keys at a time.
        num_warps: warps per CTA; each owns ``block_m / num_warps`` rows, 16 or 32 (two row
            tiles per warp halve the shared-memory traffic per matrix operation).
        stages: depth of the K/V copy pipeline.
        combine_threshold: merge two adjacent short query groups with different key sets when the
            masked work the merge adds is at most this fraction of their useful work.
        split_ratio: split a task whose key chunks exceed ``split_ratio`` x the mean task ...
        min_split_chunks: ... and exceed this many chunks (short rows are never split).
        pack_gqa: put the query heads that share a key/value head (and a mask head) in one task.
        pack_keys: sm90 only: walk each task's keys end to end, BN at a time, so that spans
            shorter than BN (small or edge blocks) share chunks instead of costing one each.
            Needs combine_threshold 0 (one row restriction per task); such plans never split.
        align_tiles: tiles at multiples of block_m query tokens, straddling query-block
            boundaries (each span restricted to the rows that select it), instead of tiles cut
            from each block: for variable blocks that do not fill whole tiles and share most
            keys with their neighbours (clusters). Needs combine_threshold 0 and no pack_keys.
            The default plan on sm_90 sets it where :func:`align_pays` (:func:`select_regime`).
        wide_steps: sm90, 128x128 tiles with the producer, head dim 64, TMA copies: tasks of at
            most four long spans step 192 keys at a time (bsa_sm90.cu ``TESSERA_WIDE_BN``;
            other variants ignore it). Off by default: on the H200 it ran dense CogVideoX ~3%
            faster than without, random and spatial-temporal masks 3-8% slower (its stages
            hold 192 keys; benchmarks/RESULTS.md, thirteenth session).
    """

    family: str = "sm80"
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    stages: int = 2
    combine_threshold: float = 0.3
    split_ratio: float = 4.0
    min_split_chunks: int = 16
    pack_gqa: bool = True
    pack_keys: bool = False
    align_tiles: bool = False
    wide_steps: bool = False

    def __post_init__(self) -> None:
        if self.block_m % ROW_GROUP or self.block_m <= 0:
            raise ValueError(f"block_m must be a positive multiple of {ROW_GROUP}, "
                             f"got {self.block_m}")
        if self.block_n % 16 or self.block_n <= 0:
            raise ValueError(f"block_n must be a positive multiple of 16, got {self.block_n}")
        if self.family != "sm90" and (self.num_warps <= 0 or self.block_m not in (
                self.num_warps * ROW_GROUP, 2 * self.num_warps * ROW_GROUP)):
            raise ValueError(f"block_m={self.block_m} must be 16 or 32 rows per warp "
                             f"(num_warps={self.num_warps})")
        if self.combine_threshold < 0 or self.split_ratio < 1 or self.min_split_chunks < 1:
            raise ValueError("combine_threshold >= 0, split_ratio >= 1 and min_split_chunks >= 1")
        if self.family not in KNOWN_FAMILIES:
            raise ValueError(f"family must be one of {list(KNOWN_FAMILIES)}, got {self.family!r}")
        if self.family == "sm90" and (self.block_m not in (64, 128, 192)
                                      or self.num_warps not in (self.block_m // ROW_GROUP,
                                                                self.block_m // ROW_GROUP + 4)
                                      or self.block_n not in (64, 128)
                                      or (self.block_m == 192 and not self.producer)):
            raise ValueError(f"the sm90 family takes block_m 64 or 128 (192: with the producer "
                             f"warpgroup) with one warp per 16 rows (plus 4 for a producer "
                             f"warpgroup) and block_n 64 or 128, got "
                             f"{self.block_m}x{self.block_n} with {self.num_warps} warps")
        if self.family == "sm90" and self.stages < 3:
            raise ValueError(f"the sm90 family needs stages >= 3, got {self.stages}")
        if self.pack_keys and (self.family != "sm90" or self.combine_threshold != 0):
            raise ValueError("pack_keys needs the sm90 family and combine_threshold 0 (one row "
                             f"restriction per task), got {self.family} with "
                             f"combine_threshold={self.combine_threshold}")
        if self.wide_steps and (self.family, self.block_m, self.block_n, self.producer) != (
                "sm90", 128, 128, True):
            raise ValueError("wide_steps needs the sm90 family's 128x128 tiles with the producer "
                             f"warpgroup, got {self.family}_{self.block_m}x{self.block_n} with "
                             f"{self.num_warps} warps")
        if self.align_tiles and (self.combine_threshold != 0 or self.pack_keys):
            raise ValueError("align_tiles needs combine_threshold 0 and pack_keys False (its "
                             "tiles carry their own row restrictions)")

    @property
    def name(self) -> str:
        """A stable name, e.g. ``sm80_128x64_w8_s2``; policy fields are listed when not default."""
        base = f"{self.family}_{self.block_m}x{self.block_n}_w{self.num_warps}_s{self.stages}"
        extras = [f"{k}={v}" for k, v in asdict(self).items()
                  if k not in ("family", "block_m", "block_n", "num_warps", "stages")
                  and v != getattr(Regime, k)]
        return base + ("[" + ",".join(extras) + "]" if extras else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - regimes are few and immutable
    def variant(self, head_dim: int, bf16: bool = True, tma: bool = False):
        """The attention kernel variant (``tessera.cuda.loader.Variant``) this regime runs;
        ``tma``: its TMA-copying form (producer regimes of the span-by-span walk, when the
        launch can describe the operands: ``tma_capable``)."""
        from ..cuda.loader import Variant  # noqa: PLC0415 - no CuPy needed

        if self.family == "sm90":
            return Variant.bsa_sm90(block_m=self.block_m, block_n=self.block_n,
                                    head_dim=head_dim, stages=self.stages, bf16=bf16,
                                    producer=self.producer, pack_keys=self.pack_keys, tma=tma,
                                    wide=self.wide_steps)
        return Variant.bsa_sm80(block_m=self.block_m, block_n=self.block_n, head_dim=head_dim,
                                num_warps=self.num_warps, stages=self.stages, bf16=bf16)

    @property
    def tma_capable(self) -> bool:
        """Whether this regime's kernel has a TMA-copying form (variant(..., tma=True))."""
        return self.producer and not self.pack_keys

    @property
    def producer(self) -> bool:
        """sm90 only: a producer warpgroup does the copies (four warps beyond the rows' own)."""
        return self.family == "sm90" and self.num_warps == self.block_m // ROW_GROUP + 4

    def runs_on(self, arch: int | None) -> bool:
        """Whether this regime's family runs on compute capability ``arch`` (None: any GPU)."""
        return self.family != "sm90" or arch == 90

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Regime":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"regime: unknown fields {sorted(unknown)}")
        return cls(**d)

    def with_(self, **changes: Any) -> "Regime":
        return replace(self, **changes)


# sm_90's regimes for blocks of 128 tokens and more: 128-row tiles warp-specialized (two consumer
# warpgroups and a producer), 128 keys a step, three stages; at head dim 64 64-row tiles with a
# producer, two CTAs an SM, each on its own tasks (default_regime says why).
SM90_ROWS128 = Regime(family="sm90", block_m=128, num_warps=128 // ROW_GROUP + 4, block_n=128,
                      stages=3, combine_threshold=0.0)
SM90_ROWS64_D64 = Regime(family="sm90", block_m=64, num_warps=64 // ROW_GROUP + 4, block_n=128,
                         stages=3, combine_threshold=0.0)


def default_regime(arch: int | None = None, head_dim: int = 128,
                   q_block: float | None = None, kv_bounds: np.ndarray | None = None) -> Regime:
    """The heuristic regime for a GPU with compute capability ``arch`` (e.g. 90), or None (CPU).

    Hopper (sm_90) takes the warp-specialized wgmma variant: 128-row tiles (two consumer
    warpgroups and a producer warpgroup), 128 keys a step, three K/V stages — the fastest sm90
    shape for head dim 128 on the H200 (benchmarks/RESULTS.md, fourth session). At head dim 64
    64-row tiles with 128-key steps and a producer warpgroup, two CTAs an SM, each running its
    own tasks: as fast or faster than the 128-row tiles on every CogVideoX mask measured (1-3%,
    random 10% 2-7%; H200, sixteenth session) -- the 128-row ones still take aligned tiles
    (:func:`select_regime`). Masks of small query blocks take 64-row tiles and 64 keys a step
    (key spans of 64-token blocks would leave half of a 128-key step masked), at head dim 128
    with a producer warpgroup, two CTAs an SM (Wan's top-k cubes 1.2-1.3x faster than without
    a producer, H200, fourteenth session); head dims 64 and 96 keep the plain variant (at 64
    the producer form ran CogVideoX's cubes only 1-3% faster, within the drift between machine
    starts, fifteenth session -- before the sixteenth's packed-walk changes; 96 not measured).
    Elsewhere the portable family: 128-row tiles over 4 warps (32 rows each), 64 keys a step, double
    buffered, at every head dim: since the kernel stopped predicating its mma.sync per row tile,
    the 128-row tile runs head dim 64 1.14-1.22x faster than the 64-row one it used to take
    there (CogVideoX at 10%, 30% and dense; H200, benchmarks/RESULTS.md, eleventh session).
    sm_86/sm_89 allow 99 KB of shared memory per CTA, too little for the 128-row tile at head
    dim 128, so they take 64-row tiles there. Masks whose query blocks are mostly 64 tokens
    or fewer (``q_block``: the median query block size) take 64-row tiles as well: such blocks
    rarely share key sets, so a 128-row tile would run half empty. Restricted merges are off
    (``combine_threshold=0``): over the 72 profiled and 32 held-out masks on the H200 they
    lost more in planning and kernel time than they saved (benchmarks/RESULTS.md).
    On sm_90, masks of small blocks whose key geometry ``kv_bounds`` is ragged against the key
    step (:func:`blocks_ragged`: pooled top-k cubes with their edge cubes) take the packed key walk
    (``pack_keys``): walked span by span, each short span would cost a whole step. The 128-row
    regime never packs: its span-by-span walk copies K/V by TMA (a packed walk cannot), which
    ran the variable clusters 1.16-1.23x faster than packing them (H200, ninth session);
    whether it also aligns its tiles depends on the selection, which :func:`select_regime`
    asks (:func:`align_pays`).
    """
    small_blocks = q_block is not None and q_block <= 64
    if arch == 90:
        if small_blocks:
            pack = kv_bounds is not None and blocks_ragged(kv_bounds, 64)
            # At head dim 128 a producer warpgroup per 64-row CTA, two CTAs an SM.
            producer = _sm90_producer(64, 64, head_dim)
            return Regime(family="sm90", block_m=64, num_warps=4 + 4 * producer, block_n=64,
                          stages=3, combine_threshold=0.0, pack_keys=pack)
        if head_dim == 64:
            return SM90_ROWS64_D64
        return SM90_ROWS128
    if small_blocks or (arch in (86, 87, 89) and head_dim > 96):
        return Regime(block_m=64, num_warps=4, combine_threshold=0.0)
    return Regime(combine_threshold=0.0)


def blocks_ragged(bounds: np.ndarray, step: int) -> bool:
    """Whether the blocks of this geometry (key or query token ``bounds``) end mid-step (mid key
    step, mid tile) often enough for a walk or tiling that ignores block ends to pay: at least a
    tenth of them are not a multiple of ``step`` tokens and the median block is under two
    steps. Keys, measured on the H200 (benchmarks/RESULTS.md, eighth session): CogVideoX's
    top-k cubes (40% ragged at 64) ran 1.12x faster packed with 64-key steps; masks of
    128-token blocks ran the same either way. In computed pairs: top-k cubes (19-40% ragged)
    25-42% fewer, variable clusters 10-12%; sliding tiles of 288/384-token blocks ~1% (spans
    there run over several blocks), too little to be sure of. Queries: the gate of
    :func:`align_pays`."""
    return _blocks_ragged(np.asarray(bounds, dtype=np.int64).tobytes(), int(step))


@functools.lru_cache(maxsize=64)  # asked on every request; a geometry's answer never changes
def _blocks_ragged(bounds: bytes, step: int) -> bool:
    sizes = np.diff(np.frombuffer(bounds, dtype=np.int64))
    if sizes.size == 0:
        return False
    return bool(np.mean(sizes % step != 0) >= 0.1 and np.median(sizes) < 2 * step)


# align_pays answers yes when the aligned tiling's estimated computed pairs are at most this
# fraction of the plain tiling's: the estimate (mapping.tiling_pairs) runs up to ~0.1 below the
# exact ratio (no chunk rounding), and at 0.8 it still separates the masks where aligned tiles
# won on the H200 (semantic clusters, 0.62-0.65: kernels 1.37-1.41x faster) from those where
# they lose (random 100-200-token blocks at density <= 0.6: estimate >= 0.9, exact >= 1.02).
ALIGN_MAX_PAIR_RATIO = 0.8


def align_pays(mask: Any, tile_rows: int) -> bool:
    """Whether aligned tiles (``Regime.align_tiles``) make ``mask``'s kernel clearly cheaper:
    query blocks ragged against the tile (:func:`blocks_ragged`, host bounds alone) and an
    aligned tiling computing at most :data:`ALIGN_MAX_PAIR_RATIO` of the plain one's pairs.
    Reads the selection: one kernel and one synchronization for a device mask (~0.2 ms of a
    request on the H200), paid only by ragged query geometries. Semantic clusters on the H200
    (tenth session): kernel 1.41x (Wan) / 1.46x (CogVideoX) faster aligned, request 1.35x /
    1.43x with the estimate included."""
    if not blocks_ragged(mask.q_bounds, tile_rows):
        return False
    pairs = tiling_pairs(mask, tile_rows)
    return pairs is not None and pairs[0] > 0 and pairs[1] <= ALIGN_MAX_PAIR_RATIO * pairs[0]


# ================================================================================ candidates
# Largest dynamic shared memory one CTA may use, in KiB, per compute capability (CUDA
# programming guide, "Technical specifications"). Unknown architectures get the smallest.
SMEM_LIMIT_KIB = {80: 163, 87: 163, 90: 227, 100: 227, 103: 227, 86: 99, 89: 99, 120: 99,
                  121: 99}
_SMEM_FALLBACK_KIB = 99

# The space the profiler measures: 2 x 2 x 3 x 2 = 24 sm80 regimes, as many sm90 ones on sm_90.
CANDIDATE_BLOCK_M = (64, 128)
CANDIDATE_BLOCK_N = (32, 64)
CANDIDATE_SPLIT_RATIO = (2.0, 4.0, 1e9)  # 1e9: never split
CANDIDATE_COMBINE = (0.0, 0.3)
CANDIDATE_WARPS = 4
CANDIDATE_SM90_BLOCK_N = (64, 128)


def smem_limit_bytes(arch: int | None) -> int:
    """Dynamic shared memory per CTA on compute capability ``arch`` (None: the smallest, 99 KiB)."""
    return SMEM_LIMIT_KIB.get(arch, _SMEM_FALLBACK_KIB) * 1024  # type: ignore[arg-type]


def regime_fits(regime: Regime, head_dim: int, arch: int | None) -> bool:
    """Whether ``regime``'s kernel variant needs no more shared memory than ``arch`` allows."""
    from ..cuda.loader import smem_bytes  # noqa: PLC0415 - no CuPy needed

    return smem_bytes(regime.variant(head_dim)) <= smem_limit_bytes(arch)


@functools.lru_cache(maxsize=256)  # on every plan for the current GPU: cache the arithmetic
def tasks_in_flight(regime: Regime, head_dim: int, arch: int | None, sm_count: int) -> int:
    """How many of ``regime``'s tasks a GPU with ``sm_count`` SMs of ``arch`` runs at once.

    An estimate from shared memory (each resident CTA also takes 1 KiB the driver reserves),
    threads (2048 per SM) and, for the persistent sm90 variant, the register file (split for
    ``min_blocks`` CTAs); the split rule (``tasks.split_limit``) only needs the right order
    of magnitude.
    """
    from ..cuda.loader import smem_bytes  # noqa: PLC0415 - no CuPy needed

    v = regime.variant(head_dim)
    per_sm_smem = smem_limit_bytes(arch) + 1024
    by_smem = per_sm_smem // (smem_bytes(v) + 1024)
    by_regs = v.min_blocks if v.persistent else by_smem
    return int(sm_count * max(1, min(by_smem, by_regs, 2048 // v.threads)))


def _sm90_producer(block_m: int, block_n: int, head_dim: int) -> bool:
    """Whether the sm90 regime of this tile shape takes a producer warpgroup, as
    :func:`default_regime` and the profiled candidates do (64-row tiles: where two CTAs an SM
    were measured faster with one)."""
    return block_m == 128 or head_dim == 128 or (head_dim == 64 and block_n == 128)


def candidate_regimes(head_dim: int, arch: int | None,
                      kernel_families: Sequence[str] | None = None,
                      combine_thresholds: Sequence[float] | None = None) -> list[Regime]:
    """The regimes worth profiling for ``head_dim`` on compute capability ``arch`` (only those
    of ``kernel_families``, e.g. ``("sm90",)``, and of ``combine_thresholds``, e.g. ``(0.0,)``,
    when given).

    The sm80 family with 4 warps: 64- or 128-row tiles (16 or 32 rows a warp, the two shapes the
    kernel supports at 4 warps), 32 or 64 keys a step, double buffered; on sm_90 also the sm90
    family, 64-row tiles on one warpgroup (with a producer warpgroup at head dim 128, and for
    128-key steps at 64) or 128-row tiles warp-specialized, 64 or 128 keys a step, three
    stages; split policy 2x or 4x the mean task, or never (1e9); combine threshold 0 (merge
    only identical key sets) or 0.3. Variants whose shared memory exceeds ``arch``'s per-CTA
    limit are left out. The order is stable (tile shape, then split, then combine), so names
    index the list reproducibly.
    """
    shapes = [dict(block_m=bm, block_n=bn, num_warps=CANDIDATE_WARPS)
              for bm in CANDIDATE_BLOCK_M for bn in CANDIDATE_BLOCK_N]
    if arch == 90:
        # 64-row tiles plain (one warpgroup) -- with a producer warpgroup, two CTAs an SM, as
        # default_regime takes them at head dim 128 and for 128-key steps at 64 --, 128-row
        # tiles warp-specialized (the plain 128-row variant was slower on every swept mask:
        # benchmarks/RESULTS.md).
        shapes += [dict(family="sm90", block_m=bm, block_n=bn,
                        num_warps=bm // ROW_GROUP + (4 if _sm90_producer(bm, bn, head_dim) else 0))
                   for bm in CANDIDATE_BLOCK_M for bn in CANDIDATE_SM90_BLOCK_N]
    out = []
    for shape in shapes:
        for split in CANDIDATE_SPLIT_RATIO:
            for comb in CANDIDATE_COMBINE:
                stages = 3 if shape.get("family") == "sm90" else 2
                r = Regime(**shape, stages=stages, split_ratio=split, combine_threshold=comb)
                if (regime_fits(r, head_dim, arch)
                        and (kernel_families is None or r.family in kernel_families)
                        and (combine_thresholds is None or comb in combine_thresholds)):
                    out.append(r)
    return out


# ================================================================================ features
SEQ_BUCKETS = ("<=16k", "<=32k", "<=64k", "<=128k", ">128k")
_SEQ_EDGES = (16384, 32768, 65536, 131072)  # inclusive upper edges
DENSITY_BUCKETS = ("0-5%", "5-15%", "15-30%", "30-60%", "60-100%")
_DENSITY_EDGES = (0.05, 0.15, 0.30, 0.60)  # exclusive upper edges
IMBALANCE_BUCKETS = ("<1.5", "1.5-3", ">=3")
_IMBALANCE_EDGES = (1.5, 3.0)  # exclusive upper edges
BATCH_HEADS_BUCKETS = ("<=16", "17-64", ">64")
_BATCH_HEADS_EDGES = (16, 64)  # inclusive upper edges
BLOCK_BUCKETS = ("64", "128", "256", "384+")
_BLOCK_EDGES = (64, 128, 256)  # inclusive upper edges
FEATURE_DTYPES = ("bfloat16", "float16")
_GEOMETRY = re.compile(r"^(uniform-(64|128|256|384\+)x(64|128|256|384\+)|"
                       r"variable-(64|128|256|384\+))$")


def _bucket(value: float, edges: tuple, labels: tuple, inclusive: bool) -> str:
    for edge, label in zip(edges, labels):
        if value <= edge if inclusive else value < edge:
            return label
    return labels[-1]


def block_bucket(tokens: float) -> str:
    """A block size in tokens as one of ``64``, ``128``, ``256``, ``384+`` (upper edges)."""
    return _bucket(tokens, _BLOCK_EDGES, BLOCK_BUCKETS, True)


@dataclass(frozen=True)
class MaskMeasures:
    """The raw numbers behind :class:`MaskFeatures` (what the profiler records beside them).

    ``density`` counts selected (query, key) token pairs over all pairs; ``imbalance`` is the
    heaviest logical row's pairs over the mean row's (rows: (batch, head, query block) as
    stored); ``q_block`` the median query block size; ``uniform`` the ``(q, kv)`` block size
    when the geometry is uniform (the last block may be short), else None.
    """

    seq_len: int
    density: float
    imbalance: float
    q_block: float
    uniform: tuple[int, int] | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["uniform"] = list(self.uniform) if self.uniform else None
        return d


@dataclass(frozen=True)
class MaskFeatures:
    """The cheap mask and shape features a regime table is indexed by (all categorical).

    ``geometry`` is ``uniform-<q>x<kv>`` (block sizes bucketed to 64/128/256/384+) or
    ``variable-<q>`` (the median query block, bucketed); the other fields are bucket labels of
    :data:`SEQ_BUCKETS`, :data:`DENSITY_BUCKETS`, :data:`IMBALANCE_BUCKETS` and
    :data:`BATCH_HEADS_BUCKETS`. :meth:`key` is the stable string a table stores.
    """

    arch: int
    head_dim: int
    dtype: str
    geometry: str
    seq_len: str
    density: str
    imbalance: str
    batch_heads: str

    def key(self) -> str:
        """E.g. ``sm90/d128/bfloat16/uniform-128x128/L<=32k/p5-15%/r<1.5/bh<=16``."""
        return (f"sm{self.arch}/d{self.head_dim}/{self.dtype}/{self.geometry}/L{self.seq_len}"
                f"/p{self.density}/r{self.imbalance}/bh{self.batch_heads}")

    @classmethod
    def from_key(cls, key: str) -> "MaskFeatures":
        """Parse :meth:`key` back (``ValueError`` when it is not one)."""
        m = re.fullmatch(r"sm(\d+)/d(\d+)/(\w+)/([\w+-]+)/L(.+)/p(.+)/r(.+)/bh(.+)", key)
        if not m:
            raise ValueError(f"not a feature key: {key!r}")
        return cls.from_dict(dict(arch=int(m.group(1)), head_dim=int(m.group(2)),
                                  dtype=m.group(3), geometry=m.group(4), seq_len=m.group(5),
                                  density=m.group(6), imbalance=m.group(7),
                                  batch_heads=m.group(8)))

    @property
    def group(self) -> tuple[int, int, str, str]:
        """What a nearest-entry lookup must match exactly: arch, head dim, dtype, geometry."""
        return (self.arch, self.head_dim, self.dtype, self.geometry)

    @property
    def bucket_index(self) -> tuple[int, int, int, int]:
        """Positions of the density, seq-len, imbalance and batch x heads buckets (for
        distances; in that order of priority)."""
        return (DENSITY_BUCKETS.index(self.density), SEQ_BUCKETS.index(self.seq_len),
                IMBALANCE_BUCKETS.index(self.imbalance),
                BATCH_HEADS_BUCKETS.index(self.batch_heads))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "MaskFeatures":
        """Parse and validate (``ValueError`` naming the field on any problem)."""
        if not isinstance(d, dict):
            raise ValueError(f"features must be an object, got {type(d).__name__}")
        fields = set(cls.__dataclass_fields__)
        unknown, missing = set(d) - fields, fields - set(d)
        if unknown:
            raise ValueError(f"features: unknown fields {sorted(unknown)}")
        if missing:
            raise ValueError(f"features: missing fields {sorted(missing)}")
        for name in ("arch", "head_dim"):
            v = d[name]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"features: {name} must be a positive int, got {v!r}")
        allowed = {"dtype": FEATURE_DTYPES, "seq_len": SEQ_BUCKETS, "density": DENSITY_BUCKETS,
                   "imbalance": IMBALANCE_BUCKETS, "batch_heads": BATCH_HEADS_BUCKETS}
        for name, labels in allowed.items():
            if d[name] not in labels:
                raise ValueError(f"features: {name} must be one of {list(labels)}, "
                                 f"got {d[name]!r}")
        if not isinstance(d["geometry"], str) or not _GEOMETRY.match(d["geometry"]):
            raise ValueError("features: geometry must be 'uniform-<q>x<kv>' or 'variable-<q>' "
                             f"with sizes in {list(BLOCK_BUCKETS)}, got {d['geometry']!r}")
        return cls(**d)


def mask_measures(mask: Any) -> MaskMeasures:
    """Sequence length, token-pair density, row imbalance and block geometry of ``mask``.

    Works where the mask lives. On the device the per-row reductions run there and two numbers
    (total and heaviest row pairs) come back: one synchronization, no copy of the mask; a mask
    with dense rows (built from a dense matrix) takes one kernel for it
    (:func:`~tessera.runtime.mapping.mask_pairs_on_device`). On the host a mask built from a
    dense matrix whose CSR arrays were never derived is measured from its dense rows (the CSR
    is not derived for this).
    """
    from .._array import to_numpy  # noqa: PLC0415
    from .mapping import _use_device_planner, mask_pairs_on_device  # noqa: PLC0415

    xp = mask.xp
    dense = mask.dense_rows
    if dense is not None and _use_device_planner(xp):
        return _measures(mask, *mask_pairs_on_device(mask, dense))
    qlen = np.diff(mask.q_bounds)
    klen = np.diff(mask.kv_bounds)
    n_bh = mask.batch_heads[0] * mask.batch_heads[1]
    if mask._indptr is None and dense is not None:
        if np.all(klen[:-1] == klen[0]):  # uniform key blocks: counts, corrected for the last
            keys = dense.sum(axis=1, dtype=np.int64) * int(klen[0])
            if klen[-1] != klen[0]:
                keys = keys + (int(klen[-1]) - int(klen[0])) * dense[:, -1].astype(np.int64)
        else:  # exact in float64 for any realistic sequence length (< 2**53 keys)
            w = xp.asarray(klen.astype(np.float64))
            keys = xp.rint(dense.astype(np.float64) @ w).astype(np.int64)
        pairs = keys * xp.tile(xp.asarray(qlen), n_bh)
    else:
        pairs = mask.row_pairs()
    total, heaviest = (int(x) for x in to_numpy(xp.stack([pairs.sum(), pairs.max()])))
    return _measures(mask, total, heaviest)


def _measures(mask: Any, total: int, heaviest: int) -> MaskMeasures:
    """:class:`MaskMeasures` from the mask's geometry and its total / heaviest-row pairs."""
    qlen = np.diff(mask.q_bounds)
    n_bh = mask.batch_heads[0] * mask.batch_heads[1]
    n_rows = n_bh * qlen.size
    lq, lkv = int(mask.q_bounds[-1]), int(mask.kv_bounds[-1])
    density = total / (n_bh * lq * lkv)
    imbalance = heaviest * n_rows / total if total else 1.0
    return MaskMeasures(seq_len=max(lq, lkv), density=density, imbalance=imbalance,
                        q_block=float(np.median(qlen)), uniform=mask.uniform_block_size())


def features_from_measures(m: MaskMeasures, *, head_dim: int, dtype: str, arch: int,
                           num_q_heads: int, batch: int) -> MaskFeatures:
    """Bucket :class:`MaskMeasures` (plus the attention shape) into :class:`MaskFeatures`."""
    if m.uniform is not None:
        geometry = f"uniform-{block_bucket(m.uniform[0])}x{block_bucket(m.uniform[1])}"
    else:
        geometry = f"variable-{block_bucket(m.q_block)}"
    return MaskFeatures(
        arch=int(arch), head_dim=int(head_dim), dtype=dtype, geometry=geometry,
        seq_len=_bucket(m.seq_len, _SEQ_EDGES, SEQ_BUCKETS, True),
        density=_bucket(m.density, _DENSITY_EDGES, DENSITY_BUCKETS, False),
        imbalance=_bucket(m.imbalance, _IMBALANCE_EDGES, IMBALANCE_BUCKETS, False),
        batch_heads=_bucket(batch * num_q_heads, _BATCH_HEADS_EDGES, BATCH_HEADS_BUCKETS, True))


def mask_features(mask: Any, *, head_dim: int, dtype: Any, arch: int, num_q_heads: int,
                  batch: int) -> MaskFeatures:
    """The table features of planning ``mask`` for this attention shape on ``arch``.

    Cheap: a few reductions where the mask lives and one small transfer (see
    :func:`mask_measures`); the mask itself is never copied to the host.
    """
    from .plan import _dtype_name  # noqa: PLC0415 - plan imports this module

    return features_from_measures(mask_measures(mask), head_dim=head_dim,
                                  dtype=_dtype_name(dtype), arch=arch,
                                  num_q_heads=num_q_heads, batch=batch)


# ================================================================================ tables
TABLE_FORMAT = "tessera-regime-table"
TABLE_VERSION = 1
ENTRY_REQUIRED = ("features", "regime", "ms", "oracle_ms")
ENV_TABLE = "TESSERA_REGIME_TABLE"
# Committed tables live in tables/ beside the package (the repository root).
TABLES_DIR = Path(__file__).resolve().parents[2] / "tables"


def gpu_slug(name: str) -> str:
    """A file-name slug of a GPU name: ``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _check_regime_dict(d: Any) -> Regime:
    if not isinstance(d, dict):
        raise ValueError(f"regime must be an object, got {type(d).__name__}")
    unknown = set(d) - set(Regime.__dataclass_fields__)
    if unknown:
        raise ValueError(f"regime: unknown fields {sorted(unknown)}")
    defaults = Regime()
    for name, v in d.items():
        want = type(getattr(defaults, name))
        if want is bool:
            ok = isinstance(v, bool)
        elif want is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        elif want is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, want)
        if not ok:
            raise ValueError(f"regime: {name} must be {want.__name__}, got {v!r}")
    try:
        return Regime.from_dict(d)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"regime: {exc}") from None


# Smoothed lookup: one step of geometry (uniform vs variable, or one block-size bucket) counts
# as this many bucket steps of the other features (leave-one-out on the H200 table).
GEOMETRY_STEP = 3
ALL_GEOMETRIES = tuple([f"uniform-{q}x{k}" for q in BLOCK_BUCKETS for k in BLOCK_BUCKETS]
                       + [f"variable-{q}" for q in BLOCK_BUCKETS])


def _geometry_position(geometry: str) -> tuple[int, int, int]:
    """(variable?, query block bucket, key block bucket) of a geometry label, for distances
    (a variable geometry's key bucket is taken equal to its query bucket)."""
    kind, sizes = geometry.split("-", 1)
    q, _, k = sizes.partition("x")
    qi = BLOCK_BUCKETS.index(q)
    return (int(kind == "variable"), qi, BLOCK_BUCKETS.index(k) if k else qi)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def regime_from_name(name: str) -> Regime | None:
    """Parse :attr:`Regime.name` (``sm80_128x64_w4_s2[split_ratio=2.0]``) back into a regime;
    None when the name is not one."""
    m = re.fullmatch(r"(\w+?)_(\d+)x(\d+)_w(\d+)_s(\d+)(?:\[(.*)\])?", name)
    if not m:
        return None
    fields: dict[str, Any] = dict(family=m.group(1), block_m=int(m.group(2)),
                                  block_n=int(m.group(3)), num_warps=int(m.group(4)),
                                  stages=int(m.group(5)))
    for item in filter(None, (m.group(6) or "").split(",")):
        k, _, v = item.partition("=")
        default = getattr(Regime, k, None)
        if default is None:
            return None
        try:
            fields[k] = (v == "True") if isinstance(default, bool) else type(default)(float(v))
        except ValueError:
            return None
    try:
        r = Regime(**fields)
    except (TypeError, ValueError):
        return None
    return r if r.name == name else None


class RegimeTable:
    """A profiled map from :class:`MaskFeatures` to the fastest :class:`Regime`.

    File format (JSON)::

        {"format": "tessera-regime-table", "version": 1,
         "provenance": {"gpu": ..., "arch": ..., "driver": ..., "cuda": ..., "cupy": ...,
                        "tessera": ..., "date": ..., "corpus": {...}},
         "entries": [{"features": {MaskFeatures fields}, "regime": {Regime fields},
                      "ms": <chosen regime's time>, "oracle_ms": <best time per mask>, ...}]}

    Entries may carry more fields (the profiler writes the heuristic's time, the masks behind
    the entry and every candidate's time). All entries share one architecture.

    :meth:`lookup`, for tables whose entries carry every candidate's measurements (what the
    profiler writes): a smoothed vote. Each entry of the same arch, head dim and dtype weighs
    ``masks x 0.5**distance`` (distance: bucket steps of density, sequence length, imbalance
    and batch x heads, plus :data:`GEOMETRY_STEP` per step of geometry), and the regime with
    the lowest weighted mean relative time (time / that entry's oracle) wins. One profiled
    mask per key is a noisy vote; pooling the neighbours' evidence picked better regimes in
    leave-one-out tests on the H200 table (benchmarks/RESULTS.md). Tables without candidate
    data (written by hand): the entry with the same key; else, among entries with the same
    arch, head dim, dtype and geometry, the nearest by bucket distance (density first, then
    sequence length, then imbalance, then batch x heads; ties by key). Else None. Every
    answer is precomputed when the table is built, so a lookup is one key format and one
    dict read.
    """

    def __init__(self, entries: list[dict], provenance: dict | None = None, *,
                 source: str = "<table>") -> None:
        self.source = source
        if provenance is None:
            provenance = {}
        if not isinstance(provenance, dict):
            raise ValueError(f"{source}: provenance must be an object, "
                             f"got {type(provenance).__name__}")
        if not isinstance(entries, list):
            raise ValueError(f"{source}: entries must be a list, got {type(entries).__name__}")
        self.provenance = dict(provenance)
        self._entries: dict[str, dict] = {}
        self._features: dict[str, MaskFeatures] = {}
        self._regimes: dict[str, Regime] = {}
        for i, e in enumerate(entries):
            where = f"{source}: entry {i}"
            if not isinstance(e, dict):
                raise ValueError(f"{where}: must be an object, got {type(e).__name__}")
            missing = [f for f in ENTRY_REQUIRED if f not in e]
            if missing:
                raise ValueError(f"{where}: missing fields {missing}")
            try:
                feats = MaskFeatures.from_dict(e["features"])
                regime = _check_regime_dict(e["regime"])
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if not regime_fits(regime, feats.head_dim, feats.arch):
                raise ValueError(f"{where}: regime {regime.name} needs more shared memory at "
                                 f"head dim {feats.head_dim} than sm_{feats.arch} allows "
                                 f"({smem_limit_bytes(feats.arch)} bytes)")
            for f in ("ms", "oracle_ms"):
                v = e[f]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not \
                        math.isfinite(v) or v < 0:
                    raise ValueError(f"{where}: {f} must be a finite number >= 0, got {v!r}")
            key = feats.key()
            if "key" in e and e["key"] != key:
                raise ValueError(f"{where}: key {e['key']!r} does not match its features "
                                 f"({key!r})")
            if key in self._entries:
                raise ValueError(f"{where}: duplicate features {key!r}")
            entry = dict(e)
            entry["key"] = key
            entry["features"] = feats.to_dict()
            entry["regime"] = regime.to_dict()
            self._entries[key] = entry
            self._features[key] = feats
            self._regimes[key] = regime
        archs = {f.arch for f in self._features.values()}
        if "arch" in self.provenance:
            archs.add(self.provenance["arch"])
        if len(archs) > 1:
            raise ValueError(f"{source}: entries and provenance name several architectures "
                             f"{sorted(archs, key=str)}; a table is for one GPU")
        self.arch: int | None = archs.pop() if archs else None
        self._index = self._precompute()
        self._groups = {(f.arch, f.head_dim, f.dtype) for f in self._features.values()}

    # ------------------------------------------------------------------ lookup
    def _precompute(self) -> dict[str, Regime]:
        """Every key a lookup can answer (see the class docstring for the two rules)."""
        if self._entries and all(isinstance(e.get("candidates"), dict) and e["candidates"]
                                 for e in self._entries.values()):
            return self._precompute_smoothed()
        return self._precompute_nearest()

    def _precompute_smoothed(self) -> dict[str, Regime]:
        keys = sorted(self._entries)
        feats = [self._features[k] for k in keys]
        regimes: dict[str, Regime] = {}
        for k in keys:  # candidate names -> regimes: the entry's own, else parsed from the name
            for name in self._entries[k]["candidates"]:
                if name not in regimes:
                    own = self._regimes[k]
                    regimes[name] = own if own.name == name else regime_from_name(name)
        names = sorted(n for n, r in regimes.items() if r is not None)
        col = {n: i for i, n in enumerate(names)}
        rel = np.zeros((len(keys), len(names)))
        seen = np.zeros((len(keys), len(names)))
        for i, k in enumerate(keys):
            for name, c in self._entries[k]["candidates"].items():
                if name in col and isinstance(c, dict) and _finite(c.get("rel")):
                    rel[i, col[name]] = float(c["rel"])
                    seen[i, col[name]] = 1.0
        weight0 = np.array([max(len(self._entries[k].get("masks", [])), 1) for k in keys],
                           dtype=np.float64)
        pos = np.array([f.bucket_index for f in feats], dtype=np.float64)
        geo = np.array([_geometry_position(f.geometry) for f in feats], dtype=np.float64)
        index: dict[str, Regime] = {}
        groups: dict[tuple, list[int]] = {}
        for i, f in enumerate(feats):
            groups.setdefault((f.arch, f.head_dim, f.dtype), []).append(i)
        grid = np.array(list(itertools.product(range(len(DENSITY_BUCKETS)),
                                               range(len(SEQ_BUCKETS)),
                                               range(len(IMBALANCE_BUCKETS)),
                                               range(len(BATCH_HEADS_BUCKETS)))),
                        dtype=np.float64)
        for (arch, hd, dt), members in groups.items():
            m = np.array(members)
            for geometry in ALL_GEOMETRIES:
                g = np.array(_geometry_position(geometry), dtype=np.float64)
                dist = (np.abs(grid[:, None, :] - pos[m][None, :, :]).sum(-1)
                        + GEOMETRY_STEP * np.abs(geo[m] - g).sum(-1)[None, :])
                w = weight0[m][None, :] * 0.5 ** dist  # [grid, members]
                num, den = w @ (rel[m] * seen[m]), w @ seen[m]
                # A regime must have been measured wherever the weight is (all but 0.1%).
                ok = den >= 0.999 * w.sum(1, keepdims=True)
                score = np.where(ok, num / np.maximum(den, 1e-300), np.inf)
                best = score.argmin(1)  # ties: the first name, names sorted
                for gi, b in enumerate(best):
                    d, sq, im, bh = (int(x) for x in grid[gi])
                    key = MaskFeatures(arch, hd, dt, geometry, SEQ_BUCKETS[sq],
                                       DENSITY_BUCKETS[d], IMBALANCE_BUCKETS[im],
                                       BATCH_HEADS_BUCKETS[bh]).key()
                    if np.isfinite(score[gi, b]):
                        index[key] = regimes[names[b]]
        return index

    def _precompute_nearest(self) -> dict[str, Regime]:
        index = dict(self._regimes)
        groups: dict[tuple, list[tuple[tuple[int, ...], str]]] = {}
        for key, f in sorted(self._features.items()):
            groups.setdefault(f.group, []).append((f.bucket_index, key))
        for (arch, hd, dt, geo), members in groups.items():
            for di, d in enumerate(DENSITY_BUCKETS):
                for si, s in enumerate(SEQ_BUCKETS):
                    for ii, imb in enumerate(IMBALANCE_BUCKETS):
                        for bi, bh in enumerate(BATCH_HEADS_BUCKETS):
                            k = MaskFeatures(arch, hd, dt, geo, s, d, imb, bh).key()
                            if k in index:
                                continue
                            pos = (di, si, ii, bi)
                            best = min(members, key=lambda m: (
                                tuple(abs(a - b) for a, b in zip(m[0], pos)), m[1]))
                            index[k] = self._regimes[best[1]]
        return index

    def covers(self, arch: int, head_dim: int, dtype: str) -> bool:
        """Whether any lookup for this architecture, head dim and dtype can answer (so a plan
        need not measure its mask's features when none can)."""
        return (arch, head_dim, dtype) in self._groups

    def lookup(self, features: MaskFeatures) -> Regime | None:
        """The regime for ``features`` by the table's rule (class docstring), or None."""
        return self._index.get(features.key())

    def lookup_exact(self, features: MaskFeatures) -> Regime | None:
        return self._regimes.get(features.key())

    # ------------------------------------------------------------------ access
    @property
    def entries(self) -> list[dict]:
        """The entries (copies), sorted by key."""
        return [json.loads(json.dumps(self._entries[k])) for k in sorted(self._entries)]

    def entry(self, key: str) -> dict | None:
        e = self._entries.get(key)
        return None if e is None else json.loads(json.dumps(e))

    @property
    def families(self) -> set[str]:
        """The kernel families the table's regimes (and measured candidates) belong to."""
        fams = {r.family for r in self._regimes.values()}
        for e in self._entries.values():
            for name in e.get("candidates", {}) or {}:
                r = regime_from_name(name)
                if r is not None:
                    fams.add(r.family)
        return fams

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def gpu(self) -> str | None:
        g = self.provenance.get("gpu")
        return g if isinstance(g, str) else None

    def describe(self) -> str:
        """One line: where the table came from, which GPU and when."""
        p = self.provenance
        arch = f"sm_{self.arch}" if self.arch else "arch ?"
        return (f"{self.source} ({p.get('gpu', 'GPU ?')}, {arch}, {p.get('date', 'date ?')}, "
                f"{len(self)} entries)")

    def __repr__(self) -> str:
        return f"RegimeTable({self.describe()})"

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict[str, Any]:
        return {"format": TABLE_FORMAT, "version": TABLE_VERSION,
                "provenance": self.provenance, "entries": self.entries}

    @classmethod
    def from_json(cls, obj: Any, source: str = "<table>") -> "RegimeTable":
        """Validate a parsed table (``ValueError`` naming the problem)."""
        if not isinstance(obj, dict):
            raise ValueError(f"{source}: not a regime table (the top level is a "
                             f"{type(obj).__name__}, expected an object)")
        if obj.get("format") != TABLE_FORMAT:
            raise ValueError(f"{source}: format is {obj.get('format')!r}, expected "
                             f"{TABLE_FORMAT!r}")
        if obj.get("version") != TABLE_VERSION:
            raise ValueError(f"{source}: version {obj.get('version')!r} is not supported "
                             f"(this Tessera reads version {TABLE_VERSION})")
        unknown = set(obj) - {"format", "version", "provenance", "entries"}
        if unknown:
            raise ValueError(f"{source}: unknown top-level fields {sorted(unknown)}")
        if "entries" not in obj:
            raise ValueError(f"{source}: missing 'entries'")
        return cls(obj["entries"], obj.get("provenance"), source=source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RegimeTable":
        """Read and validate a table file. A missing file raises ``FileNotFoundError``; anything
        wrong inside it a ``ValueError`` that names the file and the problem."""
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON file ({exc})") from None
        return cls.from_json(obj, source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        """Write the table atomically (:func:`write_json_atomic`)."""
        write_json_atomic(path, self.to_json())


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a temporary file in the same folder, then
    a rename), so an interrupted profile or evaluation never leaves a truncated file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=1, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private; tables are meant to be shared (and committed).
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ================================================================================ selection
_AUTO = "auto"
_NONE = "none"  # $TESSERA_REGIME_TABLE=none: no table, the heuristic everywhere
_explicit: Any = _AUTO  # "auto": discover; None: no table; a RegimeTable: that one
_resolved: dict[tuple, RegimeTable | None] = {}
_warned: set[str] = set()
_gpu_names: dict[int, str | None] = {}
_device_archs: dict[int, int] = {}
_device_sms: dict[int, int] = {}


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=5)  # the caller of tessera.plan


def _current_device_id() -> int | None:
    from .._array import cupy_or_none  # noqa: PLC0415

    cp = cupy_or_none()
    if cp is None:
        return None
    try:
        return int(cp.cuda.runtime.getDevice())
    except Exception:
        return None


def _per_device(cache: dict[int, Any], read: Callable[[Any, int], Any], missing: Any) -> Any:
    """``read(cupy, device)`` for the current device, cached per device; ``missing`` without a
    GPU or when reading raises (not cached: the next call tries again)."""
    dev = _current_device_id()
    if dev is None:
        return missing
    if dev not in cache:
        from .._array import cupy_or_none  # noqa: PLC0415

        try:
            cache[dev] = read(cupy_or_none(), dev)
        except Exception:
            return missing
    return cache[dev]


def current_gpu_name() -> str | None:
    """The current CUDA device's name (e.g. ``"NVIDIA H200"``), or None without a GPU."""
    def read(cp: Any, dev: int) -> str | None:
        try:
            name = cp.cuda.runtime.getDeviceProperties(dev)["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            return None  # remembered: the name is only shown and recorded

    return _per_device(_gpu_names, read, None)


def device_arch() -> int | None:
    """Compute capability of the current device (cached per device), None without one."""
    return _per_device(_device_archs,
                       lambda cp, dev: int(cp.cuda.Device(dev).compute_capability), None)


def device_sm_count() -> int:
    """Multiprocessors of the current device (cached per device), 0 without one."""
    return _per_device(_device_sms, lambda cp, dev: int(
        cp.cuda.Device(dev).attributes["MultiProcessorCount"]), 0)


def use_table(table: "str | os.PathLike | RegimeTable | None") -> RegimeTable | None:
    """Choose the regime table plans use.

    A path (loaded and validated now: a bad file raises ``ValueError``) or a
    :class:`RegimeTable`: that table, for plans on its architecture and GPU. ``None``: no table,
    every plan takes the heuristic :func:`default_regime`. ``"auto"`` (the initial setting):
    ``$TESSERA_REGIME_TABLE`` if set (``none``: no table), else ``tables/<gpu-slug>.json``
    beside the package when it exists. Returns the table now in force for explicit choices
    (None otherwise).
    """
    global _explicit, _generation
    _generation += 1
    if table is None or isinstance(table, RegimeTable):
        _explicit = table
    elif isinstance(table, str) and table == _AUTO:
        _explicit = _AUTO
    else:
        _explicit = RegimeTable.load(table)
    _resolved.clear()
    _selections.clear()
    _read_selections.clear()
    _warned.clear()
    return None if isinstance(_explicit, str) else _explicit


def _table_source() -> tuple[str, str | None, bool]:
    """(how the table is chosen, its path or None, whether a missing file is an error)."""
    if isinstance(_explicit, RegimeTable) or _explicit is None:
        return "use_table", None, False
    env = os.environ.get(ENV_TABLE)
    if env == _NONE:
        return f"${ENV_TABLE}", None, False
    if env and env != _AUTO:
        return f"${ENV_TABLE}", env, True
    name = current_gpu_name()
    if name is None:
        return "tables", None, False
    return "tables", _default_table_path(name), False


@functools.lru_cache(maxsize=16)  # asked on every plan: path arithmetic costs microseconds
def _default_table_path(gpu_name: str) -> str:
    return str(TABLES_DIR / f"{gpu_slug(gpu_name)}.json")


def active_table(arch: int | None) -> RegimeTable | None:
    """The table plans for compute capability ``arch`` use, or None (the heuristic).

    None for ``arch=None`` (no GPU). A table that cannot be read, that was profiled on another
    architecture or another GPU, or that never measured the architecture's default kernel family,
    gives a warning (once) and None: planning never fails because of a table.
    """
    if arch is None:
        return None
    how, path, required = _table_source()
    cache_key = (how, path, arch, id(_explicit))
    if cache_key in _resolved:
        return _resolved[cache_key]
    table: RegimeTable | None = None
    if how == "use_table":
        table = _explicit
    elif path is not None:
        try:
            table = RegimeTable.load(path)
        except FileNotFoundError:
            if required:
                _warn_once(f"regime table {path} (from {how}) does not exist; "
                           "using the heuristic default regime")
        except (OSError, ValueError) as exc:
            _warn_once(f"regime table from {how} is unusable: {exc}; "
                       "using the heuristic default regime")
    if table is not None:
        here = current_gpu_name()
        if table.arch is not None and table.arch != arch:
            _warn_once(f"regime table {table.describe()} was profiled on sm_{table.arch}, "
                       f"but this plan is for sm_{arch}; using the heuristic default regime")
            table = None
        elif here is not None and table.gpu is not None and gpu_slug(here) != gpu_slug(table.gpu):
            _warn_once(f"regime table {table.describe()} was profiled on {table.gpu}, but this "
                       f"GPU is {here}; using the heuristic default regime")
            table = None
        elif default_regime(arch).family not in table.families:
            # A table that never measured this GPU's own kernel family would steer plans to a
            # slower one (the H200 table predates the sm90 family): profile again.
            _warn_once(f"regime table {table.describe()} has no {default_regime(arch).family} "
                       "regimes (profiled before that kernel family existed); using the "
                       "heuristic default regime; run `python -m tessera profile` again")
            table = None
    _resolved[cache_key] = table
    return table


def select_regime(mask: Any, *, arch: int | None, head_dim: int, dtype: Any,
                  num_q_heads: int, batch: int, num_kv_heads: int | None = None) -> Regime:
    """The regime ``tessera.plan`` uses when none is given (see :func:`selected_regime`)."""
    return selected_regime(mask, arch=arch, head_dim=head_dim, dtype=dtype,
                           num_q_heads=num_q_heads, batch=batch, num_kv_heads=num_kv_heads)[0]


def selected_regime(mask: Any, *, arch: int | None, head_dim: int, dtype: Any,
                    num_q_heads: int, batch: int, num_kv_heads: int | None = None,
                    read_mask: bool = True) -> tuple[Regime, bool]:
    """The regime ``tessera.plan`` uses when none is given, and whether every mask of this
    geometry gets it (the selection was not read).

    ``arch`` None with a device mask means the current device's. The heuristic
    :func:`default_regime`, unless a table is in force for the architecture
    (:func:`active_table`) and the heuristic's plan may split tasks (see the module
    docstring): then the mask's features are measured once and looked up, and the heuristic
    stays the answer when the table has nothing for this head dim / dtype / geometry. The
    heuristic's sm90 regimes for large blocks take 128-row aligned tiles where
    :func:`align_pays`. An answer that the geometry alone decides (neither a table lookup nor
    :func:`align_pays` read the selection) is remembered for the geometry and shapes: a model
    asks for the same few on every request (~45 us a request on the H200's host otherwise).
    ``read_mask=False`` decides by the geometry alone, reading nothing back from the GPU (a
    plan made while a CUDA graph is captured): what the last selection for this geometry and
    shapes found by reading its mask (the warm-up request), else the heuristic, plain tiles.
    """
    if arch is None and mask.on_device:
        arch = device_arch()
    num_kv_heads = num_kv_heads or num_q_heads
    from .plan import _dtype_name  # noqa: PLC0415 - plan imports this module

    dtype = _dtype_name(dtype)
    # Everything the decision reads besides the selection: the GPU (its task slots), the table
    # in force, the shapes and the geometry.
    key = (arch, device_arch(), device_sm_count(), id(active_table(arch)), int(head_dim), dtype,
           int(num_q_heads), int(batch), int(num_kv_heads), tuple(mask.batch_heads),
           bool(mask.on_device), np.asarray(mask.q_bounds, dtype=np.int64).tobytes(),
           np.asarray(mask.kv_bounds, dtype=np.int64).tobytes())
    found = _selections.get(key)
    if found is not None:
        return found, True
    if not read_mask:
        # What the last selection for this geometry and shapes found by reading its mask (the
        # warm-up request before a CUDA-graph capture), else the heuristic with plain tiles.
        seen = _read_selections.get(key)
        if seen is not None:
            return seen, False
        return default_regime(arch, head_dim, _typical_q_block(mask.q_bounds),
                              mask.kv_bounds), True
    regime, by_geometry = _select_regime(mask, arch, head_dim, dtype, num_q_heads, batch,
                                         num_kv_heads)
    kept = _selections if by_geometry else _read_selections
    if len(kept) >= 256:  # a bound, not an LRU: models use a handful of geometries
        kept.clear()
    kept[key] = regime
    return regime, by_geometry


# select_regime's answers that depend on the geometry and shapes alone, and the last answer for
# each geometry and shapes that read the mask (both emptied by use_table).
_selections: dict[tuple, Regime] = {}
_read_selections: dict[tuple, Regime] = {}
_generation = 0  # use_table calls so far


def selection_generation() -> int:
    """Changes whenever :func:`use_table` may have changed what :func:`select_regime` answers
    (a key part for anything that remembers its answers, as tessera.attention's kept plans)."""
    return _generation


def _select_regime(mask: Any, arch: int | None, head_dim: int, dtype: str, num_q_heads: int,
                   batch: int, num_kv_heads: int) -> tuple[Regime, bool]:
    """select_regime's decision: (the regime, whether the geometry and shapes alone gave it)."""
    heuristic = default_regime(arch, head_dim, _typical_q_block(mask.q_bounds), mask.kv_bounds)
    table = active_table(arch)
    # Whether the split policy matters is asked of the heuristic's unpacked form: a packed walk
    # never splits, which must not keep the table from masks it was profiled for. (The slots
    # are the heuristic's own: the variant that would run, compiled once for its occupancy.)
    unpacked = heuristic.with_(pack_keys=False)
    if (table is not None and table.covers(int(arch), int(head_dim), dtype)
            and plan_may_split(unpacked, mask, num_q_heads=num_q_heads,
                               num_kv_heads=num_kv_heads, batch=batch,
                               in_flight=plan_tasks_in_flight(heuristic, mask, head_dim, arch,
                                                              dtype == "bfloat16"))):
        try:
            found = table.lookup(mask_features(mask, head_dim=head_dim, dtype=dtype, arch=arch,
                                               num_q_heads=num_q_heads, batch=batch))
        except Exception as exc:  # a table must never break planning
            _warn_once(f"regime table lookup failed ({type(exc).__name__}: {exc}); "
                       "using the heuristic default regime")
            found = None
        if found is not None:
            return found, False
        by_geometry = False
    else:
        by_geometry = True
    if heuristic in (SM90_ROWS128, SM90_ROWS64_D64):
        # align_pays reads the selection only when the query blocks are ragged against the tile.
        by_geometry = by_geometry and not blocks_ragged(mask.q_bounds, 128)
        if align_pays(mask, 128):
            # Aligned tiles are measured with 128 rows (clusters 1.3-1.4x faster), at every
            # head dim.
            return SM90_ROWS128.with_(align_tiles=True), by_geometry
    return heuristic, by_geometry


def plan_tasks_in_flight(regime: Regime, mask: Any, head_dim: int, arch: int | None,
                         bf16: bool = True) -> int:
    """The task slots ``tessera.plan``'s split rule counts for ``regime``'s plan of ``mask``:
    the current GPU's when the plan is for it (a device mask, or its architecture named), else
    0 (a portable host plan, for whatever GPU runs it)."""
    here = device_arch()
    if here is not None and (mask.on_device or arch == here):
        return _device_tasks_in_flight(regime, head_dim, bf16, here, device_sm_count())
    return 0


@functools.lru_cache(maxsize=256)
def _device_tasks_in_flight(regime: Regime, head_dim: int, bf16: bool, arch: int,
                            sm_count: int) -> int:
    """:func:`tasks_in_flight` on the current GPU, exact for one-task CTAs: the driver's
    occupancy of the compiled variant, which counts the registers the estimate leaves out (the
    portable family's 128-row tiles hold ~230-255 registers a thread: two CTAs an SM where
    shared memory alone would allow four at head dim 64). Overcounting slots would keep
    ``tasks.may_split`` from ruling splits out, and the planner would then synchronize on
    every request. Persistent variants size their own grid: the estimate is exact there; a
    variant over the GPU's shared-memory limit is not loaded here (its launch refuses it with
    the numbers)."""
    variant = regime.variant(head_dim, bf16)
    if variant.persistent or not regime_fits(regime, head_dim, arch):
        return tasks_in_flight(regime, head_dim, arch, sm_count)
    from ..cuda.loader import blocks_per_sm  # noqa: PLC0415 - device only

    return sm_count * min(blocks_per_sm(variant), 2048 // variant.threads)


def plan_may_split(regime: Regime, mask: Any, *, num_q_heads: int, num_kv_heads: int,
                   batch: int, in_flight: int) -> bool:
    """``tasks.may_split`` for ``regime``'s plan of ``mask`` (the one place the planner, the
    regime selection and the profiler ask it): the fewest tasks its GQA packing and tile rows
    can give, against ``in_flight`` task slots."""
    from .plan import heads_per_task  # noqa: PLC0415 - plan imports this module
    from .tasks import may_split, tasks_lower_bound  # noqa: PLC0415

    if regime.pack_keys:  # packed chunks are not cut (tasks._cut_parts cuts span by span)
        return False
    hp = heads_per_task(regime, mask.batch_heads[1], num_q_heads, num_kv_heads)
    bound = tasks_lower_bound(batch, num_q_heads, hp, mask.seq_len_q, regime.block_m // hp)
    return may_split(regime.split_ratio, bound, in_flight)


def _typical_q_block(q_bounds: np.ndarray) -> float:
    """The median query block of a mask's geometry (cached: every request of a model asks it of
    the same few geometries, and a median costs ~30 us)."""
    return _median_block(np.asarray(q_bounds, dtype=np.int64).tobytes())


@functools.lru_cache(maxsize=64)
def _median_block(bounds: bytes) -> float:
    return float(np.median(np.diff(np.frombuffer(bounds, dtype=np.int64))))


def describe_table_in_use(arch: int | None) -> str:
    """For ``python -m tessera info``: which table plans use here, or ``none: heuristic``."""
    how, path, _ = _table_source()
    if arch is None:
        if how == "use_table" and isinstance(_explicit, RegimeTable):
            return (f"none: heuristic (no GPU; {_explicit.describe()} from use_table applies "
                    "on a GPU)")
        if path is not None:
            return f"none: heuristic (no GPU; {path} from {how} applies on a GPU)"
        return "none: heuristic (no GPU)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = active_table(arch)
    if table is not None:
        return (f"{table.describe()} (from {how}; looked up where tasks may split, the "
                "heuristic elsewhere)")
    why = "; ".join(str(w.message) for w in caught)
    if why:
        return f"none: heuristic ({why})"
    if how == "use_table":
        return "none: heuristic (use_table(None))"
    if path is None and how.startswith("$"):
        return f"none: heuristic ({ENV_TABLE}={_NONE})"
    return f"none: heuristic (no table at {path})" if path else "none: heuristic"
