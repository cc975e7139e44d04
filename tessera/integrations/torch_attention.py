"""Attention on torch tensors for the integrations: ``tessera.attention`` on CUDA tensors, the
float64 reference on CPU ones (where the integrations' CPU tests run the same code paths)."""

from __future__ import annotations

from typing import Any

from .. import api, reference
from ..mask import BlockMask

__all__ = ["attention"]


def attention(q: Any, k: Any, v: Any, mask: BlockMask, *, layout: str,
              scale: float | None = None, return_lse: bool = False, regime: Any = None) -> Any:
    """Block-sparse attention of torch ``q``/``k``/``v`` on ``mask``: the output in q's dtype
    (and with ``return_lse`` the float32 LSE), on q's device."""
    if q.is_cuda:
        return api.attention(q, k, v, mask, layout=layout, scale=scale, return_lse=return_lse,
                             regime=regime)
    import torch

    res = reference.attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), mask,
                              layout=layout, scale=scale, return_lse=return_lse)
    if not return_lse:
        return torch.from_numpy(res).to(q.dtype)
    out, lse = res
    return torch.from_numpy(out).to(q.dtype), torch.from_numpy(lse).float()
