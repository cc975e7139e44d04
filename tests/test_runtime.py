"""CPU tests of the runtime: plan (mapping + task organization) executed by the emulator.

The core check (DESIGN.md section 7): for thousands of random masks, regimes and attention
shapes, ``tessera.runtime.emulate.run(plan, q, k, v)`` equals ``tessera.reference.attention``
in float64, computes no pair outside the logical mask and leaves no output unwritten (the
emulator poisons with NaN). Alongside: the task-queue contract documented in
``tessera/runtime/tasks.py``, the mapping's retain / subdivide / combine behaviour on masks built
to exercise it, ``plan.stats()``, and argument checking.

Only public entry points are used (``tessera.plan``, ``Plan.tiles`` / ``Plan.queue`` /
``Plan.stats``, ``emulate.run`` and the documented task-queue layout), so the tests hold across
rewrites of the planner's internals.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import event, given, settings
from hypothesis import strategies as st

import tessera
import tessera.cuda.device
import tessera.runtime.regime.features
import tessera.runtime.regime.selection
import tessera.runtime.regime.slots
from tessera import BlockMask, Regime
from tessera.reference import attention
from tessera.runtime import emulate
from tessera.runtime.tasks import launch_keys, wide_step_tasks

TOL = 1e-10

# ---------------------------------------------------------------------------- regimes
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


# ---------------------------------------------------------------------------- strategies
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

    d = draw(st.integers(4, 8))
    dv = draw(st.sampled_from([d, 4, 8]))
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


# ---------------------------------------------------------------------------- checks
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
    cost = np.asarray(plan.queue.tasks)[:, 7].astype(np.int64)
    group = plan.task_assignments()
    assert (group >= 0).all()  # every task's (batch, first head) is an assignment
    keys = launch_keys(cost, group, plan.in_flight)
    assert np.all(np.diff(keys) >= 0), "tasks must be in launch order"


def check_queue(plan) -> None:
    """The task-queue contract of tessera/runtime/tasks.py on one plan."""
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
    assert tasks.ndim == 2 and tasks.shape[1] == 8
    assert spans.ndim == 2 and spans.shape[1] == 4
    assert comb.ndim == 2 and comb.shape[1] == 6
    assert hp >= 1 and hq % hp == 0 and tr * hp == bm
    assert hp == 1 or tr % 16 == 0

    b, h0, qs, qe, sb, se, slot, cost = tasks.T.astype(np.int64)
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
    k0, k1, r0, r1 = spans.T.astype(np.int64)
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
        # all of its chunks (common.cuh PackedCount).
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
    cb, ch0, cqs, cqe, cs0, cparts = comb.T.astype(np.int64)
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


def label(plan) -> None:
    """Hypothesis events, to see what the generated cases exercise
    (--hypothesis-show-statistics)."""
    s = plan.stats()
    event(f"merged: {s.num_merged > 0}")
    event(f"split: {s.num_split_jobs > 0}")
    event(f"gqa packed: {plan.heads_per_task > 1}")
    event(f"subdivided: {s.num_tiles > s.num_groups}")


# ---------------------------------------------------------------------------- properties
@settings(max_examples=1600, deadline=None)
@given(cases(BASE_REGIMES + EXTRA_REGIMES))
def test_emulator_matches_reference(case):
    plan, mask, q, k, v, scale = case
    label(plan)
    check_queue(plan)
    check_emulation(plan, mask, q, k, v, scale)


@settings(max_examples=600, deadline=None)
@given(cases(SPLIT_REGIMES))
def test_emulator_matches_reference_with_splits(case):
    plan, mask, q, k, v, scale = case
    label(plan)
    check_queue(plan)
    check_emulation(plan, mask, q, k, v, scale)


@settings(max_examples=500, deadline=None)
@given(cases(COMBINE_REGIMES))
def test_emulator_matches_reference_combine_thresholds(case):
    plan, mask, q, k, v, scale = case
    label(plan)
    if plan.regime.combine_threshold == 0:
        # 0 disables merging groups whose key sets differ (identical ones never reach step 3)
        assert plan.stats().num_merged == 0
    check_queue(plan)
    check_emulation(plan, mask, q, k, v, scale)


@settings(max_examples=500, deadline=None)
@given(cases(ALIGN_REGIMES))
def test_emulator_matches_reference_aligned_tiles(case):
    """Tiles straddling query-block boundaries stay exact: every selected pair once, nothing
    outside the mask, every output written; tiles start at multiples of the tile rows."""
    plan, mask, q, k, v, scale = case
    label(plan)
    check_queue(plan)
    t = plan.tiles
    assert np.all(np.asarray(t.q0) % t.tile_rows == 0)
    check_emulation(plan, mask, q, k, v, scale)


@settings(max_examples=1200, deadline=None)
@given(cases(BASE_REGIMES + EXTRA_REGIMES + SPLIT_REGIMES + COMBINE_REGIMES + ALIGN_REGIMES))
def test_task_queue_contract_and_stats(case):
    plan, mask, q, k, v, scale = case
    check_queue(plan)
    t = plan.tiles
    assert np.all(np.asarray(t.q1) - np.asarray(t.q0) <= t.tile_rows)
    s = plan.stats()
    useful = brute_useful_pairs(mask, plan.batch, plan.num_q_heads, plan.num_kv_heads)
    assert s.useful_pairs == useful
    assert s.useful_pairs == int(mask.selected_pairs(plan.batch, plan.num_q_heads).sum())
    assert s.computed_pairs >= s.useful_pairs
    assert s.num_tasks == plan.queue.num_tasks
    assert s.num_tiles == t.num_tiles and s.num_groups <= s.num_tiles
    assert s.num_split_jobs == plan.queue.combine.shape[0]


# ---------------------------------------------------------------------------- mapping behaviour
TILE_128x64 = Regime(block_m=128, block_n=64, num_warps=4)


def random_qkv(rng, batch, hq, hkv, lq, lk, d=8):
    return (rng.standard_normal((batch, hq, lq, d)), rng.standard_normal((batch, hkv, lk, d)),
            rng.standard_normal((batch, hkv, lk, d)))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), heads=st.integers(1, 4), pairs=st.integers(1, 8),
       n_kv=st.integers(1, 12))
def test_identical_row_pairs_combine_for_free(seed, heads, pairs, n_kv):
    """64-row blocks whose rows come in identical pairs fill 128-row tiles with no waste."""
    rng = np.random.default_rng(seed)
    base = rng.random((heads, pairs, n_kv)) < 0.4
    base[..., 0, rng.integers(n_kv)] = True  # something selected in every head
    dense = np.repeat(base, 2, axis=-2)
    mask = BlockMask.from_dense(dense, block_size=64)
    plan = tessera.plan(mask, num_q_heads=heads, head_dim=8, regime=TILE_128x64)
    s = plan.stats()
    assert s.wasted_ratio == 1.0
    assert s.num_tiles == heads * pairs
    assert np.all(np.asarray(plan.tiles.q1) - np.asarray(plan.tiles.q0) == 128)
    check_queue(plan)


def test_identical_row_pairs_emulated():
    rng = np.random.default_rng(1)
    dense = np.repeat(rng.random((2, 4, 6)) < 0.5, 2, axis=-2)
    mask = BlockMask.from_dense(dense, block_size=64)
    plan = tessera.plan(mask, num_q_heads=2, head_dim=8, regime=TILE_128x64)
    assert plan.stats().num_tiles == 8
    check_emulation(plan, mask, *random_qkv(rng, 1, 2, 2, 512, 384), None)


def alternating_mask(n_q=8):
    """Adjacent 64-row blocks share one key block of eight: even rows select blocks 0..6 and 15,
    odd rows 7..13 and 15."""
    dense = np.zeros((n_q, 16), dtype=bool)
    dense[0::2, 0:7] = True
    dense[1::2, 7:14] = True
    dense[:, 15] = True
    return dense


def merge_waste(dense, qlen, klen):
    """Masked work / useful work of a restricted merge of each pair of adjacent rows."""
    out = []
    for i in range(dense.shape[0] - 1):
        a, b = dense[i], dense[i + 1]
        ka, kb_, ku = (klen * a).sum(), (klen * b).sum(), (klen * (a | b)).sum()
        useful = qlen[i] * ka + qlen[i + 1] * kb_
        out.append(((qlen[i] + qlen[i + 1]) * ku - useful) / useful)
    return np.array(out)


def test_mostly_different_neighbours_do_not_merge():
    dense = alternating_mask()
    waste = merge_waste(dense, np.full(8, 64), np.full(16, 64))
    assert np.all(waste > 0.3), "the mask is meant to make every merge too wasteful"
    mask = BlockMask.from_dense(dense, block_size=64)
    plan = tessera.plan(mask, num_q_heads=1, head_dim=8,
                        regime=TILE_128x64.with_(combine_threshold=0.3))
    assert plan.stats().num_merged == 0
    assert plan.stats().num_tiles == 8
    # ... while a threshold above their waste lets them merge (and stay exact)
    loose = tessera.plan(mask, num_q_heads=1, head_dim=8,
                         regime=TILE_128x64.with_(combine_threshold=1.0))
    assert loose.stats().num_merged == 4 and loose.stats().num_tiles == 4
    rng = np.random.default_rng(2)
    res = check_emulation(loose, mask, *random_qkv(rng, 1, 1, 1, 512, 1024), None)
    assert res.pairs_masked > 0


def test_neighbours_without_shared_keys_never_merge():
    """A restricted merge needs shared keys, however loose the threshold."""
    dense = np.zeros((8, 8), dtype=bool)
    dense[0::2, :4] = True
    dense[1::2, 4:] = True
    mask = BlockMask.from_dense(dense, block_size=32)
    for t in (1.0, 10.0):
        plan = tessera.plan(mask, num_q_heads=1, head_dim=8,
                            regime=TILE_128x64.with_(combine_threshold=t))
        assert plan.stats().num_merged == 0
        assert plan.stats().num_tiles == 8


@settings(max_examples=300, deadline=None)
@given(cases(BASE_REGIMES))
def test_threshold_zero_never_merges(case):
    """The device planner skips the merge cost model at threshold 0 (mapping.py): that is only
    sound if the model can never pick a merge there, on any geometry or selection."""
    from tessera.runtime import mapping

    mask = case[1]
    xp = mask.xp
    stats = mapping._row_stats(mask, xp)
    n_rows = mask.indptr.size - 1
    run_first, run_bh, run_q0, run_q1 = mapping._runs(stats, n_rows, mask.num_q_blocks,
                                                      np.asarray(mask.q_bounds), xp)
    for tile_rows in (16, 64, 128, 1 << 20):
        take = mapping._restricted_pairs(stats, run_first, run_q0, run_q1, run_bh, tile_rows,
                                         0.0, xp)
        assert not take.any()


def banded_mask(n=8):
    """Row i selects key blocks i-2 .. i+1 (clipped)."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    return (j >= i - 2) & (j <= i + 1)


@pytest.mark.parametrize("heads", [1, 3])
def test_banded_neighbours_merge_and_stay_exact(heads):
    dense = np.broadcast_to(banded_mask(), (heads, 8, 8))
    waste = merge_waste(dense[0], np.full(8, 64), np.full(8, 64))
    assert np.all(waste <= 0.3)
    mask = BlockMask.from_dense(dense, block_size=64)
    plan = tessera.plan(mask, num_q_heads=heads, head_dim=8,
                        regime=TILE_128x64.with_(combine_threshold=0.3))
    s = plan.stats()
    assert s.num_merged > 0
    assert s.num_tiles < 8 * heads
    # restrictions fall on whole 16-row groups here, so the kernels skip them: no waste counted
    assert s.wasted_ratio == 1.0
    check_queue(plan)
    rng = np.random.default_rng(3)
    res = check_emulation(plan, mask, *random_qkv(rng, 1, heads, heads, 512, 512), None)
    assert res.pairs_masked > 0  # the row restrictions really masked something


@pytest.mark.parametrize("split", [False, True])
def test_subdivide_384_token_blocks(split):
    rng = np.random.default_rng(4)
    n_q, n_kv, heads = 3, 2, 2
    dense = rng.random((heads, n_q, n_kv)) < 0.6
    dense[:, :, 0] = True
    dense[:, 1, 1] = ~dense[:, 0, 1]  # consecutive rows differ: no combining
    dense[:, 2, 1] = ~dense[:, 1, 1]
    mask = BlockMask.from_dense(dense, block_size=384)
    regime = TILE_128x64.with_(split_ratio=1.0, min_split_chunks=1) if split else TILE_128x64
    plan = tessera.plan(mask, num_q_heads=heads, head_dim=8, regime=regime)
    t = plan.tiles
    assert t.num_tiles == 3 * n_q * heads
    assert np.all(np.asarray(t.q1) - np.asarray(t.q0) == 128)
    assert sorted(np.asarray(t.q0).tolist()) == sorted(list(range(0, 1152, 128)) * heads)
    check_queue(plan)
    check_emulation(plan, mask, *random_qkv(rng, 1, heads, heads, 1152, 768), None)


# ---------------------------------------------------------------------------- stats
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_q=st.integers(1, 12), n_kv=st.integers(1, 12),
       p=st.sampled_from([0.1, 0.5, 1.0]), shape=st.sampled_from([(1, 1, 1), (1, 3, 3),
                                                                  (2, 4, 2), (2, 8, 1)]))
def test_uniform_128_blocks_on_128x64_tiles_waste_nothing(seed, n_q, n_kv, p, shape):
    batch, hq, hkv = shape
    rng = np.random.default_rng(seed)
    dense = rng.random((batch, hkv if hkv > 1 else 1, n_q, n_kv)) < p
    dense[..., 0, 0] = True
    mask = BlockMask.from_dense(dense, block_size=128)
    plan = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=8, batch=batch,
                        regime=TILE_128x64)
    s = plan.stats()
    assert s.useful_pairs == int(mask.selected_pairs(batch, hq).sum())
    assert s.useful_pairs == brute_useful_pairs(mask, batch, hq, hkv)
    assert s.wasted_ratio == 1.0
    assert s.computed_pairs == s.useful_pairs


def test_stats_small_blocks_count_padding():
    """16-token blocks alone in 128-row tiles: computed pairs count whole 16-row groups and
    64-key steps, so waste shows."""
    dense = np.eye(6, dtype=bool)[None]
    dense[0, 0, 0] = True
    mask = BlockMask.from_dense(dense, block_size=16)
    plan = tessera.plan(mask, num_q_heads=1, head_dim=8,
                        regime=TILE_128x64.with_(combine_threshold=0.0))
    s = plan.stats()
    assert s.useful_pairs == 6 * 16 * 16
    assert s.computed_pairs == 6 * 16 * 64  # one row group x one 64-key step per block
    assert s.wasted_ratio == 4.0


# ---------------------------------------------------------------------------- bad arguments
def small_mask(heads=1):
    return BlockMask.from_dense(np.ones((heads, 2, 2), bool), block_size=64)


@pytest.mark.parametrize("kwargs, exc, word", [
    (dict(num_q_heads=0), ValueError, "num_q_heads"),
    (dict(num_q_heads=-2), ValueError, "num_q_heads"),
    (dict(num_q_heads=2.0), ValueError, "num_q_heads"),
    (dict(num_q_heads=4, num_kv_heads=0), ValueError, "num_kv_heads"),
    (dict(num_q_heads=4, num_kv_heads=3), ValueError, "num_kv_heads"),
    (dict(head_dim=0), ValueError, "head_dim"),
    (dict(head_dim=-64), ValueError, "head_dim"),
    (dict(head_dim="128"), ValueError, "head_dim"),
    (dict(layout="bshd"), ValueError, "layout"),
    (dict(dtype="float32"), TypeError, "dtype"),
    (dict(dtype=np.float32), TypeError, "dtype"),
    (dict(regime="sm80_128x64"), TypeError, "regime"),
    (dict(regime=dict(block_m=128)), TypeError, "regime"),
])
def test_plan_bad_arguments(kwargs, exc, word):
    args = dict(num_q_heads=2, head_dim=64) | kwargs
    with pytest.raises(exc, match=word):
        tessera.plan(small_mask(), **args)


def test_plan_rejects_non_blockmask():
    with pytest.raises(TypeError, match="block_mask"):
        tessera.plan(np.ones((2, 2), bool), num_q_heads=2, head_dim=64)
    with pytest.raises(TypeError, match="block_mask"):
        tessera.plan(None, num_q_heads=2, head_dim=64)


@pytest.mark.parametrize("mask_heads, hq, hkv", [(3, 8, 2), (2, 8, 1), (4, 2, 2), (3, 4, 4)])
def test_plan_rejects_incompatible_mask_heads(mask_heads, hq, hkv):
    with pytest.raises(ValueError, match="heads"):
        tessera.plan(small_mask(mask_heads), num_q_heads=hq, num_kv_heads=hkv, head_dim=64)


def test_plan_rejects_incompatible_mask_batch():
    mask = BlockMask.from_dense(np.ones((2, 1, 2, 2), bool), block_size=64)
    with pytest.raises(ValueError, match="batch"):
        tessera.plan(mask, num_q_heads=2, head_dim=64, batch=3)


@pytest.mark.parametrize("kwargs, word", [
    (dict(batch=0), "batch"),
    (dict(batch=-1), "batch"),
    (dict(head_dim_v=0), "head_dim_v"),
    (dict(head_dim_v=-8), "head_dim_v"),
])
def test_plan_rejects_bad_batch_and_head_dim_v(kwargs, word):
    """DESIGN.md section 6: bad input raises a clear ValueError before anything runs."""
    with pytest.raises(ValueError, match=word):
        tessera.plan(small_mask(), num_q_heads=2, head_dim=64, **kwargs)


# ---------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (3, 2, 5)])
def test_all_empty_mask(shape):
    """A mask that selects nothing is valid (every output 0, every lse -inf)."""
    dense = np.zeros(shape, dtype=bool)
    mask = BlockMask.from_dense(dense, block_size=64)
    hq = shape[0] if len(shape) == 3 else 1
    plan = tessera.plan(mask, num_q_heads=hq, head_dim=8)
    check_queue(plan)
    rng = np.random.default_rng(5)
    check_emulation(plan, mask, *random_qkv(rng, 1, hq, hq, mask.seq_len_q, mask.seq_len_kv),
                    None)


def test_one_token_sequences():
    mask = BlockMask.from_dense(np.ones((1, 1), bool), block_size=16, seq_len_q=1, seq_len_kv=1)
    plan = tessera.plan(mask, num_q_heads=1, head_dim=4)
    check_queue(plan)
    rng = np.random.default_rng(6)
    check_emulation(plan, mask, *random_qkv(rng, 1, 1, 1, 1, 1, d=4), None)


# ---------------------------------------------------------------------------- device planner
def _np_plan_row_stats(grid, block, args):
    """numpy stand-in for plan.cu's plan_row_stats (same outputs, row by row; a null pointer,
    np.uint64(0), for count or the token sums leaves them unwritten, as the kernel does)."""
    dense, n_rows, n_kv, n_q, kb, block_n, count, nspans, ktok, otok, chunks, ident, pack = args
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


def _np_plan_write_spans(grid, block, args):
    """numpy stand-in for plan.cu's plan_write_spans."""
    dense, n_rows, n_kv, kb, span_dst, row_q0, row_q1, spans = args
    for r in range(int(n_rows)):
        if span_dst[r] < 0:
            continue
        sel = dense[r].astype(bool)
        starts = np.flatnonzero(sel & ~np.r_[False, sel[:-1]])
        ends = np.flatnonzero(sel & ~np.r_[sel[1:], False])
        for i, (s0, e) in enumerate(zip(starts, ends)):
            spans[span_dst[r] + i] = (kb[s0], kb[e + 1], row_q0[r], row_q1[r])


def _np_row_spans(dense_row, kb, q0, q1):
    sel = dense_row.astype(bool)
    starts = np.flatnonzero(sel & ~np.r_[False, sel[:-1]])
    ends = np.flatnonzero(sel & ~np.r_[sel[1:], False])
    return [(kb[s0], kb[e + 1], q0, q1) for s0, e in zip(starts, ends)]


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
            for i, span in enumerate(_np_row_spans(dense[r0], kb, q0, q1)):
                spans[sb + i] = span
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
            for i, span in enumerate(out):
                spans[int(span_off[v]) + i] = span
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


@pytest.mark.parametrize("group,mask_heads,batch", [(1, "q", 1), (2, "one", 2), (4, "kv", 1),
                                                    (2, "q", 2)])
@pytest.mark.parametrize("regime", [TILE_128x64.with_(combine_threshold=0.0),
                                    Regime(block_m=64, num_warps=4, combine_threshold=0.0),
                                    Regime(family="sm90", block_m=128, num_warps=8,
                                           block_n=128, stages=3, combine_threshold=0.0),
                                    Regime(family="sm90", block_m=64, num_warps=4,
                                           block_n=64, stages=3, combine_threshold=0.0,
                                           pack_keys=True),
                                    Regime(family="sm90", block_m=128, num_warps=12,
                                           block_n=128, stages=3, combine_threshold=0.0,
                                           align_tiles=True),
                                    Regime(block_m=64, num_warps=4, combine_threshold=0.0,
                                           align_tiles=True)])
def test_one_sync_planner_equals_general_planner(monkeypatch, group, mask_heads, batch, regime):
    """The fused device planner (runtime/device_planner.py, kernels replaced by numpy
    stand-ins) gives the general planner's tiles and task queue array for array, GQA packing and
    per-(batch, head) masks included; when a task must split it hands over (returns None)."""
    from tessera.cuda import loader
    from tessera.runtime import device_planner, mapping

    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    rng = np.random.default_rng(group * 7 + batch)
    hkv = 2
    hq = hkv * group
    mh = {"one": 1, "kv": hkv, "q": hq}[mask_heads]
    mb = batch if mask_heads == "q" else 1
    variable = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(8, 300, 14))],
                    kv_bounds=np.r_[0, np.cumsum(rng.integers(8, 200, 30))])
    repeated = np.repeat(rng.random((mb, mh, 7, 30)) < 0.3, 2, axis=2)  # identical row pairs
    cases = [(rng.random((mb, mh, 14, 30)) < 0.25, variable),
             (repeated, dict(block_size=64)),
             (rng.random((mb, mh, 9, 12)) < 0.5, dict(block_size=128, seq_len_q=1100,
                                                      seq_len_kv=1500))]
    for dense, geo in cases:
        mask = BlockMask.from_dense(dense, **geo)
        ref = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=64, batch=batch,
                           regime=regime)
        with monkeypatch.context() as mp:
            mp.setattr(mapping, "use_device_planner", lambda xp: True)
            spy = []
            real = device_planner.plan_on_device
            mp.setattr(tessera.runtime.plan, "plan_on_device",
                       lambda *a, **k: spy.append(real(*a, **k)) or spy[-1])
            got = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=64,
                               batch=batch, regime=regime)
        assert spy[0] is not None, "the one-sync planner plans every device mask it can hold"
        assert_same_plan(got, ref)


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("align", [False, True])
def test_one_sync_planner_splits_heavy_rows_like_the_general_planner(monkeypatch, group, align):
    """Rows far heavier than the mean (text tokens attending everything) split: the one-sync
    planner writes the tiles and the general task organization cuts them, giving the host plan
    (split spans, combine jobs, slots) array for array."""
    from tessera.cuda import loader
    from tessera.runtime import mapping

    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    dense = np.random.default_rng(3).random((2, 12, 60)) < 0.05
    dense[:, 4] = True
    dense[1, 9, :40] = True
    mask = BlockMask.from_dense(dense, block_size=64, seq_len_q=740)
    regime = TILE_128x64.with_(combine_threshold=0.0, split_ratio=2.0, min_split_chunks=4,
                               align_tiles=align)
    kw = dict(num_q_heads=2 * group, num_kv_heads=2, head_dim=64, regime=regime)
    ref = tessera.plan(mask, **kw)
    assert ref.queue.combine.shape[0] > 0
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    got = tessera.plan(mask, **kw)
    for f in ("tasks", "spans", "combine"):
        np.testing.assert_array_equal(getattr(got.queue, f), getattr(ref.queue, f), err_msg=f)
    assert got.queue.num_slots == ref.queue.num_slots


def test_split_limit_counts_the_tasks_in_flight():
    """The split rule: above split_ratio x the mean and min_split_chunks, and above the average
    work per task slot when the number of slots is known."""
    from tessera.runtime.tasks import split_limit

    assert split_limit(4.0, 16, 100, 1000, 0) == 40  # 4 x the mean of 10
    assert split_limit(4.0, 64, 100, 1000, 0) == 64
    assert split_limit(4.0, 16, 100, 1000, 10) == 100  # 10 slots: 100 chunks each
    assert split_limit(4.0, 16, 100, 1001, 10) == 101  # rounded up
    assert split_limit(4.0, 16, 100, 1000, 1000) == 40  # many slots: the ratio rule decides
    assert split_limit(2.0, 1, 0, 0, 132) == 1


def test_wide_step_tasks_are_those_of_few_long_spans():
    """The host mirror of bsa_sm90.cu's wide_task: at most four spans, and 192-key steps may
    pad at most 1/32 more keys than 128-key steps."""
    lengths = [[17776], [192], [384], [128], [1024], [576, 1152], [384] * 5, [], [100, 92]]
    spans, tasks = [], []
    for task in lengths:
        tasks.append([0, 0, 0, 128, len(spans), len(spans) + len(task), -1, 0])
        spans += [[1000, 1000 + n, 0, 1 << 30] for n in task]
    got = wide_step_tasks(np.array(tasks, np.int32), np.array(spans, np.int32).reshape(-1, 4),
                          128, 192)
    # 17776: 17856 against 17792 keys; 192: 192 against 256; 1024: 1152 against 1024;
    # 576 + 1152: 1728 against 1792; five spans: too many; two short spans: 384 against 256
    assert got.tolist() == [True, True, True, False, False, True, False, True, False]


def test_launch_order_puts_heavy_tasks_first_then_one_head_at_a_time():
    """launch_keys: tasks over 1/HEAVY_SHARE of a slot's share of the chunks or HEAVY_MEAN
    times the mean first, longest first; the rest grouped by assignment in order, longest first
    within one; ties keep their place (stable)."""
    from tessera.runtime.tasks import HEAVY_MEAN, HEAVY_SHARE

    cost = np.array([3, 50, 4, 3, 9, 2, 60, 4])
    group = np.array([1, 0, 0, 1, 1, 0, 1, 0])
    total = cost.sum()  # 135; with 2 slots a task is heavy above 135 / (2 x 8) = 8.4 chunks
    assert HEAVY_SHARE == 8
    order = np.argsort(launch_keys(cost, group, 2), kind="stable")
    assert list(order) == [6, 1, 4, 2, 7, 5, 0, 3]  # 60, 50, 9 | head 0: 4, 4, 2 | head 1: 3, 3
    # One slot (or unknown): only a task over an eighth of all the work is heavy.
    order = np.argsort(launch_keys(cost, group, 0), kind="stable")
    assert list(order) == [6, 1, 2, 7, 5, 4, 0, 3]
    assert cost[6] * 8 > total and cost[4] * 8 <= total
    # Many tasks a slot: a task over HEAVY_MEAN times the mean is heavy though far below a
    # slot's share (the text rows of video models).
    cost = np.ones(40, dtype=np.int64)
    cost[[7, 30]] = [3, 5]  # mean 1.15; a slot's share / 8 = 5.75
    group = np.arange(40) % 2
    order = np.argsort(launch_keys(cost, group, 1), kind="stable")
    assert list(order[:2]) == [30, 7] and HEAVY_MEAN == 2
    light = [i for i in range(0, 40, 2) if i != 30] + [i for i in range(1, 40, 2) if i != 7]
    assert list(order[2:]) == light  # one group, then the other, in their order


@pytest.mark.parametrize("slots,splits", [(1, False), (10_000, True)])
def test_plans_for_the_current_gpu_split_only_what_its_slots_need(monkeypatch, slots, splits):
    """Planning for the current GPU, a heavy row that the ratio rule would cut stays whole when
    the average work per task slot exceeds it (one SM here) and splits as before on a GPU with
    many slots; both planners agree either way, and a portable host plan (arch None) keeps the
    ratio rule alone."""
    seen = []
    from tessera.cuda import loader
    from tessera.runtime import mapping

    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    monkeypatch.setattr(tessera.cuda.device, "device_arch", lambda: 90)
    monkeypatch.setattr(tessera.cuda.device, "device_sm_count", lambda: 7)
    monkeypatch.setattr(tessera.runtime.regime.slots, "_device_tasks_in_flight",
                        lambda r, d, bf16, arch, sms: seen.append((arch, sms)) or slots)
    dense = np.random.default_rng(3).random((2, 12, 60)) < 0.05
    dense[:, 4] = True
    mask = BlockMask.from_dense(dense, block_size=64, seq_len_q=740)
    regime = TILE_128x64.with_(combine_threshold=0.0, split_ratio=2.0, min_split_chunks=4)
    kw = dict(num_q_heads=2, head_dim=64, regime=regime)
    portable = tessera.plan(mask, **kw)
    assert portable.queue.combine.shape[0] > 0  # the ratio rule splits row 4
    ref = tessera.plan(mask, arch=90, **kw)
    assert (ref.queue.combine.shape[0] > 0) == splits
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    got = tessera.plan(mask, arch=90, **kw)
    for f in ("tasks", "spans", "combine"):
        np.testing.assert_array_equal(getattr(got.queue, f), getattr(ref.queue, f), err_msg=f)
    if splits:  # the same tasks (their launch order depends on the slots: launch_keys)
        np.testing.assert_array_equal(np.unique(ref.queue.tasks, axis=0),
                                      np.unique(portable.queue.tasks, axis=0))
    else:
        assert ref.queue.num_slots == 0 and ref.queue.tasks[:, 7].max() == 60
    assert seen and set(seen) == {(90, 7)}  # asked for this GPU's SMs, never for the host plan


def test_tasks_in_flight_estimates():
    """Resident CTAs per SM from shared memory and threads, times the SMs."""
    from tessera.runtime.regime import default_regime, tasks_in_flight

    ws = default_regime(90, 128)  # ~225 KB: one CTA per SM
    assert tasks_in_flight(ws, 128, 90, 132) == 132
    assert tasks_in_flight(default_regime(90, 128, q_block=64), 128, 90, 132) == 264
    assert tasks_in_flight(Regime(block_m=64, num_warps=4), 64, 90, 132) >= 264
    # A variant larger than the architecture allows still counts one per SM.
    assert tasks_in_flight(ws, 128, 86, 84) == 84


def _sync_free_cases(rng):
    """Masks that push the sync-free bounds: a checkerboard (a span per two key blocks), rows
    that all differ, identical rows (one run), empty rows, short variable blocks."""
    checker = np.add.outer(np.arange(9), np.arange(31)) % 2 == 0
    ragged = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(1, 200, 11))],
                  kv_bounds=np.r_[0, np.cumsum(rng.integers(1, 90, 31))])
    empty = rng.random((11, 31)) < 0.2
    empty[3:6] = False
    # 8-token query blocks, a checkerboard: an aligned tile meets 16 or 17 blocks and holds
    # every key block in a piece per two of them (its bound).
    tiny = dict(q_bounds=np.arange(0, 8 * 40 + 1, 8), kv_bounds=np.arange(0, 64 * 31 + 1, 64))
    return [(checker, dict(block_size=64)),
            (rng.random((11, 31)) < 0.4, ragged),
            (np.ones((9, 31), bool), dict(block_size=64)),
            (empty, ragged),
            (np.add.outer(np.arange(40), np.arange(31)) % 2 == 0, tiny)]


# Regimes whose plans never split (the sync-free device planner): portable, sm90, packed keys,
# aligned tiles.
SYNC_FREE_REGIMES = [TILE_128x64.with_(combine_threshold=0.0, split_ratio=1e9),
                     Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                            combine_threshold=0.0, split_ratio=1e9),
                     Regime(family="sm90", block_m=128, num_warps=12, block_n=64, stages=3,
                            combine_threshold=0.0, pack_keys=True),
                     Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                            combine_threshold=0.0, split_ratio=1e9, align_tiles=True)]


@pytest.mark.parametrize("group,mask_heads,batch", [(1, "q", 1), (2, "one", 2), (4, "kv", 1)])
@pytest.mark.parametrize("regime", SYNC_FREE_REGIMES)
def test_sync_free_planner_equals_general_planner(monkeypatch, group, mask_heads, batch,
                                                  regime):
    """When no task may split, the device planner never reads its totals back: its buffers are
    sized by the geometry's bounds (every adversarial mask here fits them), the task count
    stays on the device for the kernels, and the arrays cut at the totals are the general
    planner's, array for array -- the tasks already in launch order, as the stable sort orders
    them."""
    from tessera.cuda import loader
    from tessera.runtime import device_planner, mapping

    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    rng = np.random.default_rng(group * 11 + batch)
    hkv = 2
    hq = hkv * group
    kw = dict(num_q_heads=hq, num_kv_heads=hkv, head_dim=64, batch=batch, regime=regime)
    lead = (batch if mask_heads == "q" else 1, {"one": 1, "kv": hkv, "q": hq}[mask_heads])
    for base, geo in _sync_free_cases(rng):
        dense = base | (rng.random((*lead, *base.shape)) < 0.05)  # heads differ a little
        if base.all():
            dense[:] = True  # every row alike: one run per head
        mask = BlockMask.from_dense(dense, **geo)
        ref = tessera.plan(mask, **kw)
        with monkeypatch.context() as mp:
            mp.setattr(mapping, "use_device_planner", lambda xp: True)
            reads = []  # device-to-host copies (each would be a synchronization on the GPU)
            mp.setattr(device_planner, "to_numpy", lambda a: reads.append(1) or np.asarray(a))
            got = tessera.plan(mask, **kw)
            assert got.sync_free and callable(got._exact) and not reads  # nothing read back
            _ = got.tiles  # the exact arrays: one read of the totals
            assert len(reads) == 1
        launch = got.launch_queue
        n = int(launch.count[0])
        assert launch.num_tasks >= n == ref.queue.num_tasks
        assert_same_plan(got, ref)
        np.testing.assert_array_equal(launch.tasks[:n], ref.queue.tasks)
        assert_launch_order(ref)
        assert got.queue.num_slots == 0


@pytest.mark.parametrize("regime", SYNC_FREE_REGIMES)
def test_replan_gives_what_a_new_plan_gives(monkeypatch, regime):
    """Plan.replan: masks of one geometry planned one after another into the first plan's
    buffers (the same arrays, nothing read back) give the general planner's arrays for each,
    whatever the previous mask left there; a mask of another geometry, a host plan or a
    non-mask is refused before anything is launched."""
    from tessera.cuda import loader
    from tessera.runtime import device_planner, mapping

    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    rng = np.random.default_rng(5)
    kw = dict(num_q_heads=4, num_kv_heads=2, head_dim=64, batch=2, regime=regime)
    for base, geo in _sync_free_cases(rng):
        masks = [BlockMask.from_dense(base | (rng.random((2, 4, *base.shape)) < p), **geo)
                 for p in (0.05, 0.6, 0.0, 0.3)]
        masks.append(BlockMask.from_dense(np.zeros((2, 4, *base.shape), bool), **geo))
        with monkeypatch.context() as mp:
            mp.setattr(mapping, "use_device_planner", lambda xp: True)
            got = tessera.plan(masks[0], **kw)
            assert got.replannable and got.regime_by_geometry
            tasks, spans = got.launch_queue.tasks, got.launch_queue.spans
            for m in masks[1:]:
                reads = []
                mp.setattr(device_planner, "to_numpy",
                           lambda a: reads.append(1) or np.asarray(a))
                assert got.replan(m) is got and got.mask is m and not reads
                ref = tessera.plan(m, **kw)
                assert_same_plan(got, ref)  # (the exact arrays: cut from the buffers below)
                for cut, buffer in ((got.queue.tasks, tasks), (got.queue.spans, spans)):
                    assert cut.size == 0 or np.shares_memory(cut, buffer)
        other = BlockMask.from_dense(np.ones((2, 4, 3, 3), bool), block_size=64)
        with pytest.raises(ValueError, match="geometry"):
            got.replan(other)
    with pytest.raises(TypeError, match="block_mask"):
        got.replan(masks[0].dense_rows)
    host = tessera.plan(masks[0], **kw)  # the general planner: exact arrays, no buffers
    assert not host.replannable
    with pytest.raises(ValueError, match="sync-free"):
        host.replan(masks[1])


def test_sync_free_plans_read_nothing_back(monkeypatch):
    """plan(sync_free=True) -- what a request captured into a CUDA graph takes: a regime chosen
    by the geometry alone (no table lookup, no align_pays estimate) made never to split or
    merge, planned with nothing read back, equal to the general planner's plan of that regime;
    a given regime that may split or merge, or a host mask, is refused by name before anything
    is launched."""
    from tessera.cuda import loader
    from tessera.runtime import device_planner, mapping
    from tessera.runtime.tasks import NEVER_SPLIT_RATIO

    launched = []

    def stand_in(v):
        kernel = PLANNER_STAND_INS[v.kernel]
        return lambda *args, **kwargs: launched.append(v.kernel) or kernel(*args, **kwargs)

    monkeypatch.setattr(loader, "load_kernel", stand_in)
    read_selection = []
    monkeypatch.setattr(tessera.runtime.regime.selection, "align_pays",
                        lambda *a, **k: read_selection.append("align") or False)
    monkeypatch.setattr(tessera.runtime.regime.features, "mask_features",
                        lambda *a, **k: read_selection.append("features"))
    rng = np.random.default_rng(3)
    mask = BlockMask.from_dense(rng.random((2, 9, 31)) < 0.3, block_size=64)
    kw = dict(num_q_heads=4, num_kv_heads=2, head_dim=64, batch=1)
    with pytest.raises(ValueError, match="block_mask must be on the GPU"):
        tessera.plan(mask, sync_free=True, **kw)  # a host mask: the general planner
    with monkeypatch.context() as mp:
        mp.setattr(mapping, "use_device_planner", lambda xp: True)
        reads = []
        mp.setattr(device_planner, "to_numpy", lambda a: reads.append(1) or np.asarray(a))
        got = tessera.plan(mask, sync_free=True, **kw)
        assert got.sync_free and got.replannable and not reads and not read_selection
        assert got.regime.split_ratio == NEVER_SPLIT_RATIO and got.regime.combine_threshold == 0
        # The heuristic on its own would split here (no GPU: its slots are unknown).
        assert tessera.plan(mask, **kw).regime.split_ratio < NEVER_SPLIT_RATIO
        launched.clear()
        for bad in (TILE_128x64.with_(combine_threshold=0.0, split_ratio=2.0),
                    TILE_128x64.with_(split_ratio=1e9, combine_threshold=0.5)):
            with pytest.raises(ValueError, match="regime .* may split tasks or merge rows"):
                tessera.plan(mask, sync_free=True, regime=bad, **kw)
        assert not launched
        # On an H200-like GPU, query blocks ragged against the 128-row tile: a new plan asks
        # align_pays (or the table) of the mask, a sync-free one neither.
        mp.setattr(tessera.cuda.device, "device_arch", lambda: 90)
        mp.setattr(tessera.cuda.device, "device_sm_count", lambda: 7)
        mp.setattr(tessera.runtime.regime.slots, "_device_tasks_in_flight", lambda *args: 14)
        ragged = BlockMask.from_dense(
            rng.random((2, 9, 9)) < 0.3, q_bounds=np.r_[0, np.cumsum(rng.integers(90, 200, 9))],
            kv_bounds=np.r_[0, np.cumsum(rng.integers(90, 200, 9))])
        kw90 = dict(kw, head_dim=128, arch=90)
        heuristic = tessera.plan(ragged, sync_free=True, **kw90)  # nothing read before
        assert heuristic.sync_free and not read_selection and not heuristic.regime.align_tiles
        mp.setattr(tessera.runtime.regime.selection, "align_pays",
                   lambda *a, **k: read_selection.append("align") or True)
        eager = tessera.plan(ragged, **kw90)
        assert read_selection and eager.regime.align_tiles
        read_selection.clear()
        reads.clear()
        # The last selection that read a mask of this geometry (the warm-up before a capture).
        captured = tessera.plan(ragged, sync_free=True, **kw90)
        assert captured.sync_free and not read_selection and not reads
        assert captured.regime == eager.regime.with_(split_ratio=NEVER_SPLIT_RATIO)
        mp.setattr(device_planner, "REQUIRED_SYNC_FREE_WORKSPACE_LIMIT", 1000)
        launched.clear()
        with pytest.raises(ValueError, match="plan buffers would take"):
            tessera.plan(mask, sync_free=True, **kw)
        assert not launched
    assert_same_plan(got, tessera.plan(mask, regime=got.regime, **kw))


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 200), min_size=0, max_size=12),
       bn=st.sampled_from([64, 128]), seed=st.integers(0, 2**31 - 1))
def test_packed_walk_covers_each_key_once(lengths, bn, seed):
    """The packed walk (the emulator's copy of common.cuh's PackedWalk and Cursor): chunk after
    chunk, the valid rows hold the task's keys end to end, each once, in span order; a chunk
    is full except the last; rows past the keys repeat the last key; the row range is the
    task's first span's (the kernel's consumers read it once a task)."""
    from tessera.runtime.emulate import _packed_chunks
    from tessera.runtime.queue import Span, records

    rng = np.random.default_rng(seed)
    gaps = rng.integers(0, 300, len(lengths))
    k0 = np.cumsum(gaps + np.r_[0, lengths[:-1]]).astype(np.int64)
    spans = np.stack([k0, k0 + lengths, np.arange(len(lengths)), np.arange(len(lengths)) + 1],
                     axis=1).reshape(-1, 4)
    chunks = list(_packed_chunks(records(spans, Span), bn))
    total = sum(lengths)
    assert len(chunks) == -(-total // bn)
    got = np.concatenate([keys[ok] for keys, ok, _, _ in chunks]) if chunks else np.zeros(0)
    want = np.concatenate([np.arange(a, b) for a, b in spans[:, :2]]) if total else np.zeros(0)
    np.testing.assert_array_equal(got, want)
    for i, (keys, ok, r0, _) in enumerate(chunks):
        assert ok.sum() == min(bn, total - i * bn) and ok[:ok.sum()].all()
        assert (keys[~ok] == want[-1]).all()
        assert r0 == spans[0, 2]


def test_packed_keys_plans_emulate_exactly_with_less_work():
    """A pack_keys regime on masks of small and ragged blocks: the emulated plan equals the
    reference on the mask, computes nothing outside it, never splits, and computes fewer pairs
    than the span-by-span walk (its cost: each task's keys end to end)."""
    rng = np.random.default_rng(5)
    qb = np.r_[0, np.cumsum(rng.integers(8, 80, 12))]
    kb = np.r_[0, np.cumsum(rng.integers(4, 70, 40))]
    mask = BlockMask.from_dense(rng.random((2, qb.size - 1, kb.size - 1)) < 0.3,
                                q_bounds=qb, kv_bounds=kb)
    q, k, v = random_qkv(rng, 1, 2, 2, int(qb[-1]), int(kb[-1]))
    for bm, bn, warps in ((64, 64, 4), (128, 128, 12)):
        base = Regime(family="sm90", block_m=bm, block_n=bn, num_warps=warps, stages=3,
                      combine_threshold=0.0, split_ratio=1.0, min_split_chunks=1)
        packed = base.with_(pack_keys=True)
        plain = tessera.plan(mask, num_q_heads=2, head_dim=8, regime=base)
        p = tessera.plan(mask, num_q_heads=2, head_dim=8, regime=packed)
        check_queue(p)
        assert p.queue.num_slots == 0 and plain.queue.num_slots > 0  # packed never splits
        res = check_emulation(p, mask, q, k, v, None)
        assert res.pairs_unmasked == int(mask.selected_pairs(1, 2).sum())
        spans = np.asarray(p.queue.spans, dtype=np.int64)
        tasks = np.asarray(p.queue.tasks, dtype=np.int64)
        keys = [int((spans[a:b, 1] - spans[a:b, 0]).sum()) for a, b in tasks[:, 4:6]]
        assert [int(c) for c in tasks[:, 7]] == [-(-n // bn) for n in keys]
        assert p.computed_pairs() < plain.computed_pairs()


def test_aligned_tiles_cut_the_waste_of_clusters():
    """Variable ~150-token clusters that select most keys: tiles cut from each block run their
    last tile mostly empty; aligned tiles share keys across the boundary and compute far less,
    exactly (emulated)."""
    rng = np.random.default_rng(7)
    n = 16
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, n))]
    kb = qb.copy()
    # Neighbouring clusters select mostly the same keys: row i a window of ~11 blocks around
    # i whose ends move by a block at random.
    i = np.arange(n)[None, :, None]
    lo = i - 5 - rng.integers(0, 2, (2, n, 1))
    hi = i + 5 + rng.integers(0, 2, (2, n, 1))
    j = np.arange(n)[None, None, :]
    dense = (j >= lo) & (j <= hi)
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    q, k, v = random_qkv(rng, 1, 2, 2, int(qb[-1]), int(kb[-1]))
    base = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                  combine_threshold=0.0)
    plain = tessera.plan(mask, num_q_heads=2, head_dim=8, regime=base)
    aligned = tessera.plan(mask, num_q_heads=2, head_dim=8, regime=base.with_(align_tiles=True))
    check_queue(aligned)
    check_emulation(aligned, mask, q, k, v, None)
    assert aligned.tiles.num_tiles == 2 * -(-int(qb[-1]) // 128)
    assert aligned.stats().num_merged > 0  # tiles that straddle a block boundary
    assert aligned.computed_pairs() < 0.85 * plain.computed_pairs()


def _tiling_pairs_by_loops(dense, qb, kb, tile_rows):
    """tiling_pairs written out block by block and tile by tile (the test's own reading)."""
    kv_tokens = np.diff(kb)
    plain = aligned = 0
    lq = int(qb[-1])
    for rows in dense.reshape(-1, *dense.shape[-2:]):
        for i, sel in enumerate(rows):
            plain += -(-(qb[i + 1] - qb[i]) // tile_rows) * tile_rows * kv_tokens[sel].sum()
        for t0 in range(0, lq, tile_rows):
            t1 = min(t0 + tile_rows, lq)
            meets = [i for i in range(len(rows)) if qb[i] < t1 and qb[i + 1] > t0]
            aligned += (t1 - t0) * kv_tokens[rows[meets].any(axis=0)].sum()
    return int(plain), int(aligned)


def _np_tiling_pairs(grid, block, args):
    """numpy stand-in for plan.cu's tiling_pairs, warp by warp: mask rows first (out[0]), then
    each mask (batch, head)'s aligned tiles (out[1])."""
    dense, n_rows, n_kv, n_q, per_bh, qb, kb, lo, hi, tile_rows, out = args
    dense = dense.reshape(-1, int(n_kv)).astype(bool)
    kv_tokens = np.diff(kb)
    for w in range(int(n_rows) + int(n_rows) // int(n_q) * int(per_bh)):
        if w < n_rows:
            first = last = w
            rows = -(-(qb[w % n_q + 1] - qb[w % n_q]) // tile_rows) * tile_rows
        else:
            bh, t = divmod(w - int(n_rows), int(per_bh))
            first, last = bh * n_q + lo[t], bh * n_q + hi[t]
            rows = min(t * tile_rows + tile_rows, qb[n_q]) - t * tile_rows
        out[0 if w < n_rows else 1] += np.uint64(
            rows * kv_tokens[dense[first:last + 1].any(axis=0)].sum())


@pytest.mark.parametrize("seed", range(4))
def test_tiling_pairs_estimate(seed, monkeypatch):
    """The plain and aligned tilings' pairs as tiling_pairs estimates them equal the loop
    reading on random variable blocks (batch and heads, an empty block row); on clusters whose
    neighbours share keys the estimate is within 0.1 of the planned ratio."""
    from tessera.runtime.mapping import tiling_pairs

    rng = np.random.default_rng(seed)
    n_q, n_kv = int(rng.integers(3, 14)), int(rng.integers(2, 14))
    qb = np.r_[0, np.cumsum(rng.integers(20, 300, n_q))]
    kb = np.r_[0, np.cumsum(rng.integers(20, 300, n_kv))]
    dense = rng.random((2, 3, n_q, n_kv)) < rng.uniform(0.1, 0.9)
    dense[0, 1, n_q // 2] = False
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    from tessera.cuda import loader
    from tessera.runtime.mapping import _tiling_pairs_on_device, aligned_geometry

    monkeypatch.setattr(loader, "load_kernel",
                        lambda v: {"tiling_pairs": _np_tiling_pairs}[v.kernel])
    for rows in (64, 128):
        expected = _tiling_pairs_by_loops(dense, qb, kb, rows)
        assert tiling_pairs(mask, rows) == expected
        # The device path's launch (the kernel replaced by its numpy stand-in).
        geo = aligned_geometry(qb, rows, np)
        assert _tiling_pairs_on_device(mask, mask.to_dense(), geo, rows) == expected
    n = 16
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, n))]
    i, j = np.arange(n)[None, :, None], np.arange(n)[None, None, :]
    near = np.abs(j - i) <= 5 + rng.integers(0, 2, (2, n, 1))
    mask = BlockMask.from_dense(near, q_bounds=qb, kv_bounds=qb)
    plain, aligned = tiling_pairs(mask, 128)
    base = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                  combine_threshold=0.0)
    planned = [tessera.plan(mask, num_q_heads=2, head_dim=8, regime=r).computed_pairs()
               for r in (base, base.with_(align_tiles=True))]
    assert abs(aligned / plain - planned[1] / planned[0]) < 0.1


def test_tiling_pairs_declines_tiny_blocks():
    """Blocks far smaller than a tile (more than ALIGNED_ESTIMATE_MAX_BLOCKS in one tile): no
    estimate, the plain tiling combines such blocks."""
    from tessera.runtime.mapping import ALIGNED_ESTIMATE_MAX_BLOCKS, tiling_pairs

    qb = np.arange(0, 40 * 4 + 1, 4)  # 4-token blocks: 32 in a 128-row tile
    mask = BlockMask.from_dense(np.ones((1, 40, 3), bool), q_bounds=qb,
                                kv_bounds=np.array([0, 64, 128, 192]))
    assert 128 // 4 > ALIGNED_ESTIMATE_MAX_BLOCKS and tiling_pairs(mask, 128) is None
    assert tiling_pairs(mask, 32) is not None  # 8 blocks a tile


def test_192_row_tiles_need_the_producer():
    """Three consumer warpgroups take turns only in the warp-specialized variant."""
    with pytest.raises(ValueError, match="192: with the producer"):
        Regime(family="sm90", block_m=192, num_warps=12, block_n=64, stages=3)
    r = Regime(family="sm90", block_m=192, num_warps=16, block_n=64, stages=3)
    assert r.producer and r.variant(64).threads == 512 and r.variant(64).persistent


def test_align_tiles_needs_no_merges_or_packing():
    from tessera.runtime.regime import regime_from_name

    with pytest.raises(ValueError, match="align_tiles needs combine_threshold 0"):
        Regime(align_tiles=True)
    with pytest.raises(ValueError, match="align_tiles needs"):
        Regime(family="sm90", block_m=64, num_warps=4, block_n=64, stages=3,
               combine_threshold=0.0, pack_keys=True, align_tiles=True)
    r = Regime(combine_threshold=0.0, align_tiles=True)
    assert "align_tiles=True" in r.name and regime_from_name(r.name) == r


def test_pack_keys_needs_sm90_and_no_restricted_merges():
    with pytest.raises(ValueError, match="pack_keys needs the sm90 family"):
        Regime(pack_keys=True, combine_threshold=0.0)
    with pytest.raises(ValueError, match="combine_threshold 0"):
        Regime(family="sm90", block_m=64, num_warps=4, block_n=64, stages=3, pack_keys=True)
    r = Regime(family="sm90", block_m=64, num_warps=4, block_n=64, stages=3,
               combine_threshold=0.0, pack_keys=True)
    assert "pack_keys=True" in r.name and dict(r.variant(64).macros)["PACK_KEYS"] == 1
    assert "PACK_KEYS" not in dict(r.with_(pack_keys=False).variant(64).macros)


def test_may_split_rule():
    """Never for never-split ratios; planning for a GPU, not once the shape guarantees 16 tasks
    per slot; a portable plan (no slots known) keeps the split rule."""
    from tessera.runtime.tasks import may_split, tasks_lower_bound

    assert tasks_lower_bound(2, 12, 1, 32760, 128) == 2 * 12 * 256
    assert tasks_lower_bound(1, 8, 4, 1000, 32) == 2 * 32
    assert not may_split(1e9, 10, 0)
    assert may_split(4.0, 10**6, 0)
    assert may_split(4.0, 16 * 132 - 1, 132)
    assert not may_split(4.0, 16 * 132, 132)


@pytest.mark.parametrize("source", ["dense", "csr"])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 1.0])
def test_device_planner_logic_equals_host_planner(monkeypatch, source, threshold):
    """The device planner's array logic (kernels replaced by numpy stand-ins) gives the host
    planner's tiles, also when restricted merges send it on to the general path with the
    kernels' row statistics, and for masks arriving as CSR (scattered to dense rows)."""
    from tessera.cuda import loader
    from tessera.runtime import mapping

    kernels = {"plan_row_stats": _np_plan_row_stats, "plan_write_spans": _np_plan_write_spans}
    monkeypatch.setattr(loader, "load_kernel", lambda v: kernels[v.kernel])
    rng = np.random.default_rng(17)
    band = np.zeros((2, 16, 16), bool)
    for i in range(16):
        band[:, i, max(0, i - 2):i + 2] = True
    variable = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(8, 150, 12))],
                    kv_bounds=np.r_[0, np.cumsum(rng.integers(8, 200, 30))])
    cases = [(band, dict(block_size=64)),
             (rng.random((3, 12, 30)) < 0.3, variable),
             (np.repeat(rng.random((2, 6, 20)) < 0.4, 2, axis=1), dict(block_size=32))]
    merged = 0
    for dense, geo in cases:
        host = BlockMask.from_dense(dense, **geo)
        ref = mapping.map_to_tiles(host, 128, 64, threshold)
        m = host if source == "dense" else BlockMask(host.q_bounds, host.kv_bounds, host.indptr,
                                                     host.indices, host.batch_heads)
        with monkeypatch.context() as mp:
            mp.setattr(mapping, "use_device_planner", lambda xp: True)
            got = mapping.map_to_tiles(m, 128, 64, threshold)
        merged += ref.num_merged
        assert (got.num_groups, got.num_merged) == (ref.num_groups, ref.num_merged)
        for f in ("mask_bh", "q0", "q1", "span_begin", "span_end", "chunks", "k0", "k1", "r0",
                  "r1"):
            np.testing.assert_array_equal(getattr(got, f), getattr(ref, f), err_msg=f)
    assert (merged > 0) == (threshold > 0)  # the merge path was exercised where it can be
