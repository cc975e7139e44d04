"""Regimes: whole execution plans (kernel variant, tile shape, mapping and split policy).

A regime is a small frozen value so it can be named, compared, stored in a table and passed to
``tessera.plan(..., regime=...)``. Until the offline profiler writes tables, ``default_regime``
is the documented heuristic: the portable family's 128x64 tile everywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["Regime", "default_regime", "ROW_GROUP"]

# Rows one warp owns in every kernel family (the M of one mma.sync / a quarter of a wgmma M=64).
# Row groups with no valid row skip their matrix work, so stats count computed pairs per group.
ROW_GROUP = 16


@dataclass(frozen=True)
class Regime:
    """One execution plan.

    Attributes:
        family: kernel family ("sm80": mma.sync, runs on sm_80 and newer).
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

    def __post_init__(self) -> None:
        if self.block_m % ROW_GROUP or self.block_m <= 0:
            raise ValueError(f"block_m must be a positive multiple of {ROW_GROUP}, got {self.block_m}")
        if self.block_n % 16 or self.block_n <= 0:
            raise ValueError(f"block_n must be a positive multiple of 16, got {self.block_n}")
        if self.num_warps <= 0 or self.block_m not in (self.num_warps * ROW_GROUP,
                                                        2 * self.num_warps * ROW_GROUP):
            raise ValueError(f"block_m={self.block_m} must be 16 or 32 rows per warp "
                             f"(num_warps={self.num_warps})")
        if self.combine_threshold < 0 or self.split_ratio < 1 or self.min_split_chunks < 1:
            raise ValueError("combine_threshold >= 0, split_ratio >= 1 and min_split_chunks >= 1")

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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Regime":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"regime: unknown fields {sorted(unknown)}")
        return cls(**d)

    def with_(self, **changes: Any) -> "Regime":
        return replace(self, **changes)


def default_regime(arch: int | None = None, head_dim: int = 128,
                   q_block: float | None = None) -> Regime:
    """The heuristic regime for a GPU with compute capability ``arch`` (e.g. 90), or None (CPU).

    The portable family: 128-row tiles over 4 warps (32 rows each), 64 keys a step, double
    buffered. Head dim 64 takes 64-row tiles (16 rows a warp): its tasks are short, and more of
    them in flight hide each task's pipeline fill better (H200, benchmarks/RESULTS.md).
    sm_86/sm_89 allow 99 KB of shared memory per CTA, too little for the 128-row tile at head
    dim 128, so they take 64-row tiles there too. Masks whose query blocks are mostly 64 tokens
    or fewer (``q_block``: the median query block size) take 64-row tiles as well: such blocks
    rarely share key sets, so a 128-row tile would run half empty.
    """
    small_blocks = q_block is not None and q_block <= 64
    if head_dim <= 64 or small_blocks or (arch in (86, 87, 89) and head_dim > 96):
        return Regime(block_m=64, num_warps=4)
    return Regime()
