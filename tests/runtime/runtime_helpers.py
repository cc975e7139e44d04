"""Shared by the tests under tests/runtime/ (not a test module): Hypothesis strategies for random
masks, regimes and shapes, the queue and emulation checks, and NumPy stand-ins for the planner
kernels."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from hypothesis import strategies as st

import tessera
from tessera import BlockMask, Regime
from tessera.reference import attention
from tessera.runtime import emulate
from tessera.runtime.queue import Combine, Span, Task, records
from tessera.runtime.tasks import launch_keys

TOL = 1e-10


BASE_REGIMES = [
    Regime(block_m=64, num_warps=4),  # 64 rows, 16 rows a warp
    Regime(block_m=128, num_warps=4),  # 128 rows, 32 rows a warp
    Regime(block_m=128, num_warps=8),
    Regime(block_m=64, block_n=64, num_warps=2),
]


EXTRA_REGIMES = [  # other tile shapes: short and long key steps, tiny tiles, no GQA packing
    Regime(block_m=128, block_n=128, num_warps=4),
    Regime(block_m=32, block_n=32, num_warps=1),
    Regime(block_m=128, num_warps=4, pack_gqa=False),
    # The Hopper family's tile shapes (the plan is the same contract; its stats differ).
    Regime(family="sm90", block_m=128, num_warps=8, block_n=128, stages=3),
    Regime(family="sm90", block_m=64, num_warps=4, block_n=64, stages=3, combine_threshold=0.0),
    Regime(family="sm90", block_m=192, num_warps=16, block_n=64, stages=3),  # three warpgroups
]


SPLIT_REGIMES = (
    [r.with_(split_ratio=1.0, min_split_chunks=1) for r in BASE_REGIMES + EXTRA_REGIMES[:2]]
    + [Regime(block_m=64, num_warps=4, split_ratio=1.5, min_split_chunks=2),
       Regime(block_m=128, block_n=32, num_warps=4, split_ratio=1.0, min_split_chunks=3,
              combine_threshold=1.0)])


COMBINE_REGIMES = [r.with_(combine_threshold=t) for r in BASE_REGIMES + EXTRA_REGIMES[1:2]
                   for t in (0.0, 1.0)]


# Tiles at multiples of block_m tokens (restricted spans), with and without splits.
ALIGN_REGIMES = [Regime(block_m=64, num_warps=4, combine_threshold=0.0, align_tiles=True),
                 Regime(block_m=128, num_warps=4, combine_threshold=0.0, align_tiles=True,
                        split_ratio=1.0, min_split_chunks=1),
                 Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                        combine_threshold=0.0, align_tiles=True)]


# Emulator work (chunk iterations, roughly) allowed per example: keeps each example a few ms.
BUDGET = 700


MAX_LEN = 720


@st.composite
def block_sizes(draw):
    return draw(st.one_of(st.sampled_from([16, 32, 48, 64, 96, 128, 192, 256, 384]),
                          st.integers(16, 96), st.integers(16, 384)))


@st.composite
def uniform_axis(draw, block):
    """(n_blocks, seq_len) for uniform blocks of ``block`` tokens, ragged or not."""
    n = draw(st.integers(1, max(1, MAX_LEN // block)))
    ragged = draw(st.booleans())
    seq = n * block - (draw(st.integers(0, block - 1)) if ragged else 0)
    return n, seq


@st.composite
def variable_bounds(draw):
    """Token offsets of blocks of random positive sizes (1 token up to a few hundred)."""
    sizes = draw(st.lists(st.one_of(st.integers(1, 40), st.integers(1, 300)),
                          min_size=1, max_size=14))
    b = np.concatenate([[0], np.cumsum(sizes)])
    b = b[b <= MAX_LEN]
    if b.size < 2:
        b = np.array([0, min(sizes[0], MAX_LEN)])
    return b.astype(np.int64)


@st.composite
def geometries(draw):
    """Keyword arguments of ``BlockMask.from_dense`` describing the geometry, plus (nQB, nKB)."""
    kind = draw(st.sampled_from(["int", "tuple", "variable", "variable"]))
    if kind == "variable":
        qb, kb = draw(variable_bounds()), draw(variable_bounds())
        return dict(q_bounds=qb, kv_bounds=kb), qb.size - 1, kb.size - 1
    bq = draw(block_sizes())
    bk = bq if kind == "int" else draw(block_sizes())
    n_q, lq = draw(uniform_axis(bq))
    n_kv, lk = draw(uniform_axis(bk))
    kw = dict(block_size=bq if kind == "int" else (bq, bk))
    if draw(st.booleans()) or lq != n_q * bq or lk != n_kv * bk:
        kw.update(seq_len_q=lq, seq_len_kv=lk)
    return kw, n_q, n_kv


def one_head(rng: np.random.Generator, family: str, n_q: int, n_kv: int, p: float) -> np.ndarray:
    """One [nQB, nKB] selection of a mask family."""
    i = np.arange(n_q)[:, None] * n_kv / max(n_q, 1)
    j = np.arange(n_kv)[None, :]
    if family == "random":
        return rng.random((n_q, n_kv)) < p
    if family == "band":  # local window around the diagonal (neighbouring rows share keys)
        w = rng.integers(0, 4)
        lo = rng.integers(0, 3)
        return (j >= np.floor(i) - lo) & (j <= np.floor(i) + w)
    if family == "causal":
        return j <= np.floor(i)
    if family == "repeat":  # runs of identical rows, lightly perturbed
        r = int(rng.integers(2, 5))
        base = rng.random((-(-n_q // r), n_kv)) < p
        m = np.repeat(base, r, axis=0)[:n_q]
        return m ^ (rng.random(m.shape) < rng.choice([0.0, 0.0, 0.05]))
    raise AssertionError(family)


@st.composite
def selections(draw, n_mb: int, n_mh: int, n_q: int, n_kv: int) -> np.ndarray:
    """A [Bm, Hm, nQB, nKB] selection with forced empty rows and a few very heavy rows."""
    family = draw(st.sampled_from(["random", "random", "band", "causal", "repeat"]))
    p = draw(st.sampled_from([0.05, 0.2, 0.5, 0.9, 1.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dense = np.stack([np.stack([one_head(rng, family, n_q, n_kv, p) for _ in range(n_mh)])
                      for _ in range(n_mb)])
    if draw(st.booleans()):  # forced empty rows
        dense &= ~(rng.random((n_mb, n_mh, n_q, 1)) < draw(st.sampled_from([0.2, 0.5, 1.0])))
    if draw(st.booleans()):  # a few very heavy rows
        dense |= rng.random((n_mb, n_mh, n_q, 1)) < draw(st.sampled_from([0.1, 0.3]))
    if not dense.any():
        # An entirely empty mask is a known planner failure (test_all_empty_mask below); keep
        # the property tests about everything else.
        dense.flat[rng.integers(dense.size)] = True
    return dense


def build_mask(draw, dense: np.ndarray, geo: dict, n_kv: int) -> BlockMask:
    """The mask through one of its constructors (from_dense keeps the dense source, the others
    give the planner only CSR arrays)."""
    ctor = draw(st.sampled_from(["dense", "dense", "scipy", "indices"]))
    if ctor == "dense":
        return BlockMask.from_dense(dense, **geo)
    lead = dense.shape[:-2]
    rows = dense.reshape(-1, *dense.shape[-2:])
    if ctor == "scipy":
        mats = [(sp.csr_array if draw(st.booleans()) else sp.coo_array)(x) for x in rows]
        if len(lead) < 2 and draw(st.booleans()):
            arg = mats[0] if not lead and draw(st.booleans()) else mats  # one matrix / per head
        else:
            b = lead[0] if len(lead) == 2 else 1
            arg = [mats[i * (len(mats) // b):(i + 1) * (len(mats) // b)] for i in range(b)]
        return BlockMask.from_scipy(arg, **geo)
    # FlexAttention layout: indices in any order, garbage past each row's count
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    flat = dense.reshape(-1, n_kv)
    counts = flat.sum(axis=1)
    width = int(counts.max(initial=0)) + draw(st.integers(0, 3))
    width = max(width, 1)
    idx = rng.integers(-3, n_kv + 3, size=(flat.shape[0], width))
    for r in range(flat.shape[0]):
        sel = np.nonzero(flat[r])[0]
        idx[r, :sel.size] = rng.permutation(sel)
    dt = draw(st.sampled_from([np.int32, np.int64]))
    return BlockMask.from_indices(counts.reshape(dense.shape[:-1]).astype(dt),
                                  idx.reshape(*dense.shape[:-1], width).astype(dt),
                                  num_kv_blocks=n_kv, **geo)


@st.composite
def cases(draw, regimes):
    """(plan, mask, q, k, v, scale) for a random mask, regime and attention shape."""
    regime = draw(st.sampled_from(regimes))
    geo, n_q, n_kv = draw(geometries())
    lq = geo.get("seq_len_q") or (int(geo["q_bounds"][-1]) if "q_bounds" in geo
                                  else n_q * (geo["block_size"] if np.isscalar(geo["block_size"])
                                              else geo["block_size"][0]))
    lk = geo.get("seq_len_kv") or (int(geo["kv_bounds"][-1]) if "kv_bounds" in geo
                                   else n_kv * (geo["block_size"] if np.isscalar(geo["block_size"])
                                                else geo["block_size"][1]))
    # Work per (batch, query head), pessimistic: tiles x key chunks.
    per_head = (n_q + -(-lq // regime.block_m)) * (-(-lk // regime.block_n) + 1)
    shapes = [(b, hkv, g) for b in (1, 2) for hkv in (1, 2) for g in (1, 2, 4, 8)
              if b * hkv * g * per_head <= BUDGET] or [(1, 1, 1)]
    batch, hkv, group = draw(st.sampled_from(shapes))
    hq = hkv * group
    n_mh = draw(st.sampled_from(sorted({1, hq, hkv})))
    n_mb = draw(st.sampled_from(sorted({1, batch})))
    dense = draw(selections(n_mb, n_mh, n_q, n_kv))
    if draw(st.booleans()) and n_mb == 1:
        dense = dense[0]  # [H, nQB, nKB]
        if n_mh == 1 and draw(st.booleans()):
            dense = dense[0]  # [nQB, nKB]
    mask = build_mask(draw, dense, geo, n_kv)
    assert (mask.seq_len_q, mask.seq_len_kv) == (lq, lk)

    d = dv = 64  # the kernels' smallest head dim (tessera.plan refuses others)
    layout = draw(st.sampled_from(["bhld", "bhld", "blhd"]))
    scale = draw(st.sampled_from([None, None, 0.05, 1.5]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((batch, hq, lq, d))
    k = rng.standard_normal((batch, hkv, lk, d))
    v = rng.standard_normal((batch, hkv, lk, dv))
    if layout == "blhd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    # batch passed explicitly only sometimes: it defaults to the mask's stored batch.
    kw = dict(batch=batch) if (n_mb == 1 and batch > 1) or draw(st.booleans()) else {}
    plan = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_v=dv,
                        layout=layout, regime=regime,
                        dtype=draw(st.sampled_from(["bfloat16", "float16"])), **kw)
    return plan, mask, q, k, v, scale


def brute_useful_pairs(mask: BlockMask, batch: int, hq: int, hkv: int) -> int:
    """(query, key) token pairs the logical mask selects over all (batch, query head)."""
    dense = np.asarray(mask.to_dense())
    bm, hm = mask.batch_heads
    qlen, klen = np.diff(mask.q_bounds), np.diff(mask.kv_bounds)
    per = (dense * qlen[:, None] * klen[None, :]).sum(axis=(-2, -1))  # [Bm, Hm]
    total = 0
    for b in range(batch):
        for h in range(hq):
            mh = 0 if hm == 1 else (h if hm == hq else h // (hq // hkv))
            total += int(per[0 if bm == 1 else b, mh])
    return total


def assert_launch_order(plan) -> None:
    """The queue's tasks in launch order: heavy ones longest first, then one (batch, head)
    assignment at a time, longest first (tasks.launch_keys with the task's assignment found
    from its batch and first query head)."""
    cost = records(plan.queue.tasks, Task).cost
    group = plan.task_assignments()
    assert (group >= 0).all()  # every task's (batch, first head) is an assignment
    keys = launch_keys(cost, group, plan.in_flight)
    assert np.all(np.diff(keys) >= 0), "tasks must be in launch order"


def check_queue(plan) -> None:
    """The task-queue contract of tessera/runtime/queue.py on one plan."""
    qu = plan.queue
    tasks = np.asarray(qu.tasks)
    spans = np.asarray(qu.spans)
    comb = np.asarray(qu.combine)
    B, hq, hkv = plan.batch, plan.num_q_heads, plan.num_kv_heads
    group = hq // hkv
    lq, lk = plan.mask.seq_len_q, plan.mask.seq_len_kv
    hp, tr = qu.heads_per_task, qu.tile_rows
    bm, bn = plan.regime.block_m, plan.regime.block_n
    for a in (tasks, spans, comb):
        assert a.dtype == np.int32
    assert tasks.ndim == 2 and tasks.shape[1] == len(Task)
    assert spans.ndim == 2 and spans.shape[1] == len(Span)
    assert comb.ndim == 2 and comb.shape[1] == len(Combine)
    assert hp >= 1 and hq % hp == 0 and tr * hp == bm
    assert hp == 1 or tr % 16 == 0

    t = records(tasks, Task)
    b, h0, qs, qe = t.batch, t.q_head0, t.q_start, t.q_end
    sb, se, slot, cost = t.span_begin, t.span_end, t.slot, t.cost
    n_spans = spans.shape[0]
    # tasks
    assert np.all((0 <= b) & (b < B))
    assert np.all((0 <= h0) & (h0 + hp <= hq) & (h0 % hp == 0))
    assert np.all(h0 // group == (h0 + hp - 1) // group), "packed heads must share a kv head"
    assert np.all((0 <= qs) & (qs < qe) & (qe <= lq))
    assert np.all(qe - qs <= tr)
    assert np.all((0 <= sb) & (sb <= se) & (se <= n_spans))
    assert np.all(slot >= -1)
    # spans
    s = records(spans, Span)
    k0, k1, r0, r1 = s.k_start, s.k_end, s.r_start, s.r_end
    assert np.all((0 <= k0) & (k0 < k1) & (k1 <= lk))
    assert np.all((0 <= r0) & (r0 < r1) & (r1 <= lq))
    # cost: key chunks of the task (span by span, or its keys end to end with pack_keys),
    # non-increasing in launch order
    per_span = (k1 - k0) if plan.regime.pack_keys else (k1 - k0 + bn - 1) // bn
    csum = np.concatenate([[0], np.cumsum(per_span)])
    want = csum[se] - csum[sb]
    np.testing.assert_array_equal(cost, (want + bn - 1) // bn if plan.regime.pack_keys else want)
    if plan.regime.pack_keys:
        # One row restriction a packed task: the kernels' consumers read its first span's for
        # all of its chunks (common/walk.cuh PackedCount).
        lens = se - sb
        first = np.repeat(sb, lens)
        each = first + np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        assert (r0[each] == r0[first]).all() and (r1[each] == r1[first]).all()
    assert_launch_order(plan)

    # slots of split tiles: unique, within num_slots
    slots = slot[slot >= 0]
    assert np.unique(slots).size == slots.size
    assert np.all(slots < qu.num_slots)
    # combine jobs own exactly the slots of their parts
    c = records(comb, Combine)
    cb, ch0, cqs, cqe = c.batch, c.q_head0, c.q_start, c.q_end
    cs0, cparts = c.slot_begin, c.parts
    assert np.all(cparts >= 1) and np.all((0 <= cs0) & (cs0 + cparts <= qu.num_slots))
    assert np.all((0 <= cb) & (cb < B) & (0 <= ch0) & (ch0 + hp <= hq))
    assert np.all((0 <= cqs) & (cqs < cqe) & (cqe <= lq) & (cqe - cqs <= tr))
    owner = np.full(qu.num_slots, -1)
    for j in range(comb.shape[0]):
        assert np.all(owner[cs0[j]:cs0[j] + cparts[j]] == -1), "combine jobs share a slot"
        owner[cs0[j]:cs0[j] + cparts[j]] = j
        parts = np.nonzero(slot >= 0)[0]
        parts = parts[owner[slot[parts]] == j]
        assert sorted(slot[parts].tolist()) == list(range(cs0[j], cs0[j] + cparts[j]))
        for t in parts:
            assert (b[t], h0[t], qs[t], qe[t]) == (cb[j], ch0[j], cqs[j], cqe[j])
    assert np.all(owner[slots] >= 0), "a partial that no combine job reads"

    # every (batch, query head, query token) has exactly one final write
    writes = np.zeros((B, hq, lq), dtype=np.int64)
    final = [(b[t], h0[t], qs[t], qe[t]) for t in np.nonzero(slot == -1)[0]]
    final += [(cb[j], ch0[j], cqs[j], cqe[j]) for j in range(comb.shape[0])]
    for bb, hh, s, e in final:
        writes[bb, hh:hh + hp, s:e] += 1
    assert np.all(writes == 1), f"{int((writes == 0).sum())} outputs unwritten, " \
                                f"{int((writes > 1).sum())} written twice"


def check_emulation(plan, mask, q, k, v, scale) -> emulate.EmulationResult:
    """Emulated plan == reference, exactly on the mask, every output written."""
    res = emulate.run(plan, q, k, v, scale=scale)
    ref_out, ref_lse = attention(q, k, v, mask, scale=scale, return_lse=True, layout=plan.layout)
    assert not np.isnan(res.out).any(), "unwritten output (NaN poison left)"
    assert not np.isnan(res.lse).any(), "unwritten lse (NaN poison left)"
    assert res.pairs_outside == 0, f"{res.pairs_outside} pairs computed outside the mask"
    assert res.out.shape == ref_out.shape
    err = float(np.max(np.abs(res.out - ref_out), initial=0.0))
    assert err <= TOL, f"out differs by {err}"
    ninf = np.isneginf(ref_lse)
    np.testing.assert_array_equal(np.isneginf(res.lse), ninf)
    lse_err = float(np.max(np.abs(res.lse[~ninf] - ref_lse[~ninf]), initial=0.0))
    assert lse_err <= TOL, f"lse differs by {lse_err}"
    # every selected pair entered the softmax exactly once (none twice, none missed)
    useful = brute_useful_pairs(mask, plan.batch, plan.num_q_heads, plan.num_kv_heads)
    assert res.pairs_unmasked == useful
    return res


TILE_128x64 = Regime(block_m=128, block_n=64, num_warps=4)


def random_qkv(rng, batch, hq, hkv, lq, lk, d=64):
    return (rng.standard_normal((batch, hq, lq, d)), rng.standard_normal((batch, hkv, lk, d)),
            rng.standard_normal((batch, hkv, lk, d)))


def _np_plan_row_stats(grid, block, args):
    """numpy stand-in for plan.cu's plan_row_stats (same outputs, row by row; a null pointer,
    np.uint64(0), for count, the token sums or walk_chunks leaves them unwritten, as the kernel
    does)."""
    (dense, n_rows, n_kv, n_q, kb, block_n, count, nspans, ktok, otok, chunks, ident, pack, qb,
     tile_rows, walk) = args
    scratch = np.zeros(int(n_rows), dtype=np.int64)
    count, ktok, otok = (scratch if isinstance(a, np.uint64) else a for a in (count, ktok, otok))
    klen = np.diff(kb)
    for r in range(int(n_rows)):
        sel = dense[r].astype(bool)
        prev = dense[r - 1].astype(bool) if r % int(n_q) else None
        starts = np.flatnonzero(sel & ~np.r_[False, sel[:-1]])
        ends = np.flatnonzero(sel & ~np.r_[sel[1:], False])
        count[r], nspans[r], ktok[r] = sel.sum(), starts.size, klen[sel].sum()
        otok[r] = klen[sel & prev].sum() if prev is not None else 0
        chunks[r] = (-(-klen[sel].sum() // int(block_n)) if pack else
                     sum(-(-(kb[e + 1] - kb[s0]) // int(block_n)) for s0, e in zip(starts, ends)))
        ident[r] = prev is not None and sel.sum() == prev.sum() == (sel & prev).sum()
        if not isinstance(walk, np.uint64):
            qi = r % int(n_q)
            tiles = -(-(qb[qi + 1] - qb[qi]) // int(tile_rows))
            walk[0] += np.uint64(tiles * sum(-(-(kb[e + 1] - kb[s0]) // int(block_n))
                                             for s0, e in zip(starts, ends)))
            walk[1] += np.uint64(tiles * -(-klen[sel].sum() // int(block_n)))


def _np_plan_write_spans(grid, block, args):
    """numpy stand-in for plan.cu's plan_write_spans."""
    dense, n_rows, n_kv, kb, span_dst, nspans, row_q0, row_q1, spans = args
    for r in range(int(n_rows)):
        if span_dst[r] < 0:
            continue
        _np_write_counted(spans, int(span_dst[r]), int(nspans[r]),
                          _np_row_spans(dense[r], kb, row_q0[r], row_q1[r]), kb, row_q0[r])


def _np_row_spans(dense_row, kb, q0, q1):
    sel = dense_row.astype(bool)
    starts = np.flatnonzero(sel & ~np.r_[False, sel[:-1]])
    ends = np.flatnonzero(sel & ~np.r_[sel[1:], False])
    return [(kb[s0], kb[e + 1], q0, q1) for s0, e in zip(starts, ends)]


def _np_write_counted(spans, at, count, found, kb, q0):
    """plan.cu's write_row_spans: the first ``count`` of the spans found at spans[at ...], spans
    of no rows where fewer were found."""
    empty = (kb[0], kb[1], q0, q0)
    for i in range(count):
        spans[at + i] = found[i] if i < len(found) else empty


def _np_heavy(chunks, n_tasks, task_chunks, heavy_slots, heavy_mean):
    """plan.cu's heavy_task."""
    return (chunks * int(heavy_slots) > int(task_chunks)) | (
        chunks * int(n_tasks) > int(heavy_mean) * int(task_chunks))


def _np_order_key(rank, chunks, width):
    """plan.cu's order_key."""
    return rank * width + (width - 1 - chunks)


def _np_plan_scan(grid, block, args):
    """numpy stand-in for plan.cu's plan_scan (one CTA: runs, per-run offsets, the key table's
    starts -- where the tasks go in launch order -- and totals)."""
    (ident, nspans, chunks, n_rows, n_q, qb, tile_rows, expansions, assign_off, n_assign,
     heavy_slots, heavy_mean, hist, key_start, run_row0, run_row1, span_off, tile_off,
     task_off, bh_run0, heavy_runs, totals) = args
    n_rows, n_q, tile_rows, n_assign = int(n_rows), int(n_q), int(tile_rows), int(n_assign)
    ident = ident.astype(bool)
    first = np.flatnonzero(~ident)
    last = np.r_[first[1:] - 1, n_rows - 1]
    n = first.size
    run_row0[:n], run_row1[:n] = first, last
    q0, q1 = qb[first % n_q], qb[last % n_q + 1]
    sp = nspans[first].astype(np.int64)
    tl = (q1 - q0 + tile_rows - 1) // tile_rows
    bh = first // n_q
    ec = expansions[bh].astype(np.int64)
    tk = tl * ec
    ch = chunks[first].astype(np.int64)
    for out, v in ((span_off, sp), (tile_off, tl)):
        out[:n] = np.r_[0, np.cumsum(v)[:-1]]
    total_chunks = (tk * ch).sum()
    width = ch.max(initial=0) + 1
    n_hist = width * (1 + n_assign)
    assert key_start.size >= n_hist and hist.size >= n_hist  # the host's bound on the table
    heavy = _np_heavy(ch, tk.sum(), total_chunks, heavy_slots, heavy_mean)
    # a light run's key: its first assignment's
    key0 = _np_order_key(np.where(heavy, 0, 1 + assign_off[bh]), ch, width)
    counts = np.zeros(n_hist, np.int64)
    for u in range(n):
        if heavy[u]:
            counts[key0[u]] += tk[u]
        else:
            counts[key0[u] + width * np.arange(ec[u])] += tl[u]
    key_start[:n_hist] = np.r_[0, np.cumsum(counts)[:-1]]
    seen = np.zeros(n_hist, np.int64)  # weights placed so far per key, in run order
    for u in range(n):
        w = tk[u] if heavy[u] else tl[u]
        task_off[u] = key_start[key0[u]] + seen[key0[u]] if heavy[u] else seen[key0[u]]
        seen[key0[u]] += w
    hist[:] = -1  # scratch: its contents are no contract
    bh_run0[:] = -1
    heavy_runs[:] = -1
    totals[:] = (n, sp.sum(), tl.sum(), tk.sum(), total_chunks, ch.max(initial=0))


def _np_plan_write_runs(grid, block, args):
    """numpy stand-in for plan.cu's plan_write_runs (one run at a time, as many as plan_scan
    found; the grid may be larger)."""
    (dense, n_kv, n_q, kb, qb, tile_rows, totals, run_row0, run_row1, span_off, tile_off,
     task_off, nspans, chunks, expansions, assign_off, assign_b, assign_h0, heavy_slots,
     heavy_mean, key_start, spans, tiles, tasks) = args
    n_q, tile_rows = int(n_q), int(tile_rows)
    assert grid[0] * 256 // 32 >= totals[0]
    for u in range(int(totals[0])):
        r0, r1 = int(run_row0[u]), int(run_row1[u])
        bh = r0 // n_q
        q0, q1 = int(qb[r0 % n_q]), int(qb[r1 % n_q + 1])
        sb = int(span_off[u])
        se = sb + int(nspans[r0])
        if isinstance(dense, np.ndarray):  # null: plan_aligned_spans wrote the spans
            _np_write_counted(spans, sb, se - sb, _np_row_spans(dense[r0], kb, q0, q1), kb, q0)
        ch, e_count, a0 = int(chunks[r0]), int(expansions[bh]), int(assign_off[bh])
        heavy = _np_heavy(ch, totals[3], totals[4], heavy_slots, heavy_mean)  # as plan_scan
        width = int(totals[5]) + 1
        n_tiles = -(-(q1 - q0) // tile_rows)
        for i in range(n_tiles):
            t0, t1 = q0 + i * tile_rows, min(q0 + (i + 1) * tile_rows, q1)
            tiles[int(tile_off[u]) + i] = (bh, t0, t1, sb, se, ch)
            if not isinstance(tasks, np.ndarray):  # null: the host path splits the tasks
                continue
            for e in range(e_count):
                at = (int(task_off[u]) + i * e_count + e if heavy else
                      int(key_start[_np_order_key(1 + a0 + e, ch, width)]) + int(task_off[u]) + i)
                tasks[at] = (assign_b[a0 + e], assign_h0[a0 + e], t0, t1, sb, se, -1, ch)


def _np_plan_aligned_spans(grid, block, args):
    """numpy stand-in for plan.cu's plan_aligned_spans: per aligned tile, for each stretch a..b
    of the query blocks it meets (in that order), the runs of key blocks that those blocks and
    no neighbour of the stretch select; counted (span_off null) or written."""
    (dense, n_tiles, per_bh, n_q, n_kv, kb, qb, tile_lo, tile_hi, tile_rows, lq, block_n,
     nspans, chunks, identical, span_off, spans) = args
    per_bh, n_q, tile_rows, lq, block_n = int(per_bh), int(n_q), int(tile_rows), int(lq), \
        int(block_n)
    write = isinstance(span_off, np.ndarray)
    assert grid[0] * 256 // 32 >= int(n_tiles)
    for v in range(int(n_tiles)):
        bh, t = divmod(v, per_bh)
        lo, hi = int(tile_lo[t]), int(tile_hi[t])
        rows = dense[bh * n_q + lo: bh * n_q + hi + 1].astype(bool)
        t0, t1 = t * tile_rows, min(t * tile_rows + tile_rows, lq)
        out = []
        for a in range(hi - lo + 1):
            for b in range(a, hi - lo + 1):
                has = rows[a:b + 1].all(axis=0)
                if a > 0:
                    has &= ~rows[a - 1]
                if b + 1 < rows.shape[0]:
                    has &= ~rows[b + 1]
                r0, r1 = max(int(qb[lo + a]), t0), min(int(qb[lo + b + 1]), t1)
                out += [(k0, k1, r0, r1) for k0, k1, _, _ in _np_row_spans(has, kb, 0, 0)]
        if write:
            _np_write_counted(spans, int(span_off[v]), int(nspans[v]), out, kb, t0)
        else:
            nspans[v] = len(out)
            chunks[v] = sum(-(-(k1 - k0) // block_n) for k0, k1, _, _ in out)
            identical[v] = 0


def assert_same_plan(got, ref) -> None:
    """Two plans' tiles and task queues, array for array."""
    for f in ("mask_bh", "q0", "q1", "span_begin", "span_end", "chunks", "k0", "k1", "r0",
              "r1"):
        np.testing.assert_array_equal(getattr(got.tiles, f), getattr(ref.tiles, f), err_msg=f)
    for f in ("tasks", "spans", "combine"):
        np.testing.assert_array_equal(getattr(got.queue, f), getattr(ref.queue, f), err_msg=f)
    assert (got.queue.num_slots, got.tiles.num_groups, got.tiles.num_merged) == \
        (ref.queue.num_slots, ref.tiles.num_groups, ref.tiles.num_merged)


PLANNER_STAND_INS = {"plan_row_stats": _np_plan_row_stats,
                     "plan_write_spans": _np_plan_write_spans,
                     "plan_scan": _np_plan_scan, "plan_write_runs": _np_plan_write_runs,
                     "plan_aligned_spans": _np_plan_aligned_spans}


def poisoned_restricted_case(rng: np.random.Generator, block_m: int, align: bool, d: int):
    """A mask whose tiles' rows select different keys -- short query blocks a 0.9 combine
    threshold merges onto ``block_m``-row tiles, or clusters of 40-220 tokens for aligned tiles
    -- and float16 q, k, v with Inf, -Inf and NaN values (and a NaN key) in key blocks that some
    query blocks of each head select and others do not. Returns (mask, policy, q, k, v)."""
    policy = dict(combine_threshold=0.0, align_tiles=True) if align else \
        dict(combine_threshold=0.9)
    low, high = (40, 220) if align else (8, block_m // 2)
    qs, ks = rng.integers(low, high, size=14), rng.integers(16, 160, size=18)
    dense = rng.random((2, 14, 18)) < 0.35
    dense[:, :, 0] = True
    mask = BlockMask.from_dense(dense, q_bounds=np.r_[0, np.cumsum(qs)],
                                kv_bounds=np.r_[0, np.cumsum(ks)])
    lq, lk = int(mask.seq_len_q), int(mask.seq_len_kv)
    q, k, v = (rng.standard_normal((1, 2, n, d)).astype(np.float16) for n in (lq, lk, lk))
    kb = np.r_[0, np.cumsum(ks)]
    for h in range(2):
        partly = np.flatnonzero(dense[h].any(0) & ~dense[h].all(0))
        for n, blk in enumerate(rng.choice(partly, size=3, replace=False)):
            key = int(rng.integers(kb[blk], kb[blk + 1]))
            cols = rng.choice(d, size=4, replace=False)
            v[0, h, key, cols] = (np.inf, -np.inf, np.nan, np.inf) if n == 2 else \
                (np.inf, -np.inf)[n]
            if n == 2 and h == 0:
                k[0, h, int(rng.integers(kb[blk], kb[blk + 1])), 0] = np.nan
    return mask, policy, q, k, v


def assert_same_non_finite(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``got`` is non-finite exactly where ``ref`` is (and ``ref`` has both kinds of rows);
    returns the rows ``ref`` has all finite."""
    finite = np.isfinite(ref)
    rows = finite.all(axis=-1)
    assert (~finite).any() and rows.any(), "the poison reached no row, or every row"
    wrong = int((np.isfinite(got) != finite).sum())
    assert wrong == 0, f"{wrong} elements finite where the reference is not, or the reverse"
    return rows
