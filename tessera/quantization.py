"""The numbers of an 8-bit forward, on the host: how a scheme rounds Q, K, V and the
probabilities, and attention computed in float64 from the rounded operands.

Which quantization keeps the error within bounds is a question of numbers, not of kernels, so it
is answered here, where it runs anywhere: :func:`attention` is the oracle an 8-bit kernel is
checked against (its only other error is float32 accumulation), and its distance from
:func:`tessera.reference.attention` is the error the scheme itself costs.

Hopper's tensor cores multiply e4m3 and 8-bit integers at the same rate (twice bf16's), so a
scheme picks per product:

- ``e4m3`` (PTX ``e4m3``): 4 exponent bits, 3 mantissa bits, largest finite 448, subnormals
  down to 2^-9; conversions round to nearest even and saturate to +-448 (``cvt.rn.satfinite``).
  Its relative step (2^-4 to 2^-3) is the same for small and large values.
- ``int8``: signed integers in [-127, 127] (the probabilities, which are never negative, as
  unsigned [0, 255]) times a scale: a fixed step over the whole group, so values near the
  group's largest keep 7 bits, and the step that small values get is what a heavy-tailed group
  costs; products accumulate exactly in int32.
- ``16bit`` (P . V only): P and V stay bf16/fp16, as the 16-bit kernels multiply them.

Two exact rewrites make the operands easier to round: ``smooth_k`` subtracts K's per-channel mean
over the head's tokens (each score of a query row moves by the same q . mean, so the softmax is
unchanged) and ``rotate`` multiplies Q and K by one orthogonal matrix H along the head dim
(Q H (K H)^T = Q K^T): a Walsh-Hadamard matrix with fixed random signs, which spreads an outlier
channel over every channel, so it stops setting every token's scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._array import to_numpy
from .mask import BlockMask
from .operands import host_operands
from .reference import selected_blocks

__all__ = ["E4M3_MAX", "INT8_MAX", "UINT8_MAX", "FORMATS", "K_GROUPS", "INT8_CHUNK_ALIGN",
           "Scheme", "QuantizedOperands", "checked_scheme", "kernels_round", "round_e4m3",
           "quantize", "rotation", "rotation_factors", "quantized_operands", "attention"]

E4M3_MAX = 448.0
INT8_MAX = 127.0
UINT8_MAX = 255.0
FORMATS = ("e4m3", "int8")
_PV_FORMATS = FORMATS + ("16bit",)
K_GROUPS = (1, 16, 64, 128)  # Scheme.k_group's choices: a token, or a kernel's key granules
# P's chunks start at multiples of this many keys (the 8-bit kernel's V is reordered within each
# 16 keys, so its chunks' first columns sit there): a span's first chunk starts at or below it.
INT8_CHUNK_ALIGN = 16
_MIN_NORMAL_EXP = -6  # e4m3's smallest normal, 2^-6
_MANTISSA_BITS = 3
_ROTATION_SEED = 0x7E55  # the signs of the rotation: fixed, so every run rotates alike
_ROTATION_BLOCK = 32  # head dims that are not a power of two rotate 32 channels at a time


def round_e4m3(x: Any) -> np.ndarray:
    """``x`` (as float64) rounded to the nearest e4m3 value, ties to even, saturated to +-448;
    NaN stays NaN."""
    a = _real_array(x, "x")
    mag = np.abs(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e = np.frexp(mag)  # mag = f * 2^e with f in [0.5, 1): the binade's exponent is e - 1
    exp = np.maximum(e.astype(np.int64) - 1, _MIN_NORMAL_EXP)  # subnormals share 2^-6's step
    step = np.ldexp(1.0, exp - _MANTISSA_BITS)
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.minimum(np.round(mag / step) * step, E4M3_MAX)  # np.round: ties to even
    return np.where(np.isnan(a), np.nan, np.copysign(r, a))


@dataclass(frozen=True)
class Scheme:
    """How an 8-bit forward rounds. ``qk``: the format of Q and K (scaled per token); ``pv``:
    the format of P and V (V scaled per channel over the head's tokens), or "16bit";
    ``smooth_k`` and ``rotate``: the exact rewrites of the module's docstring.

    P is rounded a chunk at a time, as a kernel walks the keys: ``chunk_keys`` consecutive keys
    of a run of adjacent selected key blocks (a span), from the multiple of 16 keys at or below
    the span's start (:data:`INT8_CHUNK_ALIGN`), the first chunk holding the span's keys of it.
    With int8 each row's chunk is scaled by its own largest P (``p_per_chunk``; else by 1, the
    bound of every P), so a chunk far below the row's maximum keeps 8 bits instead of the few
    the step of 1/255 leaves it; e4m3, a floating format, is scaled by 448 either way.

    ``k_group``: K's step shared by that many consecutive tokens of a head (1: a step a token,
    what the kernels take). A step a group of keys would let a kernel scale a chunk's scores by
    one factor a row and key group, folded into the exponent's FMA, instead of converting and
    multiplying each score by its key's step; the oracle says what it costs in error
    (``python -m tessera quant-error``). The kernels and the emulator take 1 only."""

    qk: str = "int8"
    pv: str = "int8"
    smooth_k: bool = True
    rotate: bool = True
    p_per_chunk: bool = True
    chunk_keys: int = 128
    k_group: int = 1

    def __post_init__(self) -> None:
        if self.qk not in FORMATS:
            raise ValueError(f"qk must be one of {FORMATS}, got {self.qk!r}")
        if self.pv not in _PV_FORMATS:
            raise ValueError(f"pv must be one of {_PV_FORMATS}, got {self.pv!r}")
        for name in ("smooth_k", "rotate", "p_per_chunk"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        c = self.chunk_keys
        if isinstance(c, bool) or not isinstance(c, int) or c not in (64, 128):
            raise ValueError(f"chunk_keys must be 64 or 128 (a kernel's key step), got {c!r}")
        g = self.k_group
        if isinstance(g, bool) or not isinstance(g, int) or g not in K_GROUPS:
            raise ValueError(f"k_group must be one of {K_GROUPS} (keys sharing K's step), got "
                             f"{g!r}")

    @property
    def name(self) -> str:
        """E.g. ``qk_int8-pv_int8-smooth-rotate`` (P per chunk of 128 keys and a K step a token,
        the defaults, are not spelled; ``-pfixed``, ``-c64`` and ``-kg16`` say otherwise)."""
        return "-".join([f"qk_{self.qk}", f"pv_{self.pv}"] + ["smooth"] * self.smooth_k
                        + ["rotate"] * self.rotate + ["pfixed"] * (not self.p_per_chunk)
                        + [f"c{self.chunk_keys}"] * (self.chunk_keys != 128)
                        + [f"kg{self.k_group}"] * (self.k_group != 1))


def checked_scheme(scheme: Any) -> Scheme:
    """``scheme``, or a TypeError naming the argument where it is no :class:`Scheme`."""
    if not isinstance(scheme, Scheme):
        raise TypeError(f"scheme must be a tessera.quantization.Scheme, got "
                        f"{type(scheme).__name__}")
    return scheme


def kernels_round(scheme: Scheme) -> bool:
    """Whether the 8-bit kernels (and their pre-pass) compute ``scheme``'s rounding: int8
    scores with a K step a token, P V in int8 or 16 bits (the rewrites and P's chunking are
    theirs to follow either way)."""
    return scheme.qk == "int8" and scheme.k_group == 1 and scheme.pv in ("int8", "16bit")


def quantize(x: Any, fmt: str, axis: int | tuple[int, ...] = -1, *, unsigned: bool = False
             ) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as ``fmt`` values and float64 scales, ``x ~= values * scales``: one scale per
    slice along ``axis`` (kept as a length-1 axis), its largest magnitude over the format's
    largest value (1 for a slice of zeros). ``unsigned`` (int8 only): values in [0, 255], for
    operands never negative."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if unsigned and fmt != "int8":
        raise ValueError("unsigned applies to the int8 format only")
    a = _real_array(x, "x")
    if a.ndim == 0:
        raise ValueError("x must have at least one axis, got a scalar")
    for ax in (axis,) if isinstance(axis, (int, np.integer)) else axis:
        if isinstance(ax, bool) or not isinstance(ax, (int, np.integer)) or not (
                -a.ndim <= ax < a.ndim):
            raise ValueError(f"axis must be an int (or ints) in [-{a.ndim}, {a.ndim}) for x of "
                             f"{a.ndim} axes, got {axis!r}")
    top = E4M3_MAX if fmt == "e4m3" else UINT8_MAX if unsigned else INT8_MAX
    amax = np.abs(a).max(axis=axis, keepdims=True)
    scales = np.where(amax > 0, amax / top, 1.0)
    return _round(a / scales, fmt, unsigned), scales


def _real_array(x: Any, name: str) -> np.ndarray:
    """``x`` as float64, or a TypeError naming it where it holds no real numbers."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError):
        a = None
    if a is None or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)
                         or a.dtype == np.bool_):
        raise TypeError(f"{name} must hold real numbers, got {type(x).__name__}"
                        + (f" of {a.dtype}" if isinstance(x, np.ndarray) else ""))
    return a.astype(np.float64)


def _round(x: np.ndarray, fmt: str, unsigned: bool = False) -> np.ndarray:
    """``x``, already scaled into the format's range, rounded to it."""
    if fmt == "e4m3":
        return round_e4m3(x)
    return np.clip(np.round(x), 0.0 if unsigned else -INT8_MAX,
                   UINT8_MAX if unsigned else INT8_MAX)


def rotation_factors(head_dim: int) -> np.ndarray:
    """Channel j's factor after the Walsh-Hadamard transform of its block: ``sign_j / sqrt(n)``
    (``n`` the block: the head dim where it is a power of two, else 32), so that rotating a row
    x is ``factors * H x`` with H the unnormalized Sylvester matrix of each block -- what a
    kernel computes with butterflies."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    n = _rotation_block(head_dim)
    if head_dim % n:
        raise ValueError(f"head_dim must be a power of two or a multiple of {_ROTATION_BLOCK}, "
                         f"got {head_dim}")
    signs = np.random.default_rng(_ROTATION_SEED).choice([-1.0, 1.0], size=head_dim)
    return signs / np.sqrt(n)


def _rotation_block(head_dim: int) -> int:
    return head_dim if head_dim & (head_dim - 1) == 0 else _ROTATION_BLOCK


def rotation(head_dim: int) -> np.ndarray:
    """The orthogonal ``[head_dim, head_dim]`` matrix ``rotate`` multiplies Q and K by: a
    Walsh-Hadamard matrix with fixed random column signs, over the whole head dim where that
    is a power of two, else block-diagonal over 32 channels at a time (96 = 3 x 32)."""
    factors = rotation_factors(head_dim)
    n = _rotation_block(int(head_dim))
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return np.kron(np.eye(head_dim // n), h) * factors[None, :]


@dataclass(frozen=True)
class QuantizedOperands:
    """A scheme's rounded operands, ``[B, H, L, D]`` each (``bhld`` whatever the inputs'
    layout), as float64 values of the format (int8 codes as integers), with their scales:
    ``q_scale`` / ``k_scale`` ``[B, H, L, 1]`` (one a token), ``v_scale`` ``[B, Hkv, 1, D]``
    (one a channel; ones, and V as given, where P . V stays 16-bit). Q and K are after the
    scheme's rewrites: x ~= values * scale is the smoothed, rotated operand."""

    q: np.ndarray
    q_scale: np.ndarray
    k: np.ndarray
    k_scale: np.ndarray
    v: np.ndarray
    v_scale: np.ndarray


def quantized_operands(q: Any, k: Any, v: Any, scheme: Scheme, *, layout: str = "bhld"
                       ) -> QuantizedOperands:
    """What ``scheme`` makes of q, k and v before any product (the device's pre-pass computes
    the same): K smoothed, Q and K rotated where the scheme says, then each rounded."""
    checked_scheme(scheme)
    q4, k4, v4 = (to_numpy(x).astype(np.float64) for x in host_operands(q, k, v, layout))
    if scheme.smooth_k:
        k4 = k4 - k4.mean(axis=2, keepdims=True)
    if scheme.rotate:
        r = rotation(q4.shape[-1])
        q4, k4 = q4 @ r, k4 @ r
    q8, sq = quantize(q4, scheme.qk, -1)
    k8, sk = _quantize_key_groups(k4, scheme.qk, scheme.k_group)
    if scheme.pv == "16bit":
        v8, sv = v4, np.ones(v4.shape[:2] + (1, v4.shape[3]))
    else:
        v8, sv = quantize(v4, scheme.pv, 2)
    return QuantizedOperands(q8, sq, k8, sk, v8, sv)


def _quantize_key_groups(k: np.ndarray, fmt: str, group: int) -> tuple[np.ndarray, np.ndarray]:
    """K ``[B, H, L, D]`` rounded with one step for each ``group`` consecutive tokens of a head
    (the last group may be short): values ``[B, H, L, D]`` and steps ``[B, H, L, 1]`` (a group's
    step repeated for each of its tokens)."""
    if group == 1:
        return quantize(k, fmt, -1)
    b, h, n, d = k.shape
    groups = -(-n // group)
    padded = np.zeros((b, h, groups * group, d))
    padded[:, :, :n] = k  # (zero rows move no group's largest magnitude)
    values, steps = quantize(padded.reshape(b, h, groups, group, d), fmt, (-2, -1))
    return (values.reshape(b, h, groups * group, d)[:, :, :n],
            np.repeat(steps[..., 0], group, axis=2)[:, :, :n])


def attention(q: Any, k: Any, v: Any, block_mask: BlockMask, *, scheme: Scheme = Scheme(),
              scale: float | None = None, layout: str = "bhld", return_lse: bool = False
              ) -> Any:
    """Block-sparse attention from ``scheme``'s rounded operands, computed in float64: what an
    8-bit kernel of that scheme computes up to float32 accumulation. Arguments and output as
    :func:`tessera.reference.attention`'s; rows that select nothing are 0 (LSE -inf), the LSE
    that of the rounded scores (the kernel's).

    Per query block row: S = (Q8 K8^T) sq sk^T, P = exp(scale (S - max)), l = rowsum(P) (P
    before rounding, as a kernel sums it in float32), O = (P8 V8 sv) / l, P8 being P rounded
    chunk by chunk (:class:`Scheme`)."""
    ops = quantized_operands(*host_operands(q, k, v, layout, scale, block_mask), scheme)
    b, hq, lq, d = ops.q.shape
    hkv = ops.k.shape[1]
    group = hq // hkv
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    q8, sq, k8, sk = ops.q, ops.q_scale, ops.k, ops.k_scale
    v4 = ops.v * ops.v_scale  # V8 sv: its rounding is what the oracle keeps

    out = np.zeros((b, hq, lq, v4.shape[3]))
    lse = np.full((b, hq, lq), -np.inf)
    for bi, h, rows, keys in selected_blocks(block_mask.to_host(), b, hq, hkv):
        g = h // group
        s = (q8[bi, h, rows] @ k8[bi, g, keys].T) * sq[bi, h, rows] * sk[bi, g, keys, 0]
        with np.errstate(invalid="ignore", over="ignore"):
            p = np.exp((s - s.max(axis=1, keepdims=True)) * scale)
        denom = p.sum(axis=1, keepdims=True)
        lse[bi, h, rows] = s.max(axis=1) * scale + np.log(denom[:, 0])
        if scheme.pv != "16bit":
            p = _round_probabilities(p, keys, scheme)
        out[bi, h, rows] = (p @ v4[bi, g, keys]) / denom
    out = out.transpose(0, 2, 1, 3) if layout == "blhd" else out
    return (out, lse) if return_lse else out


def _round_probabilities(p: np.ndarray, keys: np.ndarray, scheme: Scheme) -> np.ndarray:
    """P ``[rows, keys]`` (at most 1) rounded to ``scheme.pv`` a chunk at a time: the chunks of
    each span of consecutive ``keys``, ``scheme.chunk_keys`` keys from the multiple of
    INT8_CHUNK_ALIGN at or below its start."""
    if scheme.pv == "e4m3":
        return round_e4m3(p * E4M3_MAX) / E4M3_MAX
    starts = np.flatnonzero(np.diff(keys, prepend=keys[0] - 2) != 1)  # where a span starts
    span_start = starts[np.searchsorted(starts, np.arange(keys.size), side="right") - 1]
    first = keys[span_start] - keys[span_start] % INT8_CHUNK_ALIGN  # the first chunk's column 0
    chunk = (keys - first) // scheme.chunk_keys * keys.size + span_start  # unique per span
    out = np.empty_like(p)
    for c in np.unique(chunk):
        cols = chunk == c
        top = p[:, cols].max(axis=1, keepdims=True) if scheme.p_per_chunk else np.ones(
            (p.shape[0], 1))
        top = np.where(top > 0, top, 1.0)
        out[:, cols] = np.round(p[:, cols] / top * UINT8_MAX) * (top / UINT8_MAX)
    return out
