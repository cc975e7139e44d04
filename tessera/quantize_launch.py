"""The 8-bit forward's pre-pass on the GPU: q, k, v rounded as a :class:`quantization.Scheme`
says, by the kernels of ``cuda/quantize.cu``, on the caller's stream and without a host
synchronization. The numbers are :func:`tessera.quantization.quantized_operands`', in float32
(a code may differ by one where float64 lands on a rounding boundary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._array import cupy_or_none
from .capture import device_copy
from .cuda.loader import load_kernel
from .cuda.variants import Variant
from .operands import describe
from .quantization import Scheme, checked_scheme, kernels_round, rotation_factors
from .settings import config
from .streams import cupy_stream

__all__ = ["QuantizedOnDevice", "quantize_operands", "v_key_order", "check_int8", "PAD_KEYS",
           "INT8_HEAD_DIMS", "PRECISION_SCHEMES"]

_THREADS = 256  # every pre-pass kernel's launch bound
_CHUNK_TOKENS = 512  # tokens a partial of the channel statistics covers
PAD_KEYS = 64  # the transposed V's rows are padded to a multiple of this many keys (zeros)
INT8_HEAD_DIMS = (64, 128)  # the 8-bit kernel's (sm90/traits.cuh, INT8)
# The 8-bit forwards by their precision names (``tessera.attention(precision=...)``): "int8"
# rounds both products (the kernel's INT8 1), "int8-qk" the scores alone, P V in 16 bits (2).
PRECISION_SCHEMES = {"int8": Scheme(), "int8-qk": Scheme(pv="16bit")}


@dataclass(frozen=True)
class QuantizedOnDevice:
    """The pre-pass's output (CuPy arrays on the inputs' device): ``q`` / ``k`` int8
    ``[B, H, L, D]`` (contiguous, after the scheme's rewrites), their steps ``q_scale``
    float32 ``[B, Hq, Lq]`` and ``k_scale`` float32 ``[B, Hkv, L_pad]`` (zeros past the keys,
    as the 8-bit kernel copies a chunk); ``v_t`` int8 ``[B, Hkv, D, L_pad]`` (None where the
    scheme keeps P V in 16 bits), V transposed (keys
    contiguous in :func:`v_key_order`, ``L_pad`` the key count rounded up to :data:`PAD_KEYS`,
    zeros past it), its steps ``v_scale`` float32 ``[B, Hkv, D]``."""

    q: Any
    q_scale: Any
    k: Any
    k_scale: Any
    v_t: Any
    v_scale: Any


def v_key_order(keys: int) -> np.ndarray:
    """The key each column of the transposed V holds, for ``keys`` columns (a multiple of 16):
    within every 16 keys, column 4q + e holds key 2q + e (e < 2) or 8 + 2q + e - 2. A thread's
    S accumulator holds keys 2q, 2q + 1 of two key octets, and its A fragment of the 8-bit
    P V takes 4 consecutive keys a register: in this order S's registers are that fragment,
    with no shuffle between the two products."""
    if not isinstance(keys, (int, np.integer)) or keys < 0 or keys % 16:
        raise ValueError(f"keys must be a non-negative multiple of 16, got {keys!r}")
    f = np.arange(16)
    within = np.where(f % 4 < 2, 2 * (f // 4) + f % 4, 8 + 2 * (f // 4) + f % 4 - 2)
    return (np.arange(0, keys, 16)[:, None] + within[None, :]).reshape(-1)


def check_int8(head_dim: int, cc: int | None, capturing: bool = False,
               precision: str = "int8") -> None:
    """Refuse, naming what, an 8-bit forward (``precision``, a :data:`PRECISION_SCHEMES`
    name) its kernel cannot run: a GPU other than Hopper (compute capability ``cc``), a head
    dim other than 64 or 128, a CUDA-graph capture."""
    if head_dim not in INT8_HEAD_DIMS:
        raise ValueError(f"precision={precision!r} takes head dims {INT8_HEAD_DIMS}, got "
                         f"{head_dim}")
    if cc != 90:
        raise ValueError(f"precision={precision!r} runs on Hopper GPUs (sm_90) only; this "
                         f"device is sm_{cc}")
    if capturing:
        raise ValueError(f"precision={precision!r} cannot be captured into a CUDA graph: its "
                         "pre-pass copies the rotation's factors to the GPU")


def _checked_scheme(scheme: Any) -> Scheme:
    """``scheme`` if the GPU pre-pass rounds it (int8 scores; P V in int8 or 16 bits), else the
    error naming it."""
    if not kernels_round(checked_scheme(scheme)):
        raise ValueError(f"the GPU pre-pass rounds to int8 only (qk='int8', pv='int8' or "
                         f"'16bit', a K step a token), got scheme {scheme.name}")
    return scheme


def quantize_operands(q: Any, k: Any, v: Any, *, scheme: Scheme = Scheme(),
                      layout: str = "bhld") -> QuantizedOnDevice:
    """q, k, v (bf16 or fp16 CUDA tensors, ``layout``) rounded by ``scheme`` on the GPU:
    K's channel means and V's channel steps first (two launches, summed in a fixed order, so
    every run gives the same codes), then Q's and K's rows and V transposed."""
    scheme = _checked_scheme(scheme)
    ops = describe(q, k, v, layout)
    cp = cupy_or_none()
    b, hq, lq, d = ops.shape_q
    _, hkv, lkv, _ = ops.shape_kv
    bf16 = ops.q.dtype == "bfloat16"

    def kernel(name: str) -> Any:
        return load_kernel(Variant.quantize(name, head_dim=d, bf16=bf16))

    i64, i32, ptr = np.int64, np.int32, np.uint64
    pad = -(-lkv // PAD_KEYS) * PAD_KEYS
    chunks = -(-lkv // _CHUNK_TOKENS)
    stream = cupy_stream(ops.stream_ptr, ops.q.device_id)
    with cp.cuda.Device(ops.q.device_id), stream:
        out = QuantizedOnDevice(
            cp.empty((b, hq, lq, d), cp.int8), cp.empty((b, hq, lq), cp.float32),
            cp.empty((b, hkv, lkv, d), cp.int8), cp.zeros((b, hkv, pad), cp.float32),
            cp.empty((b, hkv, d, pad), cp.int8) if scheme.pv == "int8" else None,
            cp.empty((b, hkv, d), cp.float32))
        if config.poison_outputs:  # NaN steps, codes -128 (no code is): nothing unwritten passes
            for a in vars(out).values():
                if a is not None:
                    a.fill(np.nan if a.dtype == cp.float32 else -128)
        k_sums = cp.empty((b * hkv, chunks, d), cp.float32)
        v_amax = cp.empty_like(k_sums)
        k_mean = cp.empty((b * hkv, d), cp.float32)
        kv = (ptr(ops.k.ptr), *map(i64, ops.strides_k[:3]),
              ptr(ops.v.ptr), *map(i64, ops.strides_v[:3]))
        kernel("quant_channel_partials")((chunks, b * hkv), (_THREADS,), (
            *kv, i32(hkv), i32(lkv), i32(_CHUNK_TOKENS), k_sums, v_amax))
        n = b * hkv * d
        kernel("quant_channel_finish")((-(-n // _THREADS),), (_THREADS,), (
            k_sums, v_amax, i32(chunks), i32(lkv), i64(n), k_mean, out.v_scale))
        factors = (device_copy(("rotation", d), lambda: cp.asarray(
            rotation_factors(d), dtype=cp.float32), cp) if scheme.rotate else None)
        rows = kernel("quant_rows")
        per_cta = _THREADS // 32
        for x, strides, heads, seq, mean, dst, scales in (
                (ops.q, ops.strides_q, hq, lq, None, out.q, out.q_scale),
                (ops.k, ops.strides_k, hkv, lkv, k_mean if scheme.smooth_k else None, out.k,
                 out.k_scale)):
            count = b * heads * seq
            rows((-(-count // per_cta),), (_THREADS,), (
                ptr(x.ptr), *map(i64, strides[:3]), i32(heads), i32(seq), i64(count),
                _or_null(mean), _or_null(factors), dst, scales, i32(scales.shape[2])))
        if out.v_t is not None:
            kernel("quant_v_transposed")((pad // PAD_KEYS, b * hkv), (_THREADS,), (
                ptr(ops.v.ptr), *map(i64, ops.strides_v[:3]), i32(hkv), i32(lkv), i32(pad),
                out.v_scale, out.v_t))
    return out


def _or_null(a: Any) -> Any:
    """A device array argument, or a null pointer for none."""
    return np.uint64(0) if a is None else a
