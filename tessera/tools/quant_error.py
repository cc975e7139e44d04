"""``python -m tessera quant-error``: what an 8-bit forward's rounding costs, per model shape.

For each shape of ``tessera.tools.workloads`` and each input kind, the relative error against
the float64 reference of :func:`tessera.quantization.attention` (the rounding a scheme does,
computed exactly otherwise) over the whole output and on the worst row, for each scheme asked
for. Runs on the CPU: each shape keeps its sequence length and head dim, so the scales see every
token, but only a few heads and a few query blocks of a random 10% block mask are computed.

Input kinds (bf16-rounded, as a model hands them over):
- ``random``: q, k, v standard normal.
- ``outliers``: the same with outlier channels: four channels of q and k four times larger,
  four channels of k offset by 4 (a bias every key shares), two channels of v ten times larger.

    python -m tessera quant-error --shapes wan-1.3b-480p,cogvideox-5b
    python -m tessera quant-error --schemes qk_e4m3-pv_e4m3-smooth,qk_int8-pv_int8-smooth-rotate
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import quantization, reference
from ..families import random_blocks
from ..mask import BlockMask
from .args import positive_int
from .workloads import WORKLOADS

__all__ = ["INPUT_KINDS", "ErrorRow", "inputs", "row_errors", "measure", "scheme_from_name",
           "main"]

INPUT_KINDS = ("random", "outliers")
DEFAULT_SCHEMES = ("qk_e4m3-pv_e4m3-smooth", "qk_e4m3-pv_16bit-smooth-rotate",
                   "qk_int8-pv_e4m3-smooth-rotate", "qk_int8-pv_int8-smooth-rotate-pfixed",
                   "qk_int8-pv_int8-smooth-rotate", "qk_int8-pv_16bit-smooth-rotate")
_BLOCK = 128


@dataclass(frozen=True)
class ErrorRow:
    """One (shape, input kind, scheme): the output's relative error and its worst row's."""

    shape: str
    kind: str
    scheme: str
    error: float
    worst_row: float


def scheme_from_name(name: str) -> quantization.Scheme:
    """The scheme :attr:`tessera.quantization.Scheme.name` gives ``name``."""
    parts = name.split("-")
    if len(parts) < 2 or not parts[0].startswith("qk_") or not parts[1].startswith("pv_"):
        raise ValueError(f"a scheme name reads qk_<format>-pv_<format>[-flag...], got "
                         f"{name!r}")
    flags = set(parts[2:])
    groups = {f"kg{g}": g for g in quantization.K_GROUPS if g != 1}
    known = {"smooth", "rotate", "pfixed", "c64", *groups}
    if not flags <= known:
        raise ValueError(f"unknown scheme flags {sorted(flags - known)} in {name!r} "
                         f"({', '.join(sorted(known))})")
    group = [groups[f] for f in flags if f in groups]
    if len(group) > 1:
        raise ValueError(f"a scheme name takes one kg flag, got {sorted(flags & set(groups))}")
    return quantization.Scheme(qk=parts[0][3:], pv=parts[1][3:], smooth_k="smooth" in flags,
                               rotate="rotate" in flags, p_per_chunk="pfixed" not in flags,
                               chunk_keys=64 if "c64" in flags else 128,
                               k_group=group[0] if group else 1)


def _bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (to nearest even), as float64."""
    bits = x.astype(np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
    return bits.view(np.float32).astype(np.float64)


def inputs(kind: str, heads: int, seq_len: int, head_dim: int, seed: int = 0
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v ``[1, heads, seq_len, head_dim]`` of input ``kind`` (the module's docstring)."""
    if kind not in INPUT_KINDS:
        raise ValueError(f"kind must be one of {INPUT_KINDS}, got {kind!r}")
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, heads, seq_len, head_dim)) for _ in range(3))
    if kind == "outliers":
        q[..., :4] *= 4.0
        k[..., :4] *= 4.0
        k[..., 4:8] += 4.0
        v[..., :2] *= 10.0
    return _bf16(q), _bf16(k), _bf16(v)


def row_errors(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(relative error of the whole output, worst relative error of a row) over the rows the
    reference does not leave zero."""
    g, r = got.reshape(-1, got.shape[-1]), ref.reshape(-1, ref.shape[-1])
    norm = np.linalg.norm(r, axis=1)
    live = norm > 0
    whole = float(np.linalg.norm(g[live] - r[live]) / np.linalg.norm(r[live]))
    return whole, float((np.linalg.norm(g[live] - r[live], axis=1) / norm[live]).max())


def _sampled_mask(heads: int, seq_len: int, rows: int, seed: int) -> BlockMask:
    """A random 10% mask of ``_BLOCK``-token blocks with only ``rows`` query blocks a head kept
    (the rest select nothing, so the references skip them)."""
    dense = np.asarray(random_blocks(heads, seq_len, _BLOCK, density=0.1, seed=seed)
                       .mask.to_dense())
    dense = dense.reshape(heads, *dense.shape[-2:]).copy()
    rng = np.random.default_rng(seed + 1)
    for h in range(heads):
        keep = rng.choice(dense.shape[1], size=min(rows, dense.shape[1]), replace=False)
        drop = np.setdiff1d(np.arange(dense.shape[1]), keep)
        dense[h, drop] = False
        dense[h, keep, rng.integers(dense.shape[2], size=keep.size)] = True  # none left empty
    return BlockMask.from_dense(dense, block_size=_BLOCK, seq_len_q=seq_len, seq_len_kv=seq_len)


def measure(shapes: Sequence[str], schemes: Sequence[quantization.Scheme], *, heads: int = 2,
            rows: int = 4, seed: int = 0) -> list[ErrorRow]:
    """The errors of every (shape, input kind, scheme): ``heads`` heads of each shape, ``rows``
    query blocks a head."""
    out = []
    for name in shapes:
        w = WORKLOADS[name]
        mask = _sampled_mask(heads, w.seq_len, rows, seed)
        for kind in INPUT_KINDS:
            q, k, v = inputs(kind, heads, w.seq_len, w.head_dim, seed)
            ref = reference.attention(q, k, v, mask)
            for s in schemes:
                err = row_errors(quantization.attention(q, k, v, mask, scheme=s), ref)
                out.append(ErrorRow(name, kind, s.name, *err))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the errors' table; 0 done, 2 bad arguments."""
    ap = argparse.ArgumentParser(prog="python -m tessera quant-error",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="wan-1.3b-480p,cogvideox-5b",
                    help=f"comma list of {', '.join(WORKLOADS)}")
    ap.add_argument("--schemes", default=",".join(DEFAULT_SCHEMES),
                    help="comma list of scheme names (qk_<e4m3|int8>-pv_<e4m3|int8|16bit>"
                         "[-smooth][-rotate][-pfixed][-c64][-kg<16|64|128>]: "
                         "tessera.quantization.Scheme)")
    ap.add_argument("--heads", type=positive_int, default=2, help="heads a shape (default 2)")
    ap.add_argument("--rows", type=positive_int, default=4,
                    help="query blocks a head (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in WORKLOADS]
    if bad or not shapes:
        ap.error(f"--shapes: unknown {bad or 'none given'}; choose from {', '.join(WORKLOADS)}")
    try:
        schemes = [scheme_from_name(s) for s in args.schemes.split(",") if s]
    except (TypeError, ValueError) as exc:
        ap.error(f"--schemes: {exc}")
    if not schemes:
        ap.error("--schemes: none given")
    print(f"{'shape':16} {'input':9} {'scheme':38} {'error':>9} {'worst row':>9}")
    for r in measure(shapes, schemes, heads=args.heads, rows=args.rows, seed=args.seed):
        print(f"{r.shape:16} {r.kind:9} {r.scheme:38} {r.error:9.2e} {r.worst_row:9.2e}")
    return 0
