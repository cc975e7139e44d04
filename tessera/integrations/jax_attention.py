"""Differentiable Tessera attention on JAX arrays: ``jax.grad`` through block-sparse attention,
in eager mode. The forward is ``tessera.attention`` (zero-copy through DLPack, as always), and
the VJP is ``tessera.attention_backward`` from the forward's output and LSE, which the forward
keeps as residuals. Eager only: the kernels run on concrete device arrays, so a function that
calls this under ``jax.jit`` fails on the traced arrays (``q must be a CuPy array or a DLPack
tensor``). Needs JAX with CUDA.
"""

from __future__ import annotations

from typing import Any

from .. import api
from ..mask import BlockMask
from ..operands import check_scale

__all__ = ["attention"]


def attention(q: Any, k: Any, v: Any, block_mask: BlockMask, *, scale: float | None = None,
              layout: str = "bhld") -> Any:
    """``tessera.attention(q, k, v, block_mask)`` on JAX arrays, differentiable in q, k and v
    (``jax.grad``, ``jax.vjp``): its gradients are ``tessera.attention_backward``'s."""
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a tessera.BlockMask, got {type(block_mask).__name__}")
    check_scale(scale)
    if layout not in ("bhld", "blhd"):
        raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
    return _differentiable(block_mask, scale, layout)(q, k, v)


def _differentiable(mask: BlockMask, scale: float | None, layout: str) -> Any:
    """The mask's attention as a ``jax.custom_vjp`` function of (q, k, v) (the mask, scale and
    layout held by closure: none of them is an array JAX differentiates)."""
    import jax

    @jax.custom_vjp
    def attend(q, k, v):
        return api.attention(q, k, v, mask, scale=scale, layout=layout)

    def forward(q, k, v):
        out, lse = api.attention(q, k, v, mask, scale=scale, layout=layout, return_lse=True)
        return out, (q, k, v, out, lse)

    def backward(residuals, dout):
        q, k, v, out, lse = residuals
        return tuple(api.attention_backward(q, k, v, out, lse, dout, mask, scale=scale,
                                            layout=layout))

    attend.defvjp(forward, backward)
    return attend
