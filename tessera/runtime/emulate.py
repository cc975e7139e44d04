"""The CPU emulator: executes a plan's task queue with the kernels' semantics, in float64.

Each task is run the way a CTA runs it: physical rows (packed heads x tile tokens), spans walked
block_n keys at a time with token-level edge masks and row restrictions (or, for a ``pack_keys``
regime, the task's keys end to end, by the same walk as common/walk.cuh's PackedWalk), online
softmax, then a direct write or a partial into a workspace slot merged by the combine step.
Equal to ``tessera.reference.attention`` means the runtime preserved the logical mask; the
emulator also counts every unmasked pair it computes outside the logical mask (must be zero),
so exactness never rests on luck. With a :class:`~tessera.quantization.Scheme` it runs the 8-bit
forward's arithmetic (sm90/traits.cuh's INT8) chunk by chunk: scores from the rounded Q and K,
P against each chunk's own row maxima rounded to u8, the integer P V folded into the output by
exp(chunk max - running max) / 255, V's steps at the end -- which is the 8-bit oracle
(``tessera.quantization.attention``) wherever the plan's chunks are the oracle's.
:func:`run_backward` runs the backward pass the same way,
by the queues the backward kernels walk (``runtime/backward.py``: dQ query-major, dK and dV
key-major with a kv head's group in one task).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._array import to_numpy
from ..operands import checked_dout, checked_like_output, host_operands
from ..quantization import (INT8_CHUNK_ALIGN, QuantizedOperands, Scheme, checked_scheme,
                            kernels_round, quantized_operands)
from .plan import Plan
from .queue import Combine, Span, Task, records

__all__ = ["EmulationResult", "BackwardResult", "run", "run_backward"]


@dataclass
class EmulationResult:
    """Output (``layout`` of the plan), lse ``[B, Hq, Lq]`` and what the tasks computed."""

    out: np.ndarray
    lse: np.ndarray
    pairs_unmasked: int  # pairs that entered the softmax
    pairs_outside: int  # of those, pairs the logical mask does not select (must be 0)
    pairs_masked: int  # pairs computed on real rows and masked off (edge keys, restrictions)


def _span_chunks(spans: np.recarray, bn: int, align: int = 1):
    """Chunks span by span (ChunkWalk): (keys, which are real, the span's row range); with
    ``align`` (the 8-bit form's 16) each chunk's first column at a multiple of it, the first
    chunk's columns before the span not real."""
    for span in spans:
        k0, k1, r0, r1 = span.k_start, span.k_end, span.r_start, span.r_end
        for c0 in range(k0 - k0 % align, k1, bn):
            keys = c0 + np.arange(bn)
            yield keys, (keys >= k0) & (keys < k1), r0, r1


def _packed_chunks(spans: np.recarray, bn: int):
    """Chunks of the task's keys end to end, step for step as common/walk.cuh's PackedWalk and its
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


def run(plan: Plan, q: Any, k: Any, v: Any, *, scale: float | None = None,
        scheme: Scheme | None = None) -> EmulationResult:
    """Execute ``plan`` on the CPU in float64; unwritten outputs stay NaN (poisoned).
    ``scheme``: the 8-bit forward's arithmetic with that rounding (int8 scores and P V)."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a tessera.Plan, got {type(plan).__name__}")
    if scheme is not None and not kernels_round(checked_scheme(scheme)):
        raise ValueError(f"scheme must round the scores to int8 (a K step a token) and P V to "
                         f"int8 or 16 bits (the 8-bit kernels'), got {scheme.name}")
    q4, k4, v4 = (to_numpy(x).astype(np.float64)
                  for x in host_operands(q, k, v, plan.layout, scale, plan.mask))
    b_, hq, lq, d = q4.shape
    hkv, dv = k4.shape[1], v4.shape[3]
    if (b_, hq, hkv, d, dv) != (plan.batch, plan.num_q_heads, plan.num_kv_heads, plan.head_dim,
                                plan.head_dim_v):
        raise ValueError(f"q/k/v shapes (B={b_}, Hq={hq}, Hkv={hkv}, D={d}, Dv={dv}) differ from "
                         f"the plan's (B={plan.batch}, Hq={plan.num_q_heads}, "
                         f"Hkv={plan.num_kv_heads}, D={plan.head_dim}, Dv={plan.head_dim_v})")
    em = _Emulation(plan, q4, k4, v4, 1.0 / np.sqrt(d) if scale is None else float(scale),
                    None if scheme is None else quantized_operands(q4, k4, v4, scheme),
                    scheme is not None and scheme.pv == "int8")
    for task in records(plan.queue.tasks, Task):
        em.run_task(task)
    for job in records(plan.queue.combine, Combine):
        em.combine(job)
    out = em.out.transpose(0, 2, 1, 3) if plan.layout == "blhd" else em.out
    return EmulationResult(out=out, lse=em.lse, pairs_unmasked=em.unmasked,
                           pairs_outside=em.outside, pairs_masked=em.masked)


class _PlanWalk:
    """What both emulations read of a plan: the operands, its spans and their walk, and the
    logical mask every computed pair is checked against."""

    def __init__(self, plan: Plan, q4: np.ndarray, k4: np.ndarray, v4: np.ndarray,
                 scale: float) -> None:
        self.plan, self.q4, self.k4, self.v4, self.scale = plan, q4, k4, v4, scale
        self.group = plan.num_q_heads // plan.num_kv_heads
        self.bm = plan.regime.block_m
        mask = plan.mask.to_host()
        self.dense = mask.to_dense()
        self.head_of = mask.head_index(plan.num_q_heads, plan.num_kv_heads)
        self.batch_of = mask.batch_index(plan.batch)
        self.qblock = np.searchsorted(mask.q_bounds, np.arange(q4.shape[2]), side="right") - 1
        self.kblock = np.searchsorted(mask.kv_bounds, np.arange(k4.shape[2]), side="right") - 1
        self.spans = records(plan.queue.spans, Span)
        self.walk = _packed_chunks if plan.regime.pack_keys else _span_chunks

    def _selected(self, b: int, head: Any, tok: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Whether the logical mask selects each (query token, key token) pair, broadcast."""
        return self.dense[self.batch_of[b], self.head_of[head], self.qblock[tok],
                          self.kblock[keys]]


class _Emulation(_PlanWalk):
    """One plan's emulation: the operands, the logical mask to count pairs against, the
    outputs and the split partials (NaN until written), and the pair counts."""

    def __init__(self, plan: Plan, q4: np.ndarray, k4: np.ndarray, v4: np.ndarray,
                 scale: float, codes: QuantizedOperands | None = None,
                 int8_pv: bool = True) -> None:
        super().__init__(plan, q4, k4, v4, scale)
        self.codes, self.int8_pv = codes, int8_pv
        b, hq, lq, _ = q4.shape
        self.tr = plan.queue.tile_rows
        dv = v4.shape[3]
        self.out = np.full((b, hq, lq, dv), np.nan)
        self.lse = np.full((b, hq, lq), np.nan)
        self.part_out = np.full((plan.queue.num_slots, self.bm, dv), np.nan)
        self.part_lse = np.full((plan.queue.num_slots, self.bm), np.nan)
        self.unmasked = self.outside = self.masked = 0

    def _rows(self, h0: int, q_start: int, q_end: int) -> tuple[np.ndarray, ...]:
        """Each physical row's query head and token, and whether it is real."""
        rows = np.arange(self.bm)
        head, tok = h0 + rows // self.tr, q_start + rows % self.tr
        return head, tok, tok < q_end

    def run_task(self, task: Any) -> None:
        """The task's key chunks through the online softmax, as the kernels run them; its
        output (or its partial, for a split task) written."""
        if self.codes is not None:
            self._run_task_int8(task)
            return
        b, h0, v4, k4 = task.batch, task.q_head0, self.v4, self.k4
        head, tok, real = self._rows(h0, task.q_start, task.q_end)
        tok_c = np.minimum(tok, self.q4.shape[2] - 1)
        kvh = h0 // self.group
        qrows = np.where(real[:, None], self.q4[b, head, tok_c], 0.0)
        m = np.full(self.bm, -np.inf)
        denom = np.zeros(self.bm)  # the softmax's running row sums
        acc = np.zeros((self.bm, v4.shape[3]))
        for keys, key_ok, r0, r1 in self.walk(self.spans[task.span_begin:task.span_end],
                                              self.plan.regime.block_n):
            row_ok = real & (tok >= r0) & (tok < r1)
            keys_c = np.minimum(keys, k4.shape[2] - 1)
            ok = row_ok[:, None] & key_ok[None, :]
            s = np.where(ok, qrows @ k4[b, kvh, keys_c].T * self.scale, -np.inf)
            self._count_chunk(ok, real, b, head, tok_c, keys_c)
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
        self._store(task, head, tok, real, *_normalized(acc, denom, m))

    def _run_task_int8(self, task: Any) -> None:
        """The 8-bit kernel's task: scores from the codes times their steps; per chunk, P
        against the chunk's row maxima cm, rounded to u8, its integer product with V's codes
        folded in by exp(cm - m) / 255; l from the unrounded P; V's steps applied at the end."""
        c = self.codes
        b, h0 = task.batch, task.q_head0
        head, tok, real = self._rows(h0, task.q_start, task.q_end)
        tok_c = np.minimum(tok, self.q4.shape[2] - 1)
        kvh = h0 // self.group
        q8 = c.q[b, head, tok_c] * c.q_scale[b, head, tok_c]  # codes x steps: the kernel's S
        m = np.full(self.bm, -np.inf)
        denom = np.zeros(self.bm)
        acc = np.zeros((self.bm, c.v.shape[3]))
        align = INT8_CHUNK_ALIGN if self.int8_pv else 1
        for keys, key_ok, r0, r1 in _span_chunks(self.spans[task.span_begin:task.span_end],
                                                 self.plan.regime.block_n, align):
            row_ok = real & (tok >= r0) & (tok < r1)
            keys_c = np.minimum(keys, c.k.shape[2] - 1)
            ok = row_ok[:, None] & key_ok[None, :]
            s = (q8 @ c.k[b, kvh, keys_c].T) * c.k_scale[b, kvh, keys_c, 0] * self.scale
            s = np.where(ok, s, -np.inf)
            self._count_chunk(ok, real, b, head, tok_c, keys_c)
            cm = s.max(axis=1)
            none = ~np.isfinite(cm)
            cm_safe = np.where(none, 0.0, cm)
            m_new = np.maximum(m, cm)
            m_safe = np.where(np.isfinite(m_new), m_new, 0.0)
            alpha = np.where(np.isfinite(m), np.exp(m - m_safe), 0.0)
            g = np.where(none, 0.0, np.exp(cm_safe - m_safe))
            p = np.exp(s - cm_safe[:, None])  # in [0, 1]; 0 where masked
            denom = denom * alpha + p.sum(axis=1) * g
            if self.int8_pv:  # (ties to even, as the kernel's float add)
                pv = (np.round(p * 255.0) @ c.v[b, kvh, keys_c]) * (g / 255.0)[:, None]
            else:  # (16-bit P V: P as it is, V as given, its steps ones)
                pv = (p @ c.v[b, kvh, keys_c]) * g[:, None]
            acc = acc * alpha[:, None] + pv
            m = m_new
        self._store(task, head, tok, real, *_normalized(acc * c.v_scale[b, kvh, 0], denom, m))

    def _count_chunk(self, ok: np.ndarray, real: np.ndarray, b: int, head: np.ndarray,
                     tok: np.ndarray, keys: np.ndarray) -> None:
        """A chunk's pairs counted: those that entered the softmax (``ok``), those of them the
        logical mask does not select, and those of real rows masked off."""
        self.unmasked += int(ok.sum())
        self.outside += int((ok & ~self._selected(b, head[:, None], tok[:, None],
                                                  keys[None, :])).sum())
        self.masked += int((real[:, None] & ~ok).sum())

    def _store(self, task: Any, head: np.ndarray, tok: np.ndarray, real: np.ndarray,
               o: np.ndarray, row_lse: np.ndarray) -> None:
        """A task's normalized rows written: its real rows' output and LSE, or its partial
        into its workspace slot (a split task)."""
        if task.slot < 0:
            self.out[task.batch, head[real], tok[real]] = o[real]
            self.lse[task.batch, head[real], tok[real]] = row_lse[real]
        else:
            self.part_out[task.slot] = o
            self.part_lse[task.slot] = row_lse

    def combine(self, job: Any) -> None:
        """A split tile's partials merged by log-sum-exp, in part order (the combine step)."""
        head, tok, real = self._rows(job.q_head0, job.q_start, job.q_end)
        s0, parts = job.slot_begin, job.parts
        pl = self.part_lse[s0:s0 + parts]  # [parts, bm]
        mx = pl.max(axis=0)
        mx_safe = np.where(np.isfinite(mx), mx, 0.0)
        w = np.where(np.isfinite(pl), np.exp(pl - mx_safe), 0.0)
        o = np.einsum("pr,prd->rd", w, np.nan_to_num(self.part_out[s0:s0 + parts]))
        o, row_lse = _normalized(o, w.sum(axis=0), mx_safe)
        self.out[job.batch, head[real], tok[real]] = o[real]
        self.lse[job.batch, head[real], tok[real]] = row_lse[real]


@dataclass
class BackwardResult:
    """dq, dk, dv (``layout`` of the plan), the pairs either pass computed that the logical
    mask does not select (must be 0), and how many tasks wrote each dQ row and each dK/dV row
    (``[B, Hq, Lq]``, ``[B, Hkv, Lkv]``: one each, the kernels' determinism without atomics)."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    pairs_outside: int
    dq_writers: np.ndarray
    dkv_writers: np.ndarray


def run_backward(plan: Plan, q: Any, k: Any, v: Any, dout: Any, *,
                 scale: float | None = None, out: Any = None, lse: Any = None,
                 block_m: int = 64, atomic_dq: bool = False) -> BackwardResult:
    """The backward pass of ``plan`` on the CPU in float64, by the two task queues the backward
    kernels walk (``Plan.backward_queues``): dQ by the query-major queue, dK and dV by the
    key-major one, each recomputing P from the forward's LSE. ``atomic_dq``: as the Hopper
    dK/dV kernel with dQ by atomics, the key-major tasks add dQ too (``dq_writers`` then
    counts the tasks adding to each row) and the query-major queue is not walked.
    ``out`` and ``lse``: the forward's output and LSE ``[B, Hq, Lq]``, given back as a backward
    kernel takes them (Delta = rowsum(dO * O) from ``out``); None: the forward run here."""
    q4, k4, v4 = (to_numpy(x).astype(np.float64)
                  for x in host_operands(q, k, v, plan.layout, scale, plan.mask))
    shape = q4.shape[:3] + (v4.shape[3],)
    do4 = checked_dout(dout, shape, plan.layout)
    if (out is None) != (lse is None):
        raise ValueError("give the forward's out and lse together, or neither (the forward "
                         "is then run here)")
    if out is None:
        fwd = run(plan, q, k, v, scale=scale)
        out, lse = fwd.out, fwd.lse
    out4 = checked_like_output(out, "out", shape, plan.layout)
    lse3 = to_numpy(lse).astype(np.float64) if hasattr(lse, "shape") else None
    if lse3 is None or lse3.shape != shape[:3]:
        raise ValueError(f"lse must be the forward's LSE of shape {shape[:3]} (B, Hq, Lq), got "
                         f"{None if lse3 is None else lse3.shape}")
    bw = _Backward(plan, q4, k4, v4, do4, lse3, (do4 * out4).sum(axis=3),
                   1.0 / np.sqrt(q4.shape[3]) if scale is None else float(scale))
    bq = plan.backward_queues(block_m, query_major=not atomic_dq).settled()
    if not atomic_dq:  # (dQ by atomics: the key-major tasks add it, no query-major queue)
        qspans = records(bq.dq.spans, Span)
        for task in records(bq.dq.tasks, Task):
            bw.query_major(task, qspans[task.span_begin:task.span_end], bq.dq.tile_rows,
                           bq.block_m, bq.block_n[0])
    kspans = records(bq.dkdv.spans, Span)
    for task in records(bq.dkdv.tasks, Task):
        bw.key_major(task, kspans[task.span_begin:task.span_end], bq.dkdv.tile_rows,
                     bq.block_m, bq.block_n[1], bq.seq_q, atomic_dq)
    grads = (bw.dq, bw.dk, bw.dv)
    if plan.layout == "blhd":
        grads = tuple(g.transpose(0, 2, 1, 3) for g in grads)
    return BackwardResult(*grads, pairs_outside=bw.outside, dq_writers=bw.dq_writers,
                          dkv_writers=bw.dkv_writers)


class _Backward(_PlanWalk):
    """One plan's backward emulation: beside the operands, dO, the forward's LSE and
    Delta = rowsum(dO * O) per query row, the gradients, and the pairs computed outside the
    logical mask."""

    def __init__(self, plan: Plan, q4: np.ndarray, k4: np.ndarray, v4: np.ndarray,
                 do4: np.ndarray, lse: np.ndarray, delta: np.ndarray, scale: float) -> None:
        super().__init__(plan, q4, k4, v4, scale)
        self.do4, self.lse, self.delta = do4, lse, delta
        self.dq, self.dk, self.dv = np.zeros_like(q4), np.zeros_like(k4), np.zeros_like(v4)
        self.dq_writers = np.zeros(q4.shape[:3], np.int64)
        self.dkv_writers = np.zeros(k4.shape[:3], np.int64)
        self.outside = 0

    def _p(self, s: np.ndarray, lse: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """P from scaled scores and the query rows' LSE (rows or columns), 0 where not ``ok``."""
        with np.errstate(invalid="ignore", over="ignore"):
            return np.where(ok & np.isfinite(lse), np.exp(s - lse), 0.0)

    def query_major(self, task: Any, spans: np.recarray, tile_rows: int, bm: int,
                    bn: int) -> None:
        """dQ of a task's ``bm`` rows (packed heads x tile tokens): its key spans walked ``bn``
        keys at a time."""
        b, tr = task.batch, tile_rows
        rows = np.arange(bm)
        head, tok = task.q_head0 + rows // tr, task.q_start + rows % tr
        real = tok < task.q_end
        tok_c = np.minimum(tok, self.q4.shape[2] - 1)
        kvh = task.q_head0 // self.group
        for keys, key_ok, r0, r1 in _span_chunks(spans, bn):
            ok = (real & (tok >= r0) & (tok < r1))[:, None] & key_ok[None, :]
            keys_c = np.minimum(keys, self.k4.shape[2] - 1)
            self._count(b, head[:, None], tok_c[:, None], keys_c[None, :], ok)
            kk, vv = self.k4[b, kvh, keys_c], self.v4[b, kvh, keys_c]
            p = self._p(self.q4[b, head, tok_c] @ kk.T * self.scale,
                        self.lse[b, head, tok_c][:, None], ok)
            dp = self.do4[b, head, tok_c] @ vv.T
            ds = p * (dp - self.delta[b, head, tok_c][:, None])
            self.dq[b, head[real], tok[real]] += (self.scale * ds @ kk)[real]
        self.dq_writers[b, head[real], tok[real]] += 1

    def key_major(self, task: Any, spans: np.recarray, tile_rows: int, bm: int, bn: int,
                  seq_q: int, adds_dq: bool = False) -> None:
        """dK and dV of a key tile of a kv head: the query chunks of every query head of its
        group that select it (positions head in group x seq_q + token), ``bn`` at a time;
        with ``adds_dq`` each chunk's partial dQ = scale * dS K added to its query rows."""
        b = task.batch
        key = task.q_start + np.arange(bm) % tile_rows
        real = key < task.q_end
        key_c = np.minimum(key, self.k4.shape[2] - 1)
        kvh = task.q_head0 // self.group
        kk, vv = self.k4[b, kvh, key_c], self.v4[b, kvh, key_c]
        for pos, q_ok, r0, r1 in _span_chunks(spans, bn):
            hl = int(pos[0]) // seq_q  # (a chunk never leaves its span's head)
            h = task.q_head0 + hl
            ok = (real & (key >= r0) & (key < r1))[:, None] & q_ok[None, :]
            qs_c = np.minimum(pos - hl * seq_q, seq_q - 1)
            self._count(b, h, qs_c[None, :], key_c[:, None], ok)
            qq, dd = self.q4[b, h, qs_c], self.do4[b, h, qs_c]
            pt = self._p(kk @ qq.T * self.scale, self.lse[b, h, qs_c][None, :], ok)
            dst = pt * (vv @ dd.T - self.delta[b, h, qs_c][None, :])
            self.dv[b, kvh, key[real]] += (pt @ dd)[real]
            self.dk[b, kvh, key[real]] += (self.scale * dst @ qq)[real]
            if adds_dq:  # (a chunk's valid positions are distinct tokens of one head)
                self.dq[b, h, qs_c[q_ok]] += (self.scale * dst.T @ kk)[q_ok]
                self.dq_writers[b, h, qs_c[q_ok]] += 1
        self.dkv_writers[b, kvh, key[real]] += 1

    def _count(self, b: int, head: Any, tok: np.ndarray, keys: np.ndarray,
               ok: np.ndarray) -> None:
        self.outside += int((ok & ~self._selected(b, head, tok, keys)).sum())


def _normalized(acc: np.ndarray, denom: np.ndarray,
                m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``acc`` over their sums and their log-sum-exp; a row that saw no key: 0, -inf."""
    empty = denom == 0
    o = np.where(empty[:, None], 0.0, acc / np.where(empty, 1.0, denom)[:, None])
    return o, np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, denom)))
