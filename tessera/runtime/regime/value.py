"""The regime value: a whole execution plan (kernel family, tile shape, pipeline depth, mapping
and split policy) as a small frozen value that can be named, compared, stored in a table and
passed to ``tessera.plan(..., regime=...)``."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from ...cuda.variants import ROW_GROUP, Variant

__all__ = ["Regime", "KNOWN_FAMILIES", "ROW_GROUP", "regime_from_name", "checked_regime",
           "checked_value", "from_fields"]


# Kernel families: "sm80" (mma.sync, every target) and "sm90" (wgmma, Hopper only).
KNOWN_FAMILIES = ("sm80", "sm90")


@dataclass(frozen=True)
class Regime:
    """One execution plan.

    Attributes:
        family: kernel family ("sm80": mma.sync, runs on sm_80 and newer; "sm90": wgmma,
            sm_90 only, 64 rows per warpgroup of 4 warps, 64 or 128 keys a step; four more
            warps than the rows need select its warp-specialized variant; 64-row tiles with
            12, 16 or 20 warps: 2-4 rings, a CTA running that many tasks side by side, each on
            one consumer warpgroup fed by a warp of the one producer warpgroup).
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
            most four long spans step 192 keys at a time (sm90/traits.cuh ``WIDE_BN``;
            other variants ignore it). Off by default: on the H200 it ran dense CogVideoX ~3%
            faster than without, random and spatial-temporal masks 3-8% slower (its stages
            hold 192 keys; docs/decisions.md).
        whole_spans: sm90 producer regimes of the span-by-span walk, combine_threshold 0, no
            align_tiles: for a mask that selects every block (a dense layer), whose every task
            is then one span over all its rows; the kernel walks them by arithmetic, reading
            no per-chunk fields. A plan checks the mask (``tessera.plan`` raises ValueError for
            one that leaves a block out). The default for dense host masks on sm_90.
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
    whole_spans: bool = False

    def __post_init__(self) -> None:
        # Each field of its default's type (numpy scalars taken as Python's), floats finite.
        for f in fields(self):
            want, v = type(f.default), getattr(self, f.name)
            object.__setattr__(self, f.name, _field_value(f.name, v, want))
        if self.num_warps <= 0:
            raise ValueError(f"num_warps must be a positive int, got {self.num_warps}")
        if self.stages < 2:
            raise ValueError(f"stages must be at least 2 (double buffering), got {self.stages}")
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
        ringed = self.block_m == 64 and self.num_warps in (12, 16, 20)
        if self.family == "sm90" and (self.block_m not in (64, 128, 192)
                                      or (self.num_warps not in (self.block_m // ROW_GROUP,
                                                                 self.block_m // ROW_GROUP + 4)
                                          and not ringed)
                                      or self.block_n not in (64, 128)
                                      or (self.block_m == 192 and not self.producer)):
            raise ValueError(f"the sm90 family takes block_m 64 or 128 (192: with the producer "
                             f"warpgroup) with one warp per 16 rows (plus 4 for a producer "
                             f"warpgroup; 64 rows also 12, 16 or 20 warps: 2-4 rings) and "
                             f"block_n 64 or 128, got "
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
        if self.whole_spans and (not self.producer or self.pack_keys or self.align_tiles
                                 or self.combine_threshold != 0):
            raise ValueError("whole_spans needs an sm90 producer regime of the span-by-span walk "
                             "(pack_keys False) with combine_threshold 0 and no align_tiles, got "
                             f"{self.family}_{self.block_m}x{self.block_n}_w{self.num_warps} "
                             f"pack_keys={self.pack_keys} align_tiles={self.align_tiles} "
                             f"combine_threshold={self.combine_threshold}")
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
    def variant(self, head_dim: int, bf16: bool = True, tma: bool = False, int8: int = 0):
        """The attention kernel variant (``tessera.cuda.loader.Variant``) this regime runs;
        ``tma``: its TMA-copying form (producer regimes of the span-by-span walk, when the
        launch can describe the operands: ``tma_capable``); ``int8``: its 8-bit forms (the sm90
        TMA form of one ring, tessera/cuda/sm90/traits.cuh's INT8: 1 both products, 2 the
        scores)."""

        if self.family == "sm90":
            # Three consumer warpgroups step 128 keys with a TMA producer only: the cp.async
            # producer's registers leave the consumers too few (ptxas spills), so that form
            # steps 64 keys over the same plan (tasks and spans do not depend on the step).
            block_n = 64 if self.block_m == 192 and not tma else self.block_n
            # Rings are the TMA producer's: the cp.async form runs the same plan (tasks do not
            # depend on how a CTA takes them) one task a CTA.
            return Variant.bsa_sm90(block_m=self.block_m, block_n=block_n,
                                    head_dim=head_dim, stages=self.stages, bf16=bf16,
                                    producer=self.producer, pack_keys=self.pack_keys, tma=tma,
                                    wide=self.wide_steps, guard=self.restricts_rows,
                                    rings=self.rings if tma else 1,
                                    whole_tasks=self.whole_spans, int8=int8)
        return Variant.bsa_sm80(block_m=self.block_m, block_n=self.block_n, head_dim=head_dim,
                                num_warps=self.num_warps, stages=self.stages, bf16=bf16,
                                guard=self.restricts_rows)

    @property
    def restricts_rows(self) -> bool:
        """Whether plans of this regime can hold spans that apply to some of a tile's rows only
        (combined short query blocks, aligned tiles): their kernels check such chunks for
        non-finite values (docs/errors.md), a cost the others do not pay."""
        return self.combine_threshold > 0 or self.align_tiles

    @property
    def tma_capable(self) -> bool:
        """Whether this regime's kernel has a TMA-copying form (variant(..., tma=True))."""
        return self.producer and not self.pack_keys

    @property
    def producer(self) -> bool:
        """sm90 only: a producer warpgroup does the copies (four warps beyond the rows' own)."""
        return self.family == "sm90" and self.num_warps > self.block_m // ROW_GROUP

    @property
    def rings(self) -> int:
        """sm90 producer regimes: the tasks a CTA runs side by side (1 but for 64-row tiles with
        12, 16 or 20 warps)."""
        if not self.producer:
            return 1
        return (self.num_warps - 4) // (self.block_m // ROW_GROUP)

    def heads_per_task(self, mask_heads: int, num_q_heads: int, num_kv_heads: int) -> int:
        """GQA packing factor: all query heads of a kv head in one task when they share a mask
        head and each still gets a whole number of row groups."""
        group = num_q_heads // num_kv_heads
        if (not self.pack_gqa or group == 1 or mask_heads not in (1, num_kv_heads)
                or self.block_m % group or (self.block_m // group) % ROW_GROUP):
            return 1
        return group

    def runs_on(self, arch: int | None) -> bool:
        """Whether this regime's family runs on compute capability ``arch`` (None: any GPU)."""
        return self.family != "sm90" or arch == 90

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Regime":
        return from_fields(cls, d, "regime")

    def with_(self, **changes: Any) -> "Regime":
        return replace(self, **changes)


def from_fields(cls: type, d: dict[str, Any], what: str) -> Any:
    """A regime value of type ``cls`` from its fields (``ValueError`` naming ``what`` for a
    field it does not have; the value checks the others)."""
    unknown = set(d) - set(cls.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{what}: unknown fields {sorted(unknown)}")
    return cls(**d)


_KINDS = {bool: "True or False", int: "an int", float: "a finite number", str: "a str"}


def _field_value(name: str, v: Any, want: type) -> Any:
    """``v`` as a regime field of type ``want``: TypeError for another type, ValueError for a
    float that is not finite."""
    numbers = (int, float, np.integer, np.floating)
    if want is bool:
        ok = isinstance(v, (bool, np.bool_))
    elif want is int:
        ok = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
    elif want is float:
        ok = isinstance(v, numbers) and not isinstance(v, (bool, np.bool_))
        if ok and not math.isfinite(v):
            raise ValueError(f"regime field {name} must be {_KINDS[want]}, got {v!r}")
    else:
        ok = isinstance(v, want)
    if not ok:
        raise TypeError(f"regime field {name} must be {_KINDS[want]}, got {v!r}")
    return want(v)


def checked_value(d: Any, cls: type, what: str) -> Any:
    """A table entry's ``what`` (a regime value of type ``cls``) from its JSON object:
    ``ValueError`` naming ``what`` and the problem."""
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be an object, got {type(d).__name__}")
    try:
        return cls.from_dict(d)
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith(f"{what}:") else f"{what}: {msg}") from None


def checked_regime(d: Any) -> Regime:
    """A table entry's forward regime (``ValueError`` naming the problem)."""
    return checked_value(d, Regime, "regime")


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
