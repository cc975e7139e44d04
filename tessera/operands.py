"""q/k/v and output descriptions and every check on them (dtypes, shapes, strides, devices),
made before anything is launched; each error names the argument."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._array import cupy_or_none, to_numpy
from .cuda import device
from .dtypes import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS
from .interop import (DeviceTensor, as_array, current_stream_ptr, device_of, framework_of,
                      from_any)
from .mask import BlockMask

__all__ = ["Operands", "Outputs", "describe", "describe_outputs", "describe_like_q",
           "describe_lse", "gradient_recorded", "refuse_gradients", "check_scale", "check_mask",
           "bhld_view", "host_operands", "checked_dout", "LAYOUTS"]

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


def gradient_recorded(q: Any, k: Any, v: Any) -> str | None:
    """The name of the first of q, k, v that is a torch tensor requiring grad while autograd
    records (None: no gradient is asked of this call)."""
    torch = sys.modules.get("torch")  # (a torch tensor means torch is imported)
    if torch is None or not torch.is_grad_enabled():
        return None
    return next((name for name, x in (("q", q), ("k", k), ("v", v))
                 if isinstance(x, torch.Tensor) and x.requires_grad), None)


def refuse_gradients(q: Any, k: Any, v: Any) -> None:
    """Refuse torch tensors that require grad while autograd records, where no gradient would
    be recorded (``tessera.attention`` and ``Plan.run`` take them through ``autograd.py``
    first; the backward passes record none): an output without a backward would train
    nothing, silently."""
    name = gradient_recorded(q, k, v)
    if name is not None:
        raise ValueError(f"{name} requires grad, but this call records no gradient (a backward "
                         "pass's gradients have none of their own): run it under "
                         "torch.no_grad()")


def describe(q: Any, k: Any, v: Any, layout: str) -> Operands:
    """Describe and validate q, k, v (device, dtype, shapes, strides) without touching data."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
    refuse_gradients(q, k, v)
    if cupy_or_none() is None or device.gpu_count() == 0:
        # Inputs first (a host array or a non-array is the caller's mistake anywhere), then
        # the machine: without CuPy or a GPU there is no CUDA tensor to pass.
        for name, x in (("q", q), ("k", k), ("v", v)):
            from_any(x, name)
        device.require_gpu("a GPU run (tessera.attention, Plan.run)")
        raise RuntimeError("a GPU run (tessera.attention, Plan.run) needs a CUDA GPU, and none "
                           "is visible")
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
    _check_shapes(sq, sk, sv, kd.shape, vd.shape, layout)
    if sk[3] != d or sv[3] != d:
        raise ValueError(f"head dims must agree: q {d}, k {sk[3]}, v {sv[3]}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {d} is not supported (supported: {SUPPORTED_HEAD_DIMS})")
    for name, t, st in (("q", qd, tq), ("k", kd, tk), ("v", vd, tv)):
        if st[3] != 1:
            raise ValueError(f"{name} must be contiguous in the head dim (stride 1), got {st[3]}")
        if any(s % 8 for s in st[:3]) or t.ptr % 16:
            raise ValueError(f"{name} strides {st} (elements) and address must be 16-byte "
                             "aligned (multiples of 8 elements)")
        if min(st[:3]) < 0:
            raise ValueError(f"{name} has negative strides {st}")
    return Operands(qd, kd, vd, sq, sk, tq, tk, tv, stream)


def _check_shapes(sq: tuple, sk: tuple, sv: tuple, k_shape: tuple, v_shape: tuple,
                  layout: str) -> None:
    """What both paths ask of ``[B, H, L, D]`` shapes: one batch, k and v alike in heads and
    length, query heads a multiple of the key/value heads (``k_shape``/``v_shape``: as the
    caller gave them, for the message)."""
    b, hq = sq[0], sq[1]
    if sk[0] != b or sv[0] != b:
        raise ValueError(f"batch of k {sk[0]} / v {sv[0]} must equal batch of q {b}")
    if tuple(sk[1:3]) != tuple(sv[1:3]):
        raise ValueError(f"k and v must agree in heads and length, got k {tuple(k_shape)} and "
                         f"v {tuple(v_shape)} ({layout})")
    if sk[1] < 1 or hq % sk[1]:
        raise ValueError(f"q heads {hq} must be a multiple of k/v heads {sk[1]}")


# The largest scale the kernels take: they multiply scores by scale * log2(e) in float32.
MAX_SCALE = float(np.finfo(np.float32).max) / 1.4426950408889634


def check_scale(scale: Any) -> None:
    """``scale`` must be None (1/sqrt(D)) or a positive finite number the kernels can hold: they
    mask a score as -inf before scaling it inside exp2, which a zero, negative or NaN scale would
    turn into NaN or into rows of zeros, and scale by ``scale * log2(e)`` in float32."""
    if scale is None:
        return
    try:
        if isinstance(scale, (str, bytes)):  # float() would parse them
            raise TypeError
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale must be a number or None, got {type(scale).__name__}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_SCALE):
        raise ValueError(f"scale must be positive and finite, at most {MAX_SCALE:.3g} (the "
                         f"kernels scale scores in float32), got {value}")


def check_mask(mask: BlockMask, b: int, hq: int, hkv: int, lq: int, lkv: int,
               layout: str | None = None) -> None:
    """The mask must cover q's and k's tokens and broadcast over their batch and heads."""
    if (mask.seq_len_q, mask.seq_len_kv) != (lq, lkv):
        hint = ""
        if layout is not None and (hq, hkv) == (mask.seq_len_q, mask.seq_len_kv):
            other = "blhd" if layout == "bhld" else "bhld"
            hint = (f"; read as layout={layout!r} ([B, H, L, D] for 'bhld', [B, L, H, D] for "
                    f"'blhd'), the heads axis holds the mask's token counts: layout={other!r}?")
        raise ValueError(f"block_mask covers ({mask.seq_len_q}, {mask.seq_len_kv}) tokens but "
                         f"q/k have ({lq}, {lkv}){hint}")
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
        if min(od.strides[:3]) <= 0:
            raise ValueError(f"out must not have zero or negative strides (rows would overlap), "
                             f"got strides {od.strides}")
        for name, t in (("q", ops.q), ("k", ops.k), ("v", ops.v)):
            if _overlap(od, t):
                raise ValueError(f"out overlaps {name} in memory: the kernels read {name} "
                                 "while they write out")
        given.out = (od, out)
    if lse is not None:
        ld = describe_lse(lse, ops, "a contiguous float32 array")
        for name, t in (("q", ops.q), ("k", ops.k), ("v", ops.v)) + (
                (("out", given.out[0]),) if given.out is not None else ()):
            if _overlap(ld, t):
                raise ValueError(f"lse overlaps {name} in memory")
        given.lse = (ld, lse)
    return given


def describe_lse(lse: Any, ops: Operands, role: str) -> DeviceTensor:
    """An LSE the caller gives (an output to write, or the forward's for a backward pass):
    float32 ``[B, Hq, Lq]``, contiguous, on q's device; ValueError saying it is ``role``."""
    ld = from_any(lse, "lse", ops.stream_ptr)
    b, hq, lq, _ = ops.shape_q
    if ld.shape != (b, hq, lq) or ld.dtype != "float32" or ld.strides != (hq * lq, lq, 1):
        raise ValueError(f"lse must be {role} of shape {(b, hq, lq)}, got {ld.dtype} "
                         f"{ld.shape} strides {ld.strides}")
    if ld.device_id != ops.q.device_id:
        raise ValueError(f"lse is on device {ld.device_id} but q is on {ops.q.device_id}")
    return ld


def describe_like_q(x: Any, name: str, ops: Operands, layout: str) -> DeviceTensor:
    """A tensor the backward pass reads as it reads q (the forward's ``out``, the gradient
    ``dout``): q's dtype, shape and device, contiguous in the head dim, 16-byte aligned rows;
    ValueError or TypeError naming ``name``."""
    t = from_any(x, name, ops.stream_ptr)
    b, hq, lq, d = ops.shape_q
    want = (b, hq, lq, d) if layout == "bhld" else (b, lq, hq, d)
    if t.shape != want:
        raise ValueError(f"{name} must have q's shape {want} ({layout}), got {t.shape}")
    if t.dtype != ops.q.dtype:
        raise TypeError(f"{name} must be {ops.q.dtype} like q, got {t.dtype}")
    if t.device_id != ops.q.device_id:
        raise ValueError(f"{name} is on device {t.device_id} but q is on {ops.q.device_id}")
    if t.strides[3] != 1 or any(s % 8 for s in t.strides[:3]) or t.ptr % 16 or \
            min(t.strides[:3]) < 0:
        raise ValueError(f"{name} must be contiguous in the head dim with non-negative strides "
                         f"of multiples of 8 elements and a 16-byte aligned address, got "
                         f"strides {t.strides} (make it contiguous)")
    return t


def host_operands(q: Any, k: Any, v: Any, layout: str, scale: Any = None,
                  mask: BlockMask | None = None) -> tuple[Any, Any, Any]:
    """q, k, v for the CPU entry points (the float64 reference, the emulator) as ``[B, H, L, D]``
    views of numpy or CuPy arrays, checked as :func:`describe` checks the GPU path's: real
    floating types, 4-D shapes that agree, a head dim of at least one, query heads a multiple
    of the key/value heads, a valid ``scale`` and, given ``mask``, its token counts and heads."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
    check_scale(scale)
    views, arrays = [], []
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x is None or isinstance(x, (str, bytes)):
            raise TypeError(f"{name} must be an array (numpy, CuPy or a DLPack tensor), got "
                            f"{type(x).__name__}")
        a = as_array(x, name)
        dt = a.dtype
        if not (np.issubdtype(dt, np.floating) or dt.name == "bfloat16"):
            raise TypeError(f"{name} must hold real floating-point values, got dtype {dt}")
        if a.ndim != 4:
            raise ValueError(f"{name} must be 4-D ({layout}: "
                             f"{'[B, H, L, D]' if layout == 'bhld' else '[B, L, H, D]'}), got "
                             f"shape {tuple(a.shape)}")
        arrays.append(a)
        views.append(a if layout == "bhld" else a.transpose(0, 2, 1, 3))
    q4, k4, v4 = views
    b, hq, lq, d = q4.shape
    _, hkv, lkv, dk = k4.shape
    _check_shapes(q4.shape, k4.shape, v4.shape, arrays[1].shape, arrays[2].shape, layout)
    if d < 1 or dk != d or v4.shape[3] < 1:
        raise ValueError(f"head dims must be at least 1 and agree between q and k: q {d}, "
                         f"k {dk}, v {v4.shape[3]}")
    if min(b, hq, lq, lkv) < 1:
        raise ValueError(f"q {tuple(arrays[0].shape)} and k {tuple(arrays[1].shape)} must not "
                         "be empty")
    if mask is not None:
        if not isinstance(mask, BlockMask):
            raise TypeError(f"block_mask must be a tessera.BlockMask, got {type(mask).__name__}")
        check_mask(mask, b, hq, hkv, lq, lkv, layout)
    return q4, k4, v4


def _extent(t: DeviceTensor) -> tuple[int, int]:
    """The byte range [first, last + 1) a tensor's elements span (empty for no elements)."""
    if any(n == 0 for n in t.shape):
        return t.ptr, t.ptr
    last = sum((n - 1) * s for n, s in zip(t.shape, t.strides) if s > 0)
    first = sum((n - 1) * s for n, s in zip(t.shape, t.strides) if s < 0)
    return t.ptr + first * t.itemsize, t.ptr + (last + 1) * t.itemsize


def _overlap(a: DeviceTensor, b: DeviceTensor) -> bool:
    """Whether two tensors' spans of memory on one device intersect (a conservative test: an
    output interleaved with an input in one buffer counts as overlapping)."""
    if a.device_id != b.device_id:
        return False
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a0 < b1 and b0 < a1


def checked_dout(dout: Any, shape: tuple[int, int, int, int], layout: str) -> np.ndarray:
    """The upstream gradient of a backward pass as float64 numpy ``[B, Hq, Lq, Dv]``, checked
    against the output's ``[B, Hq, Lq, Dv]`` ``shape`` in ``layout``; TypeError or ValueError
    naming ``dout`` otherwise."""
    return checked_like_output(dout, "dout", shape, layout)


def checked_like_output(x: Any, name: str, shape: tuple[int, int, int, int],
                        layout: str) -> np.ndarray:
    """``x`` (an upstream gradient, or a forward's output given back to its backward pass) as
    float64 numpy ``[B, Hq, Lq, Dv]``, checked against the output's ``shape`` in ``layout``;
    TypeError or ValueError naming ``name`` otherwise."""
    if x is None or isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be an array (numpy, CuPy or a DLPack tensor), got "
                        f"{type(x).__name__}")
    a = as_array(x, name)
    if not (np.issubdtype(a.dtype, np.floating) or a.dtype.name == "bfloat16"):
        raise TypeError(f"{name} must hold real floating-point values, got dtype {a.dtype}")
    want = shape if layout == "bhld" else (shape[0], shape[2], shape[1], shape[3])
    if tuple(a.shape) != want:
        raise ValueError(f"{name} must have the output's shape {want} ({layout}), got "
                         f"{tuple(a.shape)}")
    a = to_numpy(a).astype(np.float64)
    return a if layout == "bhld" else a.transpose(0, 2, 1, 3)
