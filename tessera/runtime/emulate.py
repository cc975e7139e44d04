"""The CPU emulator: executes a plan's task queue with the kernels' semantics, in float64.

Each task is run the way a CTA runs it: physical rows (packed heads x tile tokens), spans walked
block_n keys at a time with token-level edge masks and row restrictions (or, for a
``pack_keys`` regime, the task's keys end to end, by the same walk as common.cuh's PackedWalk),
online softmax, then a direct write or a partial into a workspace slot merged by the combine
step. Equal to
``tessera.reference.attention`` means the runtime preserved the logical mask; the emulator also
counts every unmasked pair it computes outside the logical mask (must be zero), so exactness
never rests on luck.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._array import to_numpy
from ..operands import host_operands
from .plan import Plan
from .queue import Combine, Span, Task, records

__all__ = ["EmulationResult", "run"]


@dataclass
class EmulationResult:
    """Output (``layout`` of the plan), lse ``[B, Hq, Lq]`` and what the tasks computed."""

    out: np.ndarray
    lse: np.ndarray
    pairs_unmasked: int  # pairs that entered the softmax
    pairs_outside: int  # of those, pairs the logical mask does not select (must be 0)
    pairs_masked: int  # pairs computed on real rows and masked off (edge keys, restrictions)


def _span_chunks(spans: np.recarray, bn: int):
    """Chunks span by span (ChunkWalk): (keys, which are real, the span's row range)."""
    for span in spans:
        k0, k1, r0, r1 = span.k_start, span.k_end, span.r_start, span.r_end
        for c0 in range(k0, k1, bn):
            keys = c0 + np.arange(bn)
            yield keys, keys < k1, r0, r1


def _packed_chunks(spans: np.recarray, bn: int):
    """Chunks of the task's keys end to end, step for step as common.cuh's PackedWalk and its
    Cursor: a chunk starts ``off`` keys into span ``si`` and holds ``valid`` keys; a row past
    them repeats the task's last key (masked); the row range is the task's first span's, for
    every chunk (as the consumers' PackedCount reads it: a packed task's spans share one)."""
    n = len(spans)
    length = [int(s.k_end - s.k_start) for s in spans]

    def count(si: int, off: int) -> int:
        valid, s, o = 0, si, off
        while s < n and valid < bn:
            valid += length[s] - o
            s, o = s + 1, 0
        return min(valid, bn)

    si, off = 0, 0
    valid = count(si, off)
    while si < n:
        keys = np.empty(bn, dtype=np.int64)
        s, base = si, -off
        for r in range(bn):
            while r >= base + length[s] and s + 1 < n:
                base += length[s]
                s += 1
            keys[r] = spans[s].k_start + min(r - base, length[s] - 1)
        yield keys, np.arange(bn) < valid, spans[0].r_start, spans[0].r_end
        left = bn
        while si < n:
            rest = length[si] - off
            if left < rest:
                off += left
                break
            left -= rest
            si, off = si + 1, 0
        valid = count(si, off)


def run(plan: Plan, q: Any, k: Any, v: Any, *, scale: float | None = None) -> EmulationResult:
    """Execute ``plan`` on the CPU in float64; unwritten outputs stay NaN (poisoned)."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a tessera.Plan, got {type(plan).__name__}")
    q4, k4, v4 = (to_numpy(x).astype(np.float64)
                  for x in host_operands(q, k, v, plan.layout, scale, plan.mask))
    b_, hq, lq, d = q4.shape
    hkv, dv = k4.shape[1], v4.shape[3]
    if (b_, hq, hkv, d, dv) != (plan.batch, plan.num_q_heads, plan.num_kv_heads, plan.head_dim,
                                plan.head_dim_v):
        raise ValueError(f"q/k/v shapes (B={b_}, Hq={hq}, Hkv={hkv}, D={d}, Dv={dv}) differ from "
                         f"the plan's (B={plan.batch}, Hq={plan.num_q_heads}, "
                         f"Hkv={plan.num_kv_heads}, D={plan.head_dim}, Dv={plan.head_dim_v})")
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    group = plan.num_q_heads // plan.num_kv_heads
    bm, bn = plan.regime.block_m, plan.regime.block_n
    tr = plan.queue.tile_rows

    mask = plan.mask.to_host()
    dense = mask.to_dense()
    head_of = mask.head_index(plan.num_q_heads, plan.num_kv_heads)
    batch_of = mask.batch_index(plan.batch)
    qblock = np.searchsorted(mask.q_bounds, np.arange(lq), side="right") - 1
    kblock = np.searchsorted(mask.kv_bounds, np.arange(k4.shape[2]), side="right") - 1

    out = np.full((b_, hq, lq, v4.shape[3]), np.nan)
    lse = np.full((b_, hq, lq), np.nan)
    tasks = records(plan.queue.tasks, Task)
    spans = records(plan.queue.spans, Span)
    part_out = np.full((plan.queue.num_slots, bm, v4.shape[3]), np.nan)
    part_lse = np.full((plan.queue.num_slots, bm), np.nan)
    n_unmasked = n_outside = n_masked = 0

    rows = np.arange(bm)
    for task in tasks:
        b, h0, qs, qe = task.batch, task.q_head0, task.q_start, task.q_end
        sb, se, slot = task.span_begin, task.span_end, task.slot
        head = h0 + rows // tr
        tok = qs + rows % tr
        real = tok < qe
        tok_c = np.minimum(tok, lq - 1)
        kvh = h0 // group
        qrows = np.where(real[:, None], q4[b, head, tok_c], 0.0)
        m = np.full(bm, -np.inf)
        denom = np.zeros(bm)  # the softmax's running row sums
        acc = np.zeros((bm, v4.shape[3]))
        walk = _packed_chunks if plan.regime.pack_keys else _span_chunks
        for keys, key_ok, r0, r1 in walk(spans[sb:se], bn):
            row_ok = real & (tok >= r0) & (tok < r1)
            keys_c = np.minimum(keys, k4.shape[2] - 1)
            s = qrows @ k4[b, kvh, keys_c].T * scale
            ok = row_ok[:, None] & key_ok[None, :]
            s = np.where(ok, s, -np.inf)
            sel = dense[batch_of[b], head_of[head][:, None], qblock[tok_c][:, None],
                        kblock[keys_c][None, :]]
            n_unmasked += int(ok.sum())
            n_outside += int((ok & ~sel).sum())
            n_masked += int((real[:, None] & ~ok).sum())
            m_new = np.maximum(m, s.max(axis=1))
            m_safe = np.where(np.isfinite(m_new), m_new, 0.0)
            p = np.exp(s - m_safe[:, None])
            alpha = np.where(np.isfinite(m), np.exp(m - m_safe), 0.0)
            denom = denom * alpha + p.sum(axis=1)
            # Only the rows the span applies to take its product, over its real keys: a
            # non-finite value elsewhere never meets P = 0 (as in the kernels).
            acc = acc * alpha[:, None]
            acc[row_ok] += p[np.ix_(row_ok, key_ok)] @ v4[b, kvh, keys_c[key_ok]]
            m = m_new
        empty = denom == 0
        o = np.where(empty[:, None], 0.0, acc / np.where(empty, 1.0, denom)[:, None])
        row_lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, denom)))
        if slot < 0:
            out[b, head[real], tok[real]] = o[real]
            lse[b, head[real], tok[real]] = row_lse[real]
        else:
            part_out[slot] = o
            part_lse[slot] = row_lse

    for job in records(plan.queue.combine, Combine):
        b, h0, qs, qe = job.batch, job.q_head0, job.q_start, job.q_end
        s0, parts = job.slot_begin, job.parts
        head = h0 + rows // tr
        tok = qs + rows % tr
        real = tok < qe
        pl = part_lse[s0:s0 + parts]  # [parts, bm]
        mx = pl.max(axis=0)
        mx_safe = np.where(np.isfinite(mx), mx, 0.0)
        w = np.where(np.isfinite(pl), np.exp(pl - mx_safe), 0.0)
        wsum = w.sum(axis=0)
        o = np.einsum("pr,prd->rd", w, np.nan_to_num(part_out[s0:s0 + parts]))
        empty = wsum == 0
        o = np.where(empty[:, None], 0.0, o / np.where(empty, 1.0, wsum)[:, None])
        row_lse = np.where(empty, -np.inf, mx_safe + np.log(np.where(empty, 1.0, wsum)))
        out[b, head[real], tok[real]] = o[real]
        lse[b, head[real], tok[real]] = row_lse[real]

    if plan.layout == "blhd":
        out = out.transpose(0, 2, 1, 3)
    return EmulationResult(out=out, lse=lse, pairs_unmasked=n_unmasked, pairs_outside=n_outside,
                           pairs_masked=n_masked)
