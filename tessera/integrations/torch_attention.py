"""Attention on torch tensors for the integrations: ``tessera.attention`` on CUDA tensors
(differentiable there: its backward is the GPU kernels', ``tessera.attention_backward``); on CPU
ones the plan a GPU would run, executed by the CPU emulator in float64 (where the integrations'
CPU tests run the same code paths), with one warning that this path checks correctness, not
speed. On CPU tensors the result is differentiable too: the backward pass is the emulator's, by
the backward queues the GPU kernels walk (``emulate.run_backward``), in float64 -- what a
fine-tuning step's tests run without a GPU."""

from __future__ import annotations

import warnings
from typing import Any

from .. import api, reference
from ..dtypes import SUPPORTED_HEAD_DIMS
from ..mask import BlockMask
from ..quantize_launch import PRECISION_SCHEMES, check_int8
from ..runtime import emulate
from ..runtime.plan import plan
from ..runtime.regime.heuristic import INT8_REGIME

__all__ = ["attention"]

_warned_cpu = False


def attention(q: Any, k: Any, v: Any, mask: BlockMask, *, layout: str,
              scale: float | None = None, return_lse: bool = False, regime: Any = None,
              precision: str | None = None) -> Any:
    """Block-sparse attention of torch ``q``/``k``/``v`` on ``mask``: the output in q's dtype
    (and with ``return_lse`` the float32 LSE), on q's device. ``precision="int8"`` /
    ``"int8-qk"``: an 8-bit forward (on CPU tensors its arithmetic in float64, by the
    emulator), forward only."""
    if q.is_cuda:
        return api.attention(q, k, v, mask, layout=layout, scale=scale, return_lse=return_lse,
                             regime=regime, precision=precision)
    import torch

    _warn_cpu_once()
    if precision is not None:
        return _emulated_int8(q, k, v, mask, layout, scale, return_lse, regime, precision)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        out, lse = _differentiable().apply(q, k, v, mask, layout, scale, regime)
    else:
        p = _plan_of(q, k, v, mask, layout, regime)
        out, lse = (torch.from_numpy(a) for a in _emulated(q, k, v, mask, layout, scale, p))
        out = out.to(q.dtype)
    return (out, lse.float()) if return_lse else out


def _warn_cpu_once() -> None:
    global _warned_cpu
    if not _warned_cpu:
        _warned_cpu = True
        warnings.warn("tessera: attention on CPU tensors runs the CPU emulator in float64 -- it "
                      "checks that the plans are right, and is many times slower than the "
                      "model's own attention; move the model to a CUDA GPU for speed",
                      stacklevel=3)


def _plan_of(q: Any, k: Any, v: Any, mask: BlockMask, layout: str, regime: Any) -> Any:
    """The plan a GPU would run for these operands (the Hopper plan unless ``regime`` is
    given), or None where no plan applies (a head dim other than 64, 96 or 128, or v's head
    dim not q's: the float64 reference then stands in)."""
    heads = 2 if layout == "blhd" else 1
    d = q.shape[-1]
    if d not in SUPPORTED_HEAD_DIMS or v.shape[-1] != d:
        return None
    return plan(mask, num_q_heads=q.shape[heads], num_kv_heads=k.shape[heads], head_dim=d,
                batch=q.shape[0], dtype="bfloat16", layout=layout, regime=regime,
                arch=90 if regime is None or getattr(regime, "family", "") == "sm90" else None)


def _emulated_int8(q: Any, k: Any, v: Any, mask: BlockMask, layout: str, scale: float | None,
                   return_lse: bool, regime: Any, precision: str) -> Any:
    """The 8-bit forward on CPU tensors: the 8-bit regime's plan run by the emulator with the
    scheme the GPU's pre-pass and kernel compute (``emulate.run(scheme=...)``), refused as the
    GPU refuses (forward only, head dims 64 and 128)."""
    import torch

    if precision not in api.PRECISIONS:
        raise ValueError(f"precision must be one of {api.PRECISIONS}, got {precision!r}")
    api.check_8bit_call(precision, regime, torch.is_grad_enabled() and any(
        x.requires_grad for x in (q, k, v)))
    check_int8(q.shape[-1], 90, precision=precision)  # (as a Hopper GPU would take it)
    p = _plan_of(q, k, v, mask, layout, INT8_REGIME)
    res = emulate.run(p, *_host64(q, k, v), scale=scale, scheme=PRECISION_SCHEMES[precision])
    out = torch.from_numpy(res.out).to(q.dtype)
    return (out, torch.from_numpy(res.lse).float()) if return_lse else out


def _host64(*xs: Any) -> list:
    return [x.detach().double().numpy() for x in xs]


def _emulated(q: Any, k: Any, v: Any, mask: BlockMask, layout: str, scale: float | None,
              p: Any) -> tuple[Any, Any]:
    """(out, lse) in float64 numpy: ``mask``'s plan ``p`` (:func:`_plan_of`) run by the
    emulator, or the float64 reference where no plan applies (``p`` None)."""
    q64, k64, v64 = _host64(q, k, v)
    if p is not None:
        res = emulate.run(p, q64, k64, v64, scale=scale)
        return res.out, res.lse
    return reference.attention(q64, k64, v64, mask, layout=layout, scale=scale,
                               return_lse=True)


def _emulated_backward(q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any,
                       mask: BlockMask, layout: str, scale: float | None,
                       p: Any) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) in float64 numpy: the backward task queues of the forward's plan ``p`` run
    by the emulator from the forward's float64 ``out`` and ``lse`` (as a backward kernel takes
    them), or the float64 reference's gradients where no plan applies (``p`` None)."""
    q64, k64, v64, do64 = _host64(q, k, v, dout)
    if p is not None:
        res = emulate.run_backward(p, q64, k64, v64, do64, scale=scale, out=out, lse=lse)
        return res.dq, res.dk, res.dv
    return reference.attention_backward(q64, k64, v64, do64, mask, scale=scale, layout=layout)


_Function: Any = None  # the autograd Function, made at first use (torch is optional)


def _differentiable() -> Any:
    """The autograd Function of emulated attention: forward ``(out, lse)``, backward the
    emulated backward pass (the LSE output takes no gradient)."""
    global _Function
    if _Function is not None:
        return _Function
    import torch

    class EmulatedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask, layout, scale, regime):
            p = _plan_of(q, k, v, mask, layout, regime)  # (planned once, for both passes)
            out64, lse64 = _emulated(q, k, v, mask, layout, scale, p)
            ctx.save_for_backward(q, k, v)
            ctx.forward = (out64, lse64)  # (float64: what the backward pass reads back)
            ctx.settings = (mask, layout, scale, p)
            lse = torch.from_numpy(lse64)
            ctx.mark_non_differentiable(lse)
            return torch.from_numpy(out64).to(q.dtype), lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v = ctx.saved_tensors
            grads = _emulated_backward(q, k, v, *ctx.forward, dout, *ctx.settings)
            return (*(torch.from_numpy(g).to(x.dtype) for g, x in zip(grads, (q, k, v))),
                    None, None, None, None)

    _Function = EmulatedAttention
    return _Function
