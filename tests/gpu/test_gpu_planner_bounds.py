"""GPU: the planner kernels stay within the bounds their first pass counted when a mask's rows
read differently between passes (memory written while it is planned), and the attention kernels
then run the queue they get without a fault; device CSR masks are checked when made. Run under
compute-sanitizer (memcheck) these show that nothing reads or writes out of bounds."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.cuda import loader
from tessera.cuda.variants import Variant
from tessera.runtime import device_planner
from tessera.runtime.mode import PlanMode
from tessera.runtime.queue import Span, Task

pytestmark = pytest.mark.gpu

H, D = 2, 64


def _masks(xp, ragged: bool):
    """Two masks of one geometry: a sparse one (few spans a row) and a comb (every other key
    block selected: the most spans a row can have)."""
    rng = np.random.default_rng(7)
    nq, nk = 10, 14
    if ragged:
        geo = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(30, 150, nq))],
                   kv_bounds=np.r_[0, np.cumsum(rng.integers(30, 150, nk))])
    else:
        geo = dict(block_size=64)
    sparse = rng.random((H, nq, nk)) < 0.1
    comb = np.zeros((H, nq, nk), bool)
    comb[..., ::2] = True
    return (tessera.BlockMask.from_dense(xp.asarray(sparse), **geo),
            tessera.BlockMask.from_dense(xp.asarray(comb), **geo))


def _check_queue(p, lq: int, lkv: int) -> None:
    """Every task's spans are rows of the span list; every span is a non-empty key range of
    the sequence with a row range inside it."""
    spans, tasks = p.queue.spans.get(), p.queue.tasks.get()
    assert len(tasks)
    sb, se = tasks[:, Task.SPAN_BEGIN], tasks[:, Task.SPAN_END]
    assert (0 <= sb).all() and (sb <= se).all() and (se <= len(spans)).all()
    k0, k1 = spans[:, Span.K_START], spans[:, Span.K_END]
    r0, r1 = spans[:, Span.R_START], spans[:, Span.R_END]
    assert (0 <= k0).all() and (k0 < k1).all() and (k1 <= lkv).all()
    assert (0 <= r0).all() and (r0 <= r1).all() and (r1 <= lq).all()
    assert (0 <= tasks[:, Task.Q_START]).all() and (tasks[:, Task.Q_END] <= lq).all()


def _run(p, mask) -> None:
    """Runs the plan and waits for it: a fault raises here."""
    import cupy as cp

    q, k, v = (cp.random.default_rng(i).standard_normal(
        (1, H, mask.seq_len_q if i == 0 else mask.seq_len_kv, D), dtype=cp.float32
    ).astype(cp.float16) for i in range(3))
    p.run(q, k, v)
    cp.cuda.Device().synchronize()


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("first, then", [("sparse", "comb"), ("comb", "sparse")])
def test_sync_free_planner_keeps_its_first_count(first, then, aligned):
    """A sync-free plan whose span-writing launches read another mask than its counting ones:
    more spans found than counted are dropped, fewer are padded with spans of no rows, so the
    queue stays what the counts sized (before this, spans ran past their rows and the buffer,
    and the attention kernel read what nobody wrote)."""
    import cupy as cp

    masks = dict(zip(("sparse", "comb"), _masks(cp, ragged=aligned)))
    regime = tessera.plan(masks[first], num_q_heads=H, head_dim=D, dtype="float16",
                          mode=PlanMode.REQUEST).regime
    if aligned:  # (a packed pick unpacked takes the default split ratio: never split here)
        regime = regime.with_(align_tiles=True, pack_keys=False, split_ratio=1e9)
    p = tessera.plan(masks[first], num_q_heads=H, head_dim=D, dtype="float16", regime=regime,
                     mode=PlanMode.CAPTURE)
    assert p.device_plan is not None and p.regime.align_tiles == aligned
    rows = {n: cp.ascontiguousarray(m.dense_rows).view(np.uint8) for n, m in masks.items()}
    launches = p.device_plan.relaunch.launches
    for i, launch in enumerate(launches):  # counts (and the scan) of one, spans of the other
        launch(rows[first] if i < 2 else rows[then])
    p._exact = p.device_plan.settle
    _check_queue(p, masks[first].seq_len_q, masks[first].seq_len_kv)
    _run(p, masks[first])


def test_one_sync_planner_keeps_its_first_count(monkeypatch):
    """The planner path that reads the totals back and sizes the arrays exactly: its span
    writer reading a mask with more spans than counted writes none past the arrays."""
    import cupy as cp

    sparse, comb = _masks(cp, ragged=False)
    writer = loader.load_kernel(Variant("plan.cu", "plan_write_runs"))
    call = device_planner._Launch.__call__

    def swapped(self, dense):
        return call(self, cp.ascontiguousarray(comb.dense_rows).view(np.uint8)
                    if self.fn is writer else dense)

    monkeypatch.setattr(device_planner._Launch, "__call__", swapped)
    monkeypatch.setattr(device_planner, "SYNC_FREE_WORKSPACE_LIMIT", 0)  # the one-sync path
    p = tessera.plan(sparse, num_q_heads=H, head_dim=D, dtype="float16", mode=PlanMode.REQUEST)
    assert p.device_plan is None
    _check_queue(p, sparse.seq_len_q, sparse.seq_len_kv)
    _run(p, sparse)


@pytest.mark.parametrize("indptr, indices, words", [
    ([0, 2, 3], [0, 9, 1], "indices must be key blocks"),
    ([0, 2, 3], [-4, 0, 1], "indices must be key blocks"),
    ([0, 2, 3], [1, 1, 0], "sorted and unique"),
    ([0, 3, 2], [0, 1, 2], "must not decrease"),
    ([0, 2, 5], [0, 1, 2], "must equal the number of indices"),
])
def test_device_csr_masks_are_checked_when_made(indptr, indices, words):
    """A device CSR selection given to the constructor is checked with one readback (the planner
    would otherwise scatter out-of-range blocks)."""
    import cupy as cp

    geo = tessera.BlockMask.from_dense(np.eye(2, 3, dtype=bool), block_size=64)
    with pytest.raises(ValueError, match=words):
        tessera.BlockMask(geo.q_bounds, geo.kv_bounds, cp.asarray(indptr, dtype=cp.int64),
                          cp.asarray(indices, dtype=cp.int32), (1, 1))


def test_an_unchecked_device_csr_mask_is_planned_within_bounds():
    """A device CSR mask made while a CUDA graph is captured is not checked (no readback): its
    dense rows are made with clamped indices, so planning and running it stay in bounds."""
    import cupy as cp

    geo = tessera.BlockMask.from_dense(np.eye(2, 3, dtype=bool), block_size=64)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        indptr = cp.asarray([0, 2, 3], dtype=cp.int64)
        indices = cp.asarray([-7, 40, 1], dtype=cp.int32)
        stream.begin_capture()
        try:
            bad = tessera.BlockMask(geo.q_bounds, geo.kv_bounds, indptr, indices, (1, 1))
        finally:
            stream.end_capture()
        dense = bad.to_dense()
    stream.synchronize()
    assert dense.shape == (1, 1, 2, 3)
    p = tessera.plan(bad, num_q_heads=1, head_dim=D, dtype="float16")
    q, kv = (cp.random.default_rng(0).standard_normal((1, 1, n, D), dtype=cp.float32).astype(
        cp.float16) for n in (128, 192))
    p.run(q, kv, kv)
    cp.cuda.Device().synchronize()
