"""Torch autograd for Tessera's attention: one Function whose forward runs an attention that
returns its output and LSE, and whose backward runs the matching backward pass from the saved
output and LSE. ``tessera.attention`` and ``Plan.run`` both go through it, so a request and a
kept plan train alike. torch is imported at first use (it is optional)."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["differentiable"]

# forward(q, k, v) -> (out, lse); backward(q, k, v, out, lse, dout) -> (dq, dk, dv).
Forward = Callable[[Any, Any, Any], tuple[Any, Any]]
Backward = Callable[[Any, Any, Any, Any, Any, Any], tuple[Any, Any, Any]]

_Function: Any = None  # the autograd Function, made at first use


def differentiable(forward: Forward, backward: Backward, q: Any, k: Any, v: Any
                   ) -> tuple[Any, Any]:
    """``forward(q, k, v)``'s ``(out, lse)`` recorded by torch autograd: the gradients of q, k
    and v come from ``backward(q, k, v, out, lse, dout)``; the LSE takes no gradient."""
    return _function().apply(q, k, v, forward, backward)


def _function() -> Any:
    global _Function
    if _Function is not None:
        return _Function
    import torch

    class TesseraAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, forward, backward):
            out, lse = forward(q, k, v)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.backward_pass = backward
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, lse = ctx.saved_tensors
            dout = dout.contiguous()
            if dout.data_ptr() % 16:  # (a view into a larger buffer)
                dout = dout.clone()
            dq, dk, dv = ctx.backward_pass(q, k, v, out, lse, dout)
            return dq, dk, dv, None, None

    _Function = TesseraAttention
    return _Function
