"""Attention on torch tensors for the integrations: ``tessera.attention`` on CUDA tensors; on CPU
ones the plan a GPU would run, executed by the CPU emulator in float64 (where the integrations'
CPU tests run the same code paths), with one warning that this path checks correctness, not
speed."""

from __future__ import annotations

import warnings
from typing import Any

from .. import api, reference
from ..dtypes import SUPPORTED_HEAD_DIMS
from ..mask import BlockMask
from ..runtime import emulate
from ..runtime.plan import plan

__all__ = ["attention"]

_warned_cpu = False


def attention(q: Any, k: Any, v: Any, mask: BlockMask, *, layout: str,
              scale: float | None = None, return_lse: bool = False, regime: Any = None) -> Any:
    """Block-sparse attention of torch ``q``/``k``/``v`` on ``mask``: the output in q's dtype
    (and with ``return_lse`` the float32 LSE), on q's device."""
    if q.is_cuda:
        return api.attention(q, k, v, mask, layout=layout, scale=scale, return_lse=return_lse,
                             regime=regime)
    import torch

    _warn_cpu_once()
    out, lse = _emulated(q, k, v, mask, layout, scale, regime)
    if not return_lse:
        return torch.from_numpy(out).to(q.dtype)
    return torch.from_numpy(out).to(q.dtype), torch.from_numpy(lse).float()


def _warn_cpu_once() -> None:
    global _warned_cpu
    if not _warned_cpu:
        _warned_cpu = True
        warnings.warn("tessera: attention on CPU tensors runs the CPU emulator in float64 -- it "
                      "checks that the plans are right, and is many times slower than the "
                      "model's own attention; move the model to a CUDA GPU for speed",
                      stacklevel=3)


def _emulated(q: Any, k: Any, v: Any, mask: BlockMask, layout: str, scale: float | None,
              regime: Any) -> tuple[Any, Any]:
    """(out, lse) in float64 numpy: the plan of ``mask`` (the Hopper plan unless ``regime`` is
    given) run by the emulator; the float64 reference where no plan applies (a head dim other
    than 64, 96 or 128, or v's head dim not q's)."""
    q64, k64, v64 = (x.detach().double().numpy() for x in (q, k, v))
    heads = 2 if layout == "blhd" else 1
    d = q.shape[-1]
    if d in SUPPORTED_HEAD_DIMS and v.shape[-1] == d:
        p = plan(mask, num_q_heads=q.shape[heads], num_kv_heads=k.shape[heads], head_dim=d,
                 batch=q.shape[0], dtype="bfloat16", layout=layout, regime=regime,
                 arch=90 if regime is None or getattr(regime, "family", "") == "sm90" else None)
        res = emulate.run(p, q64, k64, v64, scale=scale)
        return res.out, res.lse
    return reference.attention(q64, k64, v64, mask, layout=layout, scale=scale,
                               return_lse=True)
