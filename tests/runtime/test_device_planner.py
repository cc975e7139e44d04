"""CPU tests of the device planners (tessera.runtime.device_planner and the device paths of
tessera.runtime.mapping), with NumPy stand-ins for the planner kernels: they must give what the
general host planner gives."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
import tessera.cuda.device
import tessera.runtime.planners
import tessera.runtime.regime.features
import tessera.runtime.regime.selection
import tessera.runtime.regime.slots
from tessera import BlockMask, PlanMode, Regime
from tests.runtime.runtime_helpers import (
    PLANNER_STAND_INS,
    TILE_128x64,
    _np_plan_row_stats,
    _np_plan_write_spans,
    assert_launch_order,
    assert_same_plan,
)


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
            mp.setattr(tessera.runtime.planners, "plan_on_device",
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
    """plan(mode=PlanMode.CAPTURE) -- what a request captured into a CUDA graph takes: a regime
    chosen by the geometry alone (no table lookup, no align_pays estimate) made never to split or
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
        tessera.plan(mask, mode=PlanMode.CAPTURE, **kw)  # a host mask: the general planner
    with monkeypatch.context() as mp:
        mp.setattr(mapping, "use_device_planner", lambda xp: True)
        reads = []
        mp.setattr(device_planner, "to_numpy", lambda a: reads.append(1) or np.asarray(a))
        got = tessera.plan(mask, mode=PlanMode.CAPTURE, **kw)
        assert got.sync_free and got.replannable and not reads and not read_selection
        assert got.regime.split_ratio == NEVER_SPLIT_RATIO and got.regime.combine_threshold == 0
        # The heuristic on its own would split here (no GPU: its slots are unknown).
        assert tessera.plan(mask, **kw).regime.split_ratio < NEVER_SPLIT_RATIO
        launched.clear()
        for bad in (TILE_128x64.with_(combine_threshold=0.0, split_ratio=2.0),
                    TILE_128x64.with_(split_ratio=1e9, combine_threshold=0.5)):
            with pytest.raises(ValueError, match="regime .* may split tasks or merge rows"):
                tessera.plan(mask, mode=PlanMode.CAPTURE, regime=bad, **kw)
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
        heuristic = tessera.plan(ragged, mode=PlanMode.CAPTURE, **kw90)  # nothing read before
        assert heuristic.sync_free and not read_selection and not heuristic.regime.align_tiles
        mp.setattr(tessera.runtime.regime.selection, "align_pays",
                   lambda *a, **k: read_selection.append("align") or True)
        eager = tessera.plan(ragged, **kw90)
        assert read_selection and eager.regime.align_tiles
        read_selection.clear()
        reads.clear()
        # The last selection that read a mask of this geometry (the warm-up before a capture).
        captured = tessera.plan(ragged, mode=PlanMode.CAPTURE, **kw90)
        assert captured.sync_free and not read_selection and not reads
        assert captured.regime == eager.regime.with_(split_ratio=NEVER_SPLIT_RATIO)
        mp.setattr(device_planner, "REQUIRED_SYNC_FREE_WORKSPACE_LIMIT", 1000)
        launched.clear()
        with pytest.raises(ValueError, match="plan buffers would take"):
            tessera.plan(mask, mode=PlanMode.CAPTURE, **kw)
        assert not launched
    assert_same_plan(got, tessera.plan(mask, regime=got.regime, **kw))


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


def test_a_request_leaves_a_device_queue_whole(monkeypatch):
    """A request (``mode=PlanMode.REQUEST``) of a selected regime leaves the device planner's
    synchronized queue whole where a plan made directly fills its last wave: its shape never
    splits heavy tasks (16+ tasks a slot), so the regime keeps its split ratio, and the cut
    would copy the queue back and sort it on every request. A host mask's request, whose queue
    is on the host already, still fills it."""
    from tessera.cuda import loader
    from tessera.runtime import device_planner, mapping
    from tessera.runtime.tasks import NEVER_SPLIT_RATIO

    monkeypatch.setattr(tessera.cuda.device, "device_arch", lambda: 90)
    monkeypatch.setattr(tessera.cuda.device, "device_sm_count", lambda: 8)
    monkeypatch.setattr(tessera.runtime.regime.slots, "_device_tasks_in_flight",
                        lambda *args: 8)
    dense = np.ones((2, 2, 33, 40), bool)  # 132 equal tasks on 8 slots: 16 waves and 4 over
    mask = BlockMask.from_dense(dense, block_size=128, seq_len_q=33 * 128 - 7,
                                seq_len_kv=40 * 128 - 20)
    kw = dict(num_q_heads=2, head_dim=128, batch=2, arch=90)
    host = tessera.plan(mask, mode=PlanMode.REQUEST, **kw)
    assert host.regime.split_ratio < NEVER_SPLIT_RATIO and host.queue.num_slots == 8
    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    monkeypatch.setattr(device_planner, "SYNC_FREE_WORKSPACE_LIMIT", 0)  # the one-sync path
    made = tessera.plan(mask, **kw)
    assert made.queue.num_slots == 8 and made.queue.tasks.shape[0] == 136
    request = tessera.plan(mask, mode=PlanMode.REQUEST, **kw)
    assert request.regime.split_ratio < NEVER_SPLIT_RATIO and not request.sync_free
    assert request.queue.num_slots == 0 and request.queue.tasks.shape[0] == 132
