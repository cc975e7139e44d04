"""q/k/v and output descriptions and every check on them (dtypes, shapes, strides, devices),
made before anything is launched; each error names the argument."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._array import cupy_or_none
from .dtypes import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS
from .interop import DeviceTensor, current_stream_ptr, device_of, framework_of, from_any
from .mask import BlockMask

__all__ = ["Operands", "Outputs", "describe", "describe_outputs", "check_scale", "check_mask",
           "bhld_view", "LAYOUTS"]

LAYOUTS = ("bhld", "blhd")


@dataclass
class Operands:
    """q, k, v described for the kernels, in the ``bhld`` view whatever the layout."""

    q: DeviceTensor
    k: DeviceTensor
    v: DeviceTensor
    shape_q: tuple[int, int, int, int]  # B, Hq, Lq, D (whatever the layout)
    shape_kv: tuple[int, int, int, int]  # B, Hkv, Lkv, D
    strides_q: tuple[int, int, int, int]  # element strides of b, h, l, d
    strides_k: tuple[int, int, int, int]
    strides_v: tuple[int, int, int, int]
    stream_ptr: int  # the caller's current stream (0: the legacy default stream)


@dataclass
class Outputs:
    """Outputs the caller gave to write in place: the description the kernels write through and
    the object handed back (None: Tessera allocates it)."""

    out: tuple[DeviceTensor, Any] | None = None
    lse: tuple[DeviceTensor, Any] | None = None


def bhld_view(t: DeviceTensor, layout: str, name: str
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and element strides of a 4-D tensor of ``layout`` in (b, h, l, d) order."""
    if len(t.shape) != 4:
        raise ValueError(f"{name} must be 4-D ({layout}), got shape {t.shape}")
    if layout == "bhld":
        return t.shape, t.strides
    perm = (0, 2, 1, 3)
    return tuple(t.shape[i] for i in perm), tuple(t.strides[i] for i in perm)


def describe(q: Any, k: Any, v: Any, layout: str) -> Operands:
    """Describe and validate q, k, v (device, dtype, shapes, strides) without touching data."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
    if cupy_or_none() is None:
        raise RuntimeError("the GPU path needs CuPy: pip install 'tessera[cuda13]' (or cuda12)")
    # The caller's stream first: a DLPack producer orders its pending work before it.
    fw = framework_of(q)
    on_host = fw == "torch" and not getattr(q, "is_cuda", True)  # from_any says so below
    stream = 0 if on_host else current_stream_ptr(fw, device_of(q))
    qd = from_any(q, "q", stream)
    kd = from_any(k, "k", stream)
    vd = from_any(v, "v", stream)
    for name, t in (("q", qd), ("k", kd), ("v", vd)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
        if t.device_id != qd.device_id:
            raise ValueError(f"{name} is on device {t.device_id} but q is on {qd.device_id}")
    if not qd.dtype == kd.dtype == vd.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {qd.dtype}, {kd.dtype}, {vd.dtype}")
    sq, tq = bhld_view(qd, layout, "q")
    sk, tk = bhld_view(kd, layout, "k")
    sv, tv = bhld_view(vd, layout, "v")
    b, hq, lq, d = sq
    if sk[0] != b or sv[0] != b:
        raise ValueError(f"batch of k {sk[0]} / v {sv[0]} must equal batch of q {b}")
    if sk[:3] != sv[:3]:
        raise ValueError(f"k {sk} and v {sv} must agree in batch, heads and length")
    if sk[3] != d or sv[3] != d:
        raise ValueError(f"head dims must agree: q {d}, k {sk[3]}, v {sv[3]}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {d} is not supported (supported: {SUPPORTED_HEAD_DIMS})")
    if sk[1] == 0 or hq % sk[1]:
        raise ValueError(f"q heads {hq} must be a multiple of k/v heads {sk[1]}")
    for name, t, st in (("q", qd, tq), ("k", kd, tk), ("v", vd, tv)):
        if st[3] != 1:
            raise ValueError(f"{name} must be contiguous in the head dim (stride 1), got {st[3]}")
        if any(s % 8 for s in st[:3]) or t.ptr % 16:
            raise ValueError(f"{name} strides {st} (elements) and address must be 16-byte "
                             "aligned (multiples of 8 elements)")
        if min(st[:3]) < 0:
            raise ValueError(f"{name} has negative strides {st}")
    return Operands(qd, kd, vd, sq, sk, tq, tk, tv, stream)


def check_scale(scale: Any) -> None:
    """``scale`` must be None (1/sqrt(D)) or a positive finite number: the kernels mask a score
    as -inf before scaling it inside exp2, which a zero, negative or NaN scale would turn into
    NaN or into rows of zeros."""
    if scale is None:
        return
    try:
        if isinstance(scale, (str, bytes)):  # float() would parse them
            raise TypeError
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale must be a number or None, got {type(scale).__name__}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"scale must be positive and finite, got {value}")


def check_mask(mask: BlockMask, b: int, hq: int, hkv: int, lq: int, lkv: int) -> None:
    """The mask must cover q's and k's tokens and broadcast over their batch and heads."""
    if (mask.seq_len_q, mask.seq_len_kv) != (lq, lkv):
        raise ValueError(f"block_mask covers ({mask.seq_len_q}, {mask.seq_len_kv}) tokens but "
                         f"q/k have ({lq}, {lkv})")
    mask.head_index(hq, hkv)  # raises ValueError when the mask's heads fit neither
    mask.batch_index(b)


def describe_outputs(ops: Operands, layout: str, out: Any, lse: Any) -> Outputs:
    """Validate caller-provided outputs (``out`` like q, ``lse`` float32 ``[B, Hq, Lq]``)."""
    given = Outputs()
    b, hq, lq, d = ops.shape_q
    if out is not None:
        od = from_any(out, "out", ops.stream_ptr)
        want = (b, hq, lq, d) if layout == "bhld" else (b, lq, hq, d)
        if od.shape != want:
            raise ValueError(f"out must have shape {want} ({layout}), got {od.shape}")
        if od.dtype != ops.q.dtype:
            raise TypeError(f"out must be {ops.q.dtype} like q, got {od.dtype}")
        if od.strides[3] != 1 or any(s_ % 2 for s_ in od.strides[:3]) or od.ptr % 4:
            raise ValueError(f"out must be contiguous in the head dim with even strides, got "
                             f"strides {od.strides}")
        if od.device_id != ops.q.device_id:
            raise ValueError(f"out is on device {od.device_id} but q is on {ops.q.device_id}")
        given.out = (od, out)
    if lse is not None:
        ld = from_any(lse, "lse", ops.stream_ptr)
        if ld.shape != (b, hq, lq) or ld.dtype != "float32" or ld.strides != (hq * lq, lq, 1):
            raise ValueError(f"lse must be a contiguous float32 array of shape {(b, hq, lq)}, "
                             f"got {ld.dtype} {ld.shape} strides {ld.strides}")
        given.lse = (ld, lse)
    return given
