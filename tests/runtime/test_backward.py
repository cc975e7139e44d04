"""The backward pass's task queues (runtime/backward.py): one task per gradient row, a kv head's
group of query heads in one key-major task, positions that never leave their head."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import BlockMask
from tessera.runtime.backward import backward_queues
from tessera.runtime.plan import checked_shape
from tessera.runtime.queue import Span, Task, records
from tests.runtime.runtime_helpers import PLANNER_STAND_INS


def _queues(dense, qb, kb, hq, hkv, d=64, block_m=64):
    mask = BlockMask.from_dense(dense, q_bounds=np.asarray(qb), kv_bounds=np.asarray(kb))
    shape = checked_shape(mask, hq, hkv, d, None, dense.shape[0], "bfloat16", "bhld")
    return mask, backward_queues(mask, shape, block_m=block_m)


@pytest.mark.parametrize("mask_heads,block_m", [(1, 64), (2, 128), (4, 64), (4, 128)])
def test_key_major_tasks_hold_a_groups_query_heads(mask_heads, block_m):
    rng = np.random.default_rng(mask_heads)
    qb, kb = [0, 70, 128, 150, 256, 300], [0, 64, 100, 228, 237, 300]
    dense = rng.random((2, mask_heads, 5, 5)) < 0.5
    dense[..., 0, 0] = True
    mask, bq = _queues(dense, qb, kb, hq=4, hkv=2, block_m=block_m)
    assert bq.group == 2 and bq.seq_q == 300 and bq.dkdv.heads_per_task == 1
    assert bq.block_m == block_m and bq.dkdv.tile_rows == block_m
    tasks, spans = records(bq.dkdv.tasks, Task), records(bq.dkdv.spans, Span)
    assert set(int(h) for h in tasks.q_head0) == {0, 2}  # each group's first query head
    # Every key row of every (batch, kv head) in exactly one tile of at most 64 keys.
    rows = np.zeros((2, 2, 300), int)
    for t in tasks:
        assert 0 < t.q_end - t.q_start <= block_m and t.q_start % block_m == 0
        rows[t.batch, t.q_head0 // 2, t.q_start:t.q_end] += 1
        for s in spans[t.span_begin:t.span_end]:
            head = int(s.k_start) // 300
            assert head < 2 and (int(s.k_end) - 1) // 300 == head  # never leaves its head
            # the span's query rows of that head select the task's keys in the logical mask
            mh = (t.q_head0 + head) * mask_heads // 4
            qblk = np.searchsorted(qb, np.arange(s.k_start, s.k_end) % 300, side="right") - 1
            kblk = np.searchsorted(kb, np.arange(max(t.q_start, s.r_start),
                                                 min(t.q_end, s.r_end)), side="right") - 1
            assert dense[t.batch, mh][np.ix_(qblk, kblk)].all()
    assert (rows == 1).all()
    # Longest first.
    assert (np.diff(tasks.cost.astype(np.int64)) <= 0).all()


def test_query_major_queue_splits_nothing():
    dense = np.ones((1, 1, 8, 8), bool)  # equal tasks: a forward plan would fill the last wave
    mask, bq = _queues(dense, np.arange(9) * 128, np.arange(9) * 128, hq=3, hkv=3)
    assert bq.dq.num_slots == 0 and bq.dq.combine.shape[0] == 0
    p = tessera.plan(mask, num_q_heads=3, head_dim=64)
    assert p.backward_queues() is p.backward_queues()  # kept on the plan


@pytest.mark.parametrize("block_m", [64, 128])
def test_block_aligned_bounds_need_no_aligned_tiles(block_m):
    """Key blocks whose bounds are multiples of the tile rows: each head's own tiles (cut from
    its runs of blocks) agree across a group without the aligned mapping, and the emulated
    backward by them is the reference's."""
    rng = np.random.default_rng(block_m)
    dense = rng.random((1, 4, 6, 6)) < 0.5
    dense[..., 0, 0] = True
    bounds = np.arange(7) * 128
    mask, bq = _queues(dense, bounds, bounds, hq=4, hkv=2, block_m=block_m)
    tasks = records(bq.dkdv.tasks, Task)
    assert (tasks.q_start % block_m == 0).all()
    p = tessera.plan(mask, num_q_heads=4, num_kv_heads=2, head_dim=64)
    q, dout = rng.standard_normal((2, 1, 4, 768, 64))
    k, v = rng.standard_normal((2, 1, 2, 768, 64))
    got = tessera.emulate.run_backward(p, q, k, v, dout, block_m=block_m)
    want = tessera.reference.attention_backward(q, k, v, dout, mask)
    assert got.pairs_outside == 0 and (got.dkv_writers == 1).all()
    for g, w in zip((got.dq, got.dk, got.dv), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10 * max(1.0, np.abs(w).max()))


def _tasks_with_spans(queue):
    """Each task of ``queue`` with its spans, sorted: independent of task order and of where
    the spans are stored."""
    return sorted((tuple(t[[Task.BATCH, Task.Q_HEAD0, Task.Q_START, Task.Q_END]]),
                   tuple(map(tuple, queue.spans[t[Task.SPAN_BEGIN]:t[Task.SPAN_END]])))
                  for t in queue.tasks)


@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("geo,mask_heads", [
    (dict(block_size=128, seq_len_q=300, seq_len_kv=300), 1),
    (dict(q_bounds=np.array([0, 70, 128, 150, 256, 300]),
          kv_bounds=np.array([0, 64, 100, 228, 237, 300])), 3),
    (dict(block_size=64, seq_len_q=300, seq_len_kv=280), 3)])
def test_an_mha_device_mask_is_planned_by_the_planner_kernels(monkeypatch, geo, mask_heads,
                                                              block_m):
    """A device mask of an MHA shape takes the planner kernels (numpy stand-ins here) in both
    directions, sync-free: the queues carry their task counts, and cut at them they hold the
    host planner's tasks and spans (in the planner's launch order), by which the emulated
    backward is the reference's with one writer a row."""
    from tessera.cuda import loader
    from tessera.runtime import mapping

    rng = np.random.default_rng(block_m + mask_heads)
    n_q = len(geo["q_bounds"]) - 1 if "q_bounds" in geo else -(-300 // geo["block_size"])
    n_kv = len(geo["kv_bounds"]) - 1 if "kv_bounds" in geo else \
        -(-geo["seq_len_kv"] // geo["block_size"])
    dense = rng.random((2, mask_heads, n_q, n_kv)) < 0.4
    dense[..., 0, :] = False  # an empty query block
    dense[..., :, 1] = False  # keys nothing selects
    mask = BlockMask.from_dense(dense, **geo)
    shape = checked_shape(mask, 3, 3, 64, None, 2, "bfloat16", "bhld")
    host = backward_queues(mask, shape, block_m=block_m)
    assert not host.on_device
    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    got = backward_queues(mask, shape, block_m=block_m)
    assert got.on_device and got.dkdv.count is not None
    exact = got.settled()
    for name in ("dq", "dkdv"):
        g, h = getattr(exact, name), getattr(host, name)
        assert g.tasks.shape[0] <= getattr(got, name).tasks.shape[0]  # within the capacity
        assert int(np.asarray(getattr(got, name).count)[0]) == h.tasks.shape[0]
        assert _tasks_with_spans(g) == _tasks_with_spans(h), name
    p = tessera.plan(mask, num_q_heads=3, head_dim=64, batch=2)
    q, dout = rng.standard_normal((2, 2, 3, 300, 64))
    k, v = rng.standard_normal((2, 2, 3, mask.seq_len_kv, 64))
    emulated = tessera.emulate.run_backward(p, q, k, v, dout, block_m=block_m)
    assert p.backward_queues(block_m).on_device
    want = tessera.reference.attention_backward(q, k, v, dout, mask)
    assert emulated.pairs_outside == 0
    assert (emulated.dkv_writers == 1).all() and (emulated.dq_writers <= 1).all()
    for g, w in zip((emulated.dq, emulated.dk, emulated.dv), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10 * max(1.0, np.abs(w).max()))


@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("hq,hkv,mask_heads,batch", [(4, 2, 1, 1), (4, 2, 2, 2), (6, 2, 6, 2),
                                                     (3, 1, 3, 1)])
def test_a_gqa_device_mask_merges_its_groups_on_the_device(monkeypatch, hq, hkv, mask_heads,
                                                           batch, block_m):
    """GQA with a device mask (planner kernels as numpy stand-ins): the key-major tiles are
    aligned, the group's tasks merged by array operations with the task count left on the
    device, and the merged queue holds the host's tasks and spans; the emulated backward by it
    is the reference's, one writer a dK/dV row."""
    from tessera.cuda import loader
    from tessera.runtime import mapping

    rng = np.random.default_rng(hq * 100 + mask_heads * 10 + batch + block_m)
    qb, kb = [0, 70, 128, 150, 256, 300], [0, 64, 100, 228, 237, 300]
    dense = rng.random((batch if mask_heads == hq else 1, mask_heads, 5, 5)) < 0.45
    dense[..., 0, 0] = True
    dense[..., :, 3] = False  # keys nothing selects
    mask = BlockMask.from_dense(dense, q_bounds=np.asarray(qb), kv_bounds=np.asarray(kb))
    shape = checked_shape(mask, hq, hkv, 64, None, batch, "bfloat16", "bhld")
    host = backward_queues(mask, shape, block_m=block_m)
    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    got = backward_queues(mask, shape, block_m=block_m)
    assert got.on_device and got.group == hq // hkv
    exact = got.settled()
    assert _tasks_with_spans(exact.dkdv) == _tasks_with_spans(host.dkdv)
    p = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=64, batch=batch)
    q, dout = rng.standard_normal((2, batch, hq, 300, 64))
    k, v = rng.standard_normal((2, batch, hkv, 300, 64))
    want = tessera.reference.attention_backward(q, k, v, dout, mask)
    for atomic in (False, True):
        emulated = tessera.emulate.run_backward(p, q, k, v, dout, block_m=block_m,
                                                atomic_dq=atomic)
        assert emulated.pairs_outside == 0 and (emulated.dkv_writers == 1).all()
        for g, w in zip((emulated.dq, emulated.dk, emulated.dv), want):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-10 * max(1.0, np.abs(w).max()))
    assert p.backward_queues(block_m).on_device
    # Past the sync-free buffers' limit the planner reads its counts back and sizes the arrays
    # exactly (no device count): the merge takes that queue too.
    from tessera.runtime import backward, device_planner

    monkeypatch.setattr(device_planner, "SYNC_FREE_WORKSPACE_LIMIT", 0)
    monkeypatch.setattr(backward, "_group_key_tiles", None)  # (not the host's merge)
    exact_plan = backward_queues(mask, shape, block_m=block_m)
    assert not exact_plan.on_device
    assert _tasks_with_spans(exact_plan.settled().dkdv) == _tasks_with_spans(host.dkdv)


@pytest.mark.parametrize("hq,hkv,mask_heads", [(2, 2, 2), (4, 2, 4), (3, 1, 1)])
def test_dq_summed_by_the_key_major_tasks_is_the_references(hq, hkv, mask_heads):
    """The Hopper dK/dV kernel's dQ by atomics, emulated: each key-major task adds its chunks'
    partial dQ to their query rows (a group's heads included); the sums are the reference's
    dQ, rows that select nothing stay zero, and no query-major task runs."""
    rng = np.random.default_rng(hq * 10 + mask_heads)
    qb, kb = [0, 70, 128, 150, 256, 300], [0, 64, 100, 228, 237, 300]
    dense = rng.random((1, mask_heads, 5, 5)) < 0.5
    dense[..., 0, 0] = True
    dense[..., 2, :] = False  # a query block that selects nothing
    mask = BlockMask.from_dense(dense, q_bounds=np.asarray(qb), kv_bounds=np.asarray(kb))
    p = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=64)
    q, dout = rng.standard_normal((2, 1, hq, 300, 64))
    k, v = rng.standard_normal((2, 1, hkv, 300, 64))
    for block_m in (64, 128):
        got = tessera.emulate.run_backward(p, q, k, v, dout, block_m=block_m, atomic_dq=True)
        want = tessera.reference.attention_backward(q, k, v, dout, mask)
        assert got.pairs_outside == 0 and (got.dkv_writers == 1).all()
        assert (got.dq_writers[..., 128:150] == 0).all() and (got.dq_writers[..., :70] > 0).all()
        for g, w in zip((got.dq, got.dk, got.dv), want):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-10 * max(1.0, np.abs(w).max()))


@pytest.mark.parametrize("device", [False, True])
def test_dq_by_atomics_plans_no_query_major_queue(device, monkeypatch):
    """Without the query-major queue (dQ summed by the dK/dV kernel) only the key-major one is
    planned, on the host or by the planner kernels (its count kept on the device), and it is
    the full pair's; a plan keeps each, and a call without the query-major queue takes a kept
    full pair."""
    rng = np.random.default_rng(7)
    dense = rng.random((1, 2, 5, 5)) < 0.5
    dense[..., 0, 0] = True
    mask = BlockMask.from_dense(dense, q_bounds=np.asarray([0, 70, 128, 150, 256, 300]),
                                kv_bounds=np.asarray([0, 64, 100, 228, 237, 300]))
    shape = checked_shape(mask, 2, 2, 64, None, 1, "bfloat16", "bhld")
    full = backward_queues(mask, shape, block_m=64)
    if device:
        from tessera.cuda import loader
        from tessera.runtime import mapping

        monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
        monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    alone = backward_queues(mask, shape, block_m=64, query_major=False)
    assert alone.dq is None and alone.on_device == device
    assert alone.settled().dq is None
    assert _tasks_with_spans(alone.settled().dkdv) == _tasks_with_spans(full.dkdv)
    p = tessera.plan(mask, num_q_heads=2, head_dim=64)
    kept = p.backward_queues(64, query_major=False)
    assert kept.dq is None and p.backward_queues(64, query_major=False) is kept
    both = p.backward_queues(64)
    assert both.dq is not None and p.backward_queues(64, query_major=False) is both


@pytest.mark.parametrize("q_block,kv_block,rows", [(64, 64, 64), (128, 128, 128), (64, 128, 128),
                                                   (48, 64, 64)])
def test_hopper_tasks_take_64_rows_for_masks_of_small_blocks(q_block, kv_block, rows):
    """64-row Hopper backward tasks where both axes' median block is at most 64 tokens (a
    128-row task would hold two blocks whose spans differ), else 128; a plan and a one-off
    backward plan agree (no regime table in force)."""
    from tessera.runtime.backward import BackwardPlan

    rng = np.random.default_rng(q_block + kv_block)
    m = BlockMask.from_dense(rng.random((1, 8, 8)) < 0.5, q_bounds=np.arange(9) * q_block,
                             kv_bounds=np.arange(9) * kv_block)
    p = tessera.plan(m, num_q_heads=2, head_dim=64)
    shape = checked_shape(m, 2, 2, 64, 64, 1, "bfloat16", "bhld")
    tessera.use_table(None)
    try:
        assert p.backward_regime(90).block_m == rows
        assert BackwardPlan(m, shape).backward_regime(90).block_m == rows
        assert p.backward_regime(86).block_m == 64  # the portable kernels' rows
    finally:
        tessera.use_table("auto")


def test_the_hopper_backward_kernels_of_each_tile():
    """The default backward regime's kernels: 64- or 128-row Hopper tasks as the blocks ask;
    unless deterministic, dQ summed by atomics in 128-row tasks (one kernel) while 64-row tasks
    keep the two passes; the portable kernels keep theirs."""
    from tessera.cuda.variants import Variant
    from tessera.runtime.regime.backward import default_backward_regime

    for d in (64, 96, 128):
        for det in (True, False):
            for rows in (64, 128):
                r = default_backward_regime(90, rows, rows, deterministic=det)
                got = [v for v in r.kernels(d, True, 90) if v]
                atomic = not det and rows == 128
                assert r.deterministic == (not atomic)
                assert [v.macro("BM") for v in got] == [rows] * (1 if atomic else 2)
                assert [bool(dict(v.macros).get("ATOMIC_DQ")) for v in got][0] == atomic
                assert all(v.macro("STAGES") == (2 if rows == 64 and d == 128 else 3)
                           for v in got)
    portable = default_backward_regime(80, 128, 128).kernels(128, True, 80)
    assert [v.macro("BM") for v in portable] == [64, 64]
    with pytest.raises(ValueError, match="block_m must be 64 or 128"):
        Variant.bwd_sm90("bsa_bwd_dq_sm90", head_dim=64, bf16=True, block_m=192)
    for d in (64, 128):
        with pytest.raises(ValueError, match="128-row tasks"):
            Variant.bwd_sm90("bsa_bwd_dkdv_sm90", head_dim=d, bf16=True, block_m=64,
                             atomic_dq=True)


@pytest.mark.parametrize("name", ["wan-random-10", "cogvideox-random-10-text", "wan-radial",
                                  "wan-sliding-tile"])
def test_key_major_tasks_of_model_masks_stay_within_an_sms_share(name):
    """Why a heavy key column is not split: on model-shaped masks (12 or 48 heads, text keys
    every query selects, a sink frame) the longest key-major task holds at most a fifth of one
    SM's share of the chunks (132 SMs), so the longest-first order leaves no tail it would cut
    (docs/decisions.md, Backward)."""
    from tessera.families.radial_decay import radial
    from tessera.families.random_masks import random_blocks
    from tessera.families.tile_windows import sliding_tile

    mask, heads, d = {
        "wan-random-10": lambda: (random_blocks(12, 32760, 128, 0.1).mask, 12, 128),
        "cogvideox-random-10-text": lambda: (random_blocks(48, 17776, 128, 0.1,
                                                           text_tokens=226).mask, 48, 64),
        "wan-radial": lambda: (radial((21, 30, 52), 128).mask, 12, 128),
        "wan-sliding-tile": lambda: (sliding_tile((21, 30, 52)).mask, 12, 128),
    }[name]()
    shape = checked_shape(mask, heads, heads, d, None, 1, "bfloat16", "bhld")
    bq = backward_queues(mask, shape, block_m=128, block_n=(64, 64), query_major=False)
    tasks, spans = bq.dkdv.tasks, bq.dkdv.spans
    chunks = -(-(spans[:, Span.K_END] - spans[:, Span.K_START]) // 64)
    per_task = np.array([chunks[a:b].sum() for a, b in
                         zip(tasks[:, Task.SPAN_BEGIN], tasks[:, Task.SPAN_END])])
    assert per_task.max() <= 0.2 * per_task.sum() / 132, (per_task.max(), per_task.sum())
