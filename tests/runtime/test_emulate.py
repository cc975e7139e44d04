"""CPU tests of the emulator (tessera.runtime.emulate).

The core check (DESIGN.md section 7): for thousands of random masks, regimes and attention
shapes, ``tessera.runtime.emulate.run(plan, q, k, v)`` equals ``tessera.reference.attention``
in float64, computes no pair outside the logical mask and leaves no output unwritten (the
emulator poisons with NaN)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import tessera
from tessera import BlockMask, Regime
from tessera.reference import attention
from tessera.runtime import emulate
from tessera.runtime.queue import Span, Task, records
from tests.runtime.runtime_helpers import (
    ALIGN_REGIMES,
    BASE_REGIMES,
    COMBINE_REGIMES,
    EXTRA_REGIMES,
    SPLIT_REGIMES,
    TOL,
    assert_same_non_finite,
    cases,
    check_emulation,
    check_queue,
    poisoned_restricted_case,
    random_qkv,
)


def label(plan) -> None:
    """Hypothesis events, to see what the generated cases exercise
    (--hypothesis-show-statistics)."""
    s = plan.stats()
    event(f"merged: {s.num_merged > 0}")
    event(f"split: {s.num_split_jobs > 0}")
    event(f"gqa packed: {plan.heads_per_task > 1}")
    event(f"subdivided: {s.num_tiles > s.num_groups}")


def sweep(full: int) -> pytest.MarkDecorator:
    """A sweep's example counts: an eighth of ``full`` in the default run, all of them under
    the ``slow`` marker (``python -m pytest -q -m slow tests``)."""
    return pytest.mark.parametrize("examples", [
        pytest.param(max(full // 8, 20), id="quick"),
        pytest.param(full, id="full", marks=pytest.mark.slow)])


def _run_sweep(regimes: list, examples: int, check_case) -> None:
    @settings(max_examples=examples, deadline=None)
    @given(cases(regimes))
    def run(case):
        plan, mask, q, k, v, scale = case
        label(plan)
        check_queue(plan)
        check_case(plan)
        check_emulation(plan, mask, q, k, v, scale)

    run()


@sweep(1600)
def test_emulator_matches_reference(examples):
    _run_sweep(BASE_REGIMES + EXTRA_REGIMES, examples, lambda plan: None)


@sweep(600)
def test_emulator_matches_reference_with_splits(examples):
    _run_sweep(SPLIT_REGIMES, examples, lambda plan: None)


@sweep(500)
def test_emulator_matches_reference_combine_thresholds(examples):
    def no_merge_at_zero(plan):
        if plan.regime.combine_threshold == 0:
            # 0 disables merging groups whose key sets differ (identical ones never reach
            # step 3)
            assert plan.stats().num_merged == 0

    _run_sweep(COMBINE_REGIMES, examples, no_merge_at_zero)


@sweep(500)
def test_emulator_matches_reference_aligned_tiles(examples):
    """Tiles straddling query-block boundaries stay exact: every selected pair once, nothing
    outside the mask, every output written; tiles start at multiples of the tile rows."""
    def tiles_aligned(plan):
        t = plan.tiles
        assert np.all(np.asarray(t.q0) % t.tile_rows == 0)

    _run_sweep(ALIGN_REGIMES, examples, tiles_aligned)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 200), min_size=0, max_size=12),
       bn=st.sampled_from([64, 128]), seed=st.integers(0, 2**31 - 1))
def test_packed_walk_covers_each_key_once(lengths, bn, seed):
    """The packed walk (the emulator's copy of common/walk.cuh's PackedWalk and Cursor): chunk after
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
        plain = tessera.plan(mask, num_q_heads=2, head_dim=64, regime=base)
        p = tessera.plan(mask, num_q_heads=2, head_dim=64, regime=packed)
        check_queue(p)
        assert p.queue.num_slots == 0 and plain.queue.num_slots > 0  # packed never splits
        res = check_emulation(p, mask, q, k, v, None)
        assert res.pairs_unmasked == int(mask.selected_pairs(1, 2).sum())
        spans = np.asarray(p.queue.spans, dtype=np.int64)
        tasks = np.asarray(p.queue.tasks, dtype=np.int64)
        s, t = records(spans, Span), records(tasks, Task)
        keys = [int((s.k_end[a:b] - s.k_start[a:b]).sum())
                for a, b in zip(t.span_begin, t.span_end)]
        assert [int(c) for c in t.cost] == [-(-n // bn) for n in keys]
        assert p.computed_pairs() < plain.computed_pairs()


@pytest.mark.parametrize("block_m,align", [(128, False), (64, False), (128, True)])
def test_non_finite_values_reach_only_the_rows_that_select_them(block_m, align):
    """Tiles whose rows select different keys (combined short query blocks, aligned tiles):
    Inf, -Inf and NaN values in keys some of a tile's rows select make exactly the reference's
    elements non-finite, as the kernels do (tests/gpu/test_attention.py runs the same case)."""
    rng = np.random.default_rng(block_m + align)
    mask, policy, q, k, v = poisoned_restricted_case(rng, block_m, align, 64)
    reg = Regime(block_m=block_m, num_warps=4, block_n=64, **policy)
    plan = tessera.plan(mask, num_q_heads=2, head_dim=64, dtype="float16", regime=reg, arch=80)
    assert plan.tiles.num_merged > 0, "no tile's rows select different keys: the test is void"
    ref = attention(q, k, v, mask)
    with np.errstate(invalid="ignore"):
        got = emulate.run(plan, q, k, v).out
    rows = assert_same_non_finite(got, ref)
    assert np.abs(got[rows] - ref[rows]).max() <= 1e-9 * np.abs(ref[rows]).max()


# ---------------------------------------------------------------------------- backward
@pytest.mark.parametrize("mask_heads", [1, 2, 4])
@pytest.mark.parametrize("seed,block_m", [(0, 64), (1, 128)])
def test_backward_by_both_directions_equals_the_reference(mask_heads, seed, block_m):
    """dQ by the query-major backward queue and dK/dV by the key-major one (a kv head's group
    in one task) give the float64 reference's gradients, with no pair outside the logical mask
    and every gradient row written by exactly one task: ragged and short blocks, an empty
    row, GQA with one mask, a mask per kv head or per query head, both layouts, the portable
    and the Hopper kernels' tiles."""
    rng = np.random.default_rng(seed)
    qb = np.array([0, 70, 128, 150, 256, 300])
    kb = np.array([0, 64, 100, 228, 237, 300])
    dense = rng.random((1, mask_heads, 5, 5)) < 0.45
    dense[0, 0, 2] = False  # a query block that selects nothing
    dense[..., 0, 0] = True
    dense[0, -1, :, 3] = False  # a key block no query of the last mask head selects
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    layout = ("bhld", "blhd")[seed]
    shape = lambda h: (1, h, 300, 64) if layout == "bhld" else (1, 300, h, 64)  # noqa: E731
    q, dout = rng.standard_normal(shape(4)), rng.standard_normal(shape(4))
    k, v = rng.standard_normal(shape(2)), rng.standard_normal(shape(2))
    p = tessera.plan(mask, num_q_heads=4, num_kv_heads=2, head_dim=64, layout=layout)
    got = emulate.run_backward(p, q, k, v, dout, scale=0.11, block_m=block_m)
    want = tessera.reference.attention_backward(q, k, v, dout, mask, scale=0.11, layout=layout)
    assert got.pairs_outside == 0
    assert (got.dq_writers == 1).all() and (got.dkv_writers == 1).all()
    for g, w in zip((got.dq, got.dk, got.dv), want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=TOL * max(1.0, float(np.abs(w).max())))


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_backward_takes_the_forwards_out_and_lse(layout):
    """Given the forward's out and LSE (as a backward kernel takes them), the backward pass
    reads them -- the same gradients as recomputing the forward; another out moves dQ and dK
    through Delta = rowsum(dO * O) and leaves dV -- and refuses one without the other, or an
    LSE of another shape, by name."""
    rng = np.random.default_rng(7)
    mask = BlockMask.from_dense(rng.random((2, 3, 3)) < 0.6, block_size=64)
    shape = (lambda h: (1, h, 192, 64)) if layout == "bhld" else (lambda h: (1, 192, h, 64))
    q, k, v, dout = (rng.standard_normal(shape(2)) for _ in range(4))
    p = tessera.plan(mask, num_q_heads=2, head_dim=64, layout=layout, arch=90)
    fwd = emulate.run(p, q, k, v)
    given = emulate.run_backward(p, q, k, v, dout, out=fwd.out, lse=fwd.lse)
    again = emulate.run_backward(p, q, k, v, dout)
    for a, b in zip((given.dq, given.dk, given.dv), (again.dq, again.dk, again.dv)):
        np.testing.assert_array_equal(a, b)
    moved = emulate.run_backward(p, q, k, v, dout, out=fwd.out * 1.5, lse=fwd.lse)
    assert not np.allclose(moved.dq, given.dq) and not np.allclose(moved.dk, given.dk)
    np.testing.assert_array_equal(moved.dv, given.dv)
    with pytest.raises(ValueError, match="give the forward's out and lse together"):
        emulate.run_backward(p, q, k, v, dout, out=fwd.out)
    with pytest.raises(ValueError, match=r"lse must be the forward's LSE of shape \(1, 2, 192\)"):
        emulate.run_backward(p, q, k, v, dout, out=fwd.out, lse=fwd.lse[:, :1])
    with pytest.raises(ValueError, match="out must have the output's shape"):
        emulate.run_backward(p, q, k, v, dout, out=fwd.out[..., :32], lse=fwd.lse)


@pytest.mark.parametrize("block,hq,hkv,lq,lkv,layout", [
    (128, 2, 2, 700, 900, "bhld"), (64, 4, 2, 512, 640, "blhd"), (128, 2, 1, 256, 1000, "bhld"),
    (None, 2, 2, 0, 0, "bhld")])
@pytest.mark.parametrize("pv", ["int8", "16bit"])
def test_the_8bit_forward_emulates_its_oracle(block, hq, hkv, lq, lkv, layout, pv):
    """The 8-bit kernel's arithmetic on the 8-bit regime's plan (chunk-relative P rounded to
    u8, folded by exp(cm - m) / 255) is the float64 oracle of its scheme: the plan's chunks are
    the oracle's (spans of adjacent selected blocks, 128 keys from the multiple of 16 at or
    below a span's start -- blocks of any size: ``block`` None), so only float64 sums differ;
    every pair computed is selected, empty rows are 0."""
    from tessera import quantization as qz
    from tessera.runtime.regime.heuristic import INT8_REGIME

    rng = np.random.default_rng((block or 7) + lq)
    geo = {}
    if block is None:  # blocks of 24 to 200 tokens
        bounds = np.concatenate([[0], np.cumsum(rng.integers(24, 201, 9))])
        lq = lkv = int(bounds[-1])
        geo = dict(q_bounds=bounds, kv_bounds=bounds)
    shape = (lambda h, n: (1, h, n, 64)) if layout == "bhld" else (lambda h, n: (1, n, h, 64))
    q, k, v = (rng.standard_normal(shape(h, n)) for h, n in ((hq, lq), (hkv, lkv), (hkv, lkv)))
    nq, nk = (9, 9) if block is None else (-(-lq // block), -(-lkv // block))
    dense = rng.random((1, hq, nq, nk)) < 0.4
    dense[0, 0, 1] = False
    if block is None:
        mask = BlockMask.from_dense(dense, **geo)
    else:
        mask = BlockMask.from_dense(dense, block_size=block, seq_len_q=lq, seq_len_kv=lkv)
    plan = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=64, layout=layout,
                        regime=INT8_REGIME, arch=90)
    got = emulate.run(plan, q, k, v, scheme=qz.Scheme(pv=pv))
    assert got.pairs_outside == 0
    want, want_lse = qz.attention(q, k, v, mask, layout=layout, return_lse=True,
                                  scheme=qz.Scheme(pv=pv))
    np.testing.assert_allclose(got.out, want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.lse, want_lse, rtol=1e-12, atol=1e-12)  # (-inf: empty rows)
    exact = attention(q, k, v, mask, layout=layout)
    assert np.linalg.norm(got.out - exact) / np.linalg.norm(exact) < 3e-2  # the scheme's cost


def test_the_8bit_emulation_takes_int8_schemes_only():
    from tessera import quantization as qz

    mask = BlockMask.from_dense(np.ones((1, 1), bool), block_size=64)
    plan = tessera.plan(mask, num_q_heads=1, head_dim=64)
    x = np.zeros((1, 1, 64, 64))
    with pytest.raises(ValueError, match="scheme must round the scores to int8"):
        emulate.run(plan, x, x, x, scheme=qz.Scheme(qk="e4m3"))
