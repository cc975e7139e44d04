"""Backward regimes: how a mask's backward pass runs -- kernel family, task rows, how dQ is summed
and how the chunks are copied -- as a small frozen value, the heuristic default and the
candidates the profiler times (a regime table's ``backward`` section chooses among them)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ...cuda.device import smem_limit_bytes
from ...cuda.variants import Variant, smem_bytes
from .value import KNOWN_FAMILIES, checked_value, from_fields

__all__ = ["BackwardRegime", "BACKWARD_DQ", "SM90_SMALL_BLOCK_TOKENS", "backward_regime_from_name",
           "candidate_backward_regimes", "check_backward_regime_argument",
           "checked_backward_regime", "default_backward_regime", "dq_block_n"]


# How dQ is summed: "atomics", by the dK/dV kernel into float32 (five products a pair, one
# kernel); "passes", by a second kernel walking the query-major queue (seven products, one
# writer a row: bitwise repeatable).
BACKWARD_DQ = ("atomics", "passes")


# The Hopper backward's task rows where the mask's blocks are this small (median, on both axes):
# 64 (one warpgroup, two CTAs an SM) rather than 128. A 128-row task would hold two blocks whose
# spans differ, computing about twice the useful pairs (docs/decisions.md, Backward).
SM90_SMALL_BLOCK_TOKENS = 64
# Sets of partial-dQ tiles the atomic dK/dV kernel alternates, by head dim (Variant.bwd_sm90's
# dq_buffers: two at head dims 64 and 128, at 128 in place of a third stage). Two at head dim 64,
# where a chunk then waits for the bulk reduce issued a chunk earlier (1.013-1.015x, H100); one
# at 128, where the trade of a stage measured 0.997-1.024x (docs/decisions.md, Backward).
SM90_DQ_BUFFERS: dict[int, int] = {64: 2, 128: 1}


_ROWS = {"sm90": (64, 128), "sm80": (64,)}


@dataclass(frozen=True)
class BackwardRegime:
    """One way to run the backward pass.

    Attributes:
        family: "sm90" (wgmma, sm_90 only; 64 rows a warpgroup) or "sm80" (the portable
            mma.sync kernels, sm_80 and newer).
        block_m: rows of a task: keys of a key-major (dK/dV) task, packed query rows of a
            query-major (dQ) one. sm90: 128 (two warpgroups) or 64 (one, two CTAs an SM);
            sm80: 64.
        dq: "atomics" (sm90, 128 rows: the dK/dV kernel sums dQ into float32, no query-major
            queue) or "passes" (a dQ kernel of its own: no floating-point atomics, bitwise
            repeatable, what ``config.deterministic_backward`` asks for).
        tma: sm90: chunks copied by TMA where the operands can be described (else the same
            kernels copy them by cp.async).
    """

    family: str = "sm90"
    block_m: int = 128
    dq: str = "atomics"
    tma: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            want = {"family": str, "block_m": int, "dq": str, "tma": bool}[f.name]
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                kind = {str: "a str", int: "an int", bool: "True or False"}[want]
                raise TypeError(f"backward regime field {f.name} must be {kind}, got {v!r}")
        if self.family not in KNOWN_FAMILIES:
            raise ValueError(f"backward regime family must be one of {list(KNOWN_FAMILIES)}, "
                             f"got {self.family!r}")
        if self.block_m not in _ROWS[self.family]:
            raise ValueError(f"backward regime block_m must be one of "
                             f"{list(_ROWS[self.family])} for the {self.family} family, got "
                             f"{self.block_m!r}")
        if self.dq not in BACKWARD_DQ:
            raise ValueError(f"backward regime dq must be one of {list(BACKWARD_DQ)}, got "
                             f"{self.dq!r}")
        if self.dq == "atomics" and (self.family, self.block_m) != ("sm90", 128):
            raise ValueError("dq='atomics' runs in the sm90 family's 128-row tasks only (at head "
                             "dim 128 its two warpgroups split dQ's columns)")
        if self.tma and self.family != "sm90":
            raise ValueError("tma=True is a copy form of the sm90 family only")

    @property
    def name(self) -> str:
        """A stable name: ``bwd_sm90_128_atomics_tma``, ``bwd_sm90_64_passes``, ..."""
        return f"bwd_{self.family}_{self.block_m}_{self.dq}" + ("_tma" if self.tma else "")

    @property
    def deterministic(self) -> bool:
        """Whether the gradients are bitwise repeatable (no floating-point atomics)."""
        return self.dq == "passes"

    def runs_on(self, arch: int | None) -> bool:
        """Whether this regime's family runs on compute capability ``arch`` (None: any GPU)."""
        return self.family != "sm90" or arch == 90

    def kernels(self, head_dim: int, bf16: bool, cc: int,
                tma: bool | None = None) -> tuple[Variant, Variant | None]:
        """The (dK/dV, dQ) kernel variants on compute capability ``cc``; dQ None where the dK/dV
        kernel sums it by atomics. ``tma`` None: this regime's copy form."""
        tma = self.tma if tma is None else tma
        if self.family == "sm90":
            atomic = self.dq == "atomics"
            dkdv = Variant.bwd_sm90("bsa_bwd_dkdv_sm90", head_dim=head_dim, bf16=bf16,
                                    block_m=self.block_m, atomic_dq=atomic, tma=tma,
                                    dq_buffers=SM90_DQ_BUFFERS.get(head_dim, 1) if atomic
                                    else 1)
            if atomic:
                return dkdv, None
            return dkdv, Variant.bwd_sm90("bsa_bwd_dq_sm90", head_dim=head_dim, bf16=bf16,
                                          block_m=self.block_m, tma=tma)
        return (Variant.bwd_sm80("bsa_bwd_dkdv_sm80", head_dim=head_dim, bf16=bf16,
                                 block_m=self.block_m),
                Variant.bwd_sm80("bsa_bwd_dq_sm80", head_dim=head_dim, bf16=bf16,
                                 block_m=self.block_m, block_n=dq_block_n(head_dim, cc)))

    def with_(self, **changes: Any) -> "BackwardRegime":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BackwardRegime":
        return from_fields(cls, d, "backward regime")


def dq_block_n(head_dim: int, cc: int) -> int | None:
    """The portable dQ kernel's key step on compute capability ``cc``: None (the default,
    :func:`~tessera.cuda.variants.backward_block_n`) where its shared memory fits the GPU's
    per-block limit, else 32 (head dim 128 on sm_86 / sm_89, 99 KiB a block)."""
    v = Variant.bwd_sm80("bsa_bwd_dq_sm80", head_dim=head_dim, bf16=True)
    return None if smem_bytes(v) <= smem_limit_bytes(cc) else 32


def default_backward_regime(arch: int | None, q_block: float, kv_block: float, *,
                            deterministic: bool = False,
                            portable: bool = False) -> BackwardRegime:
    """The heuristic: on sm_90 (unless ``portable``) the Hopper kernels, 64-row tasks where the
    median query and key blocks are both at most :data:`SM90_SMALL_BLOCK_TOKENS` (a 128-row
    task would hold two blocks of different spans), else 128; dQ by atomics in 128-row tasks
    unless ``deterministic`` (the 64-row tasks keep the two passes: 1.6x faster there), chunks
    by TMA. Elsewhere the portable kernels (docs/decisions.md, Backward)."""
    if arch != 90 or portable:
        return BackwardRegime(family="sm80", block_m=64, dq="passes", tma=False)
    rows = 64 if max(q_block, kv_block) <= SM90_SMALL_BLOCK_TOKENS else 128
    dq = "atomics" if rows == 128 and not deterministic else "passes"
    return BackwardRegime(family="sm90", block_m=rows, dq=dq, tma=True)


def candidate_backward_regimes(arch: int | None) -> list[BackwardRegime]:
    """The backward regimes the profiler times on compute capability ``arch``: on sm_90 the
    Hopper kernels' 64- and 128-row tasks, dQ by atomics (128 rows) or two passes, chunks by
    TMA or cp.async (six); elsewhere the portable one."""
    if arch != 90:
        return [BackwardRegime(family="sm80", block_m=64, dq="passes", tma=False)]
    return [BackwardRegime(family="sm90", block_m=m, dq=dq, tma=tma)
            for m in (128, 64) for dq in BACKWARD_DQ for tma in (True, False)
            if dq == "passes" or m == 128]


def check_backward_regime_argument(regime: Any) -> None:
    """A public entry point's ``regime`` argument: None or a :class:`BackwardRegime`
    (``TypeError`` naming the argument and what it takes otherwise)."""
    if regime is not None and not isinstance(regime, BackwardRegime):
        raise TypeError(f"regime must be None or a tessera.BackwardRegime, got "
                        f"{type(regime).__name__}")


def checked_backward_regime(d: Any) -> BackwardRegime:
    """A table entry's backward regime (``ValueError`` naming the problem)."""
    return checked_value(d, BackwardRegime, "backward regime")


def backward_regime_from_name(name: str) -> BackwardRegime | None:
    """Parse :attr:`BackwardRegime.name` back; None when the name is not one."""
    m = re.fullmatch(r"bwd_(sm\d+)_(\d+)_(atomics|passes)(_tma)?", name)
    if not m:
        return None
    try:
        return BackwardRegime(family=m.group(1), block_m=int(m.group(2)), dq=m.group(3),
                              tma=m.group(4) is not None)
    except (TypeError, ValueError):
        return None
