"""The truth: float64 attention on the host, exactly on the logical mask.

Slow on purpose and simple on purpose. Every kernel, plan and emulator is checked against it.
It works one query block row at a time, so memory stays bounded by (block rows x selected keys)
even at 100k tokens: never a dense L x L matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._array import to_numpy
from .mask import BlockMask
from .operands import checked_dout, host_operands

__all__ = ["attention", "attention_backward", "attention_rows", "selected_blocks"]


def attention(q: Any, k: Any, v: Any, block_mask: BlockMask, *, scale: float | None = None,
              return_lse: bool = False, layout: str = "bhld"):
    """Block-sparse attention in float64 on the host.

    ``q`` is ``[B, Hq, Lq, D]`` (or ``[B, Lq, Hq, D]`` with ``layout="blhd"``), ``k``/``v`` the
    same with ``Hkv`` heads and ``Lkv`` tokens; Hq must be a multiple of Hkv (GQA/MQA). Returns the
    output in ``layout`` as float64 numpy, and with ``return_lse`` also the natural-log
    log-sum-exp ``[B, Hq, Lq]`` of the scaled scores (``-inf`` for rows that select nothing).
    """
    q4, k4, v4 = (to_numpy(x).astype(np.float64)
                  for x in host_operands(q, k, v, layout, scale, block_mask))
    b, hq, lq, d = q4.shape
    hkv = k4.shape[1]
    dv = v4.shape[3]
    mask = block_mask.to_host()
    group = hq // hkv
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)

    out = np.zeros((b, hq, lq, dv), dtype=np.float64)
    lse = np.full((b, hq, lq), -np.inf, dtype=np.float64)
    for bi, h, rows, keys in selected_blocks(mask, b, hq, hkv):
        p, row_lse, denom = _softmax_terms(q4[bi, h, rows] @ k4[bi, h // group, keys].T, scale)
        out[bi, h, rows] = (p @ v4[bi, h // group, keys]) / denom
        lse[bi, h, rows] = row_lse[:, 0]
    if layout == "blhd":
        out = out.transpose(0, 2, 1, 3)
    return (out, lse) if return_lse else out


def attention_backward(q: Any, k: Any, v: Any, dout: Any, block_mask: BlockMask, *,
                       scale: float | None = None, layout: str = "bhld"
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gradients of :func:`attention` in float64 on the host: ``(dq, dk, dv)`` for the
    upstream gradient ``dout`` (the output's shape), each in ``layout`` like q, k and v.

    The standard recomputation: per query block row, P = softmax(scale Q K^T) over its
    selected keys, dV += P^T dO, dP = dO V^T, Delta = rowsum(dO * O), dS = P * (dP - Delta),
    dQ = scale dS K, dK += scale dS^T Q. Exact on the logical mask: rows that select nothing
    get zero dQ, keys no row selects zero dK and dV, and a kv head sums the gradients of its
    group's query heads (GQA/MQA).
    """
    q4, k4, v4 = (to_numpy(x).astype(np.float64)
                  for x in host_operands(q, k, v, layout, scale, block_mask))
    do4 = checked_dout(dout, q4.shape[:3] + (v4.shape[3],), layout)
    b, hq, _, d = q4.shape
    hkv = k4.shape[1]
    group = hq // hkv
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    mask = block_mask.to_host()
    dq, dk, dv = np.zeros_like(q4), np.zeros_like(k4), np.zeros_like(v4)
    for bi, h, rows, keys in selected_blocks(mask, b, hq, hkv):
        g = h // group
        qr, dor = q4[bi, h, rows], do4[bi, h, rows]
        kk, vv = k4[bi, g, keys], v4[bi, g, keys]
        p, _, denom = _softmax_terms(qr @ kk.T, scale)
        p = p / denom
        dp = dor @ vv.T
        ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))  # Delta = rowsum(dO * O)
        dq[bi, h, rows] = scale * ds @ kk
        np.add.at(dk[bi, g], keys, scale * ds.T @ qr)
        np.add.at(dv[bi, g], keys, p.T @ dor)
    if layout == "blhd":
        return tuple(x.transpose(0, 2, 1, 3) for x in (dq, dk, dv))  # type: ignore[return-value]
    return dq, dk, dv


def attention_rows(q: Any, k: Any, v: Any, block_mask: BlockMask, rows: np.ndarray, *,
                   scale: float | None = None, layout: str = "bhld") -> np.ndarray:
    """The float64 truth for a few query rows only: ``rows`` is an int array ``[n, 3]`` of
    (batch, query head, token); returns ``[n, Dv]``. Lets large runs (100k tokens) be checked on
    sampled rows without computing the whole reference."""
    q4, k4, v4 = host_operands(q, k, v, layout, scale, block_mask)
    b, hq, lq, d = q4.shape
    hkv = k4.shape[1]
    rows = _checked_rows(rows, (b, hq, lq))
    mask = block_mask.to_host()
    head_of = mask.head_index(hq, hkv)
    batch_of = mask.batch_index(q4.shape[0])
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    kb = mask.kv_bounds
    out = np.zeros((len(rows), v4.shape[3]))
    for n, (b, h, t) in enumerate(rows):
        i = int(np.searchsorted(mask.q_bounds, t, side="right") - 1)
        r = (batch_of[b] * mask.batch_heads[1] + head_of[h]) * mask.num_q_blocks + i
        sel = to_numpy(mask.indices[int(mask.indptr[r]):int(mask.indptr[r + 1])])
        if sel.size == 0:
            continue
        keys = np.concatenate([np.arange(kb[j], kb[j + 1]) for j in sel])
        g = h // (hq // hkv)
        qrow = to_numpy(q4[b, h, t]).astype(np.float64)
        kk = to_numpy(k4[b, g][keys]).astype(np.float64)
        vv = to_numpy(v4[b, g][keys]).astype(np.float64)
        p, _, denom = _softmax_terms((kk @ qrow)[None, :], scale)
        out[n] = (p @ vv / denom)[0]
    return out


def selected_blocks(mask: BlockMask, batch: int, hq: int, hkv: int):
    """(batch, query head, query block's rows, its selected keys) of every query block row of
    host ``mask`` that selects something, in order: how the host oracles walk a mask."""
    head_of, batch_of = mask.head_index(hq, hkv), mask.batch_index(batch)
    qb, kb, n_q = mask.q_bounds, mask.kv_bounds, mask.num_q_blocks
    for bi in range(batch):
        for h in range(hq):
            base = (batch_of[bi] * mask.batch_heads[1] + head_of[h]) * n_q
            for i in range(n_q):
                sel = mask.indices[mask.indptr[base + i]:mask.indptr[base + i + 1]]
                if sel.size:
                    yield (bi, h, slice(qb[i], qb[i + 1]),
                           np.concatenate([np.arange(kb[j], kb[j + 1]) for j in sel]))


def _softmax_terms(scores: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray,
                                                              np.ndarray]:
    """Unnormalised probabilities of each row of unscaled ``scores``, the rows' log-sum-exp and
    sums: the maximum is subtracted before scaling, as the kernels do, so no finite scale makes
    a probability overflow (a row's largest term is exp(0) whatever the scale; the LSE of a row
    whose scaled maximum overflows is +-inf)."""
    m = scores.max(axis=1, keepdims=True)
    # (A NaN or +inf score gives NaN, as on the GPU; a product past float64 is +-inf.)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp((scores - m) * scale)
        denom = p.sum(axis=1, keepdims=True)
        return p, m * scale + np.log(denom), denom


def _checked_rows(rows: Any, limits: tuple[int, int, int]) -> np.ndarray:
    """``rows`` as int64 ``[n, 3]`` (batch, query head, token), each within ``limits``;
    TypeError or ValueError naming ``rows`` otherwise (numpy indexing would wrap a negative
    token into another row, or fail with a bare IndexError)."""
    try:
        a = np.asarray(rows)
    except (TypeError, ValueError):
        raise TypeError(f"rows must be an int array [n, 3] of (batch, query head, token), got "
                        f"{type(rows).__name__}") from None
    if a.size == 0:
        a = a.reshape(0, 3).astype(np.int64)
    if not np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
        raise TypeError(f"rows must hold ints (batch, query head, token), got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"rows must be [n, 3] (batch, query head, token), got shape "
                         f"{a.shape}")
    for col, (name, limit) in enumerate(zip(("batch", "query head", "token"), limits)):
        bad = (a[:, col] < 0) | (a[:, col] >= limit)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"rows[{i}]: {name} {int(a[i, col])} is outside [0, {limit})")
    return a.astype(np.int64)
