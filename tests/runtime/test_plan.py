"""CPU tests of ``tessera.plan`` (tessera.runtime.plan): ``Plan.stats()``, argument checking and
edge cases, and splitting for the current GPU's slots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tessera
import tessera.cuda.device
import tessera.runtime.regime.slots
from tessera import BlockMask, Regime
from tessera.runtime.queue import Task, records
from tessera.runtime.tasks import NEVER_SPLIT_RATIO, whole_span_tasks
from tests.runtime.runtime_helpers import (
    PLANNER_STAND_INS,
    TILE_128x64,
    brute_useful_pairs,
    build_mask,
    check_emulation,
    check_queue,
    geometries,
    random_qkv,
)


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
    plan = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=64, batch=batch,
                        regime=TILE_128x64)
    s = plan.stats()
    assert s.useful_pairs == brute_useful_pairs(mask, batch, hq, hkv)
    assert s.wasted_ratio == 1.0
    assert s.computed_pairs == s.useful_pairs


def test_stats_small_blocks_count_padding():
    """16-token blocks alone in 128-row tiles: computed pairs count whole 16-row groups and
    64-key steps, so waste shows."""
    dense = np.eye(6, dtype=bool)[None]
    dense[0, 0, 0] = True
    mask = BlockMask.from_dense(dense, block_size=16)
    plan = tessera.plan(mask, num_q_heads=1, head_dim=64,
                        regime=TILE_128x64.with_(combine_threshold=0.0))
    s = plan.stats()
    assert s.useful_pairs == 6 * 16 * 16
    assert s.computed_pairs == 6 * 16 * 64  # one row group x one 64-key step per block
    assert s.wasted_ratio == 4.0


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


@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (3, 2, 5)])
def test_all_empty_mask(shape):
    """A mask that selects nothing is valid (every output 0, every lse -inf)."""
    dense = np.zeros(shape, dtype=bool)
    mask = BlockMask.from_dense(dense, block_size=64)
    hq = shape[0] if len(shape) == 3 else 1
    plan = tessera.plan(mask, num_q_heads=hq, head_dim=64)
    check_queue(plan)
    rng = np.random.default_rng(5)
    check_emulation(plan, mask, *random_qkv(rng, 1, hq, hq, mask.seq_len_q, mask.seq_len_kv),
                    None)


def test_one_token_sequences():
    mask = BlockMask.from_dense(np.ones((1, 1), bool), block_size=16, seq_len_q=1, seq_len_kv=1)
    plan = tessera.plan(mask, num_q_heads=1, head_dim=64)
    check_queue(plan)
    rng = np.random.default_rng(6)
    check_emulation(plan, mask, *random_qkv(rng, 1, 1, 1, 1, 1), None)


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
        assert ref.queue.num_slots == 0 and records(ref.queue.tasks, Task).cost.max() == 60
    assert seen and set(seen) == {(90, 7)}  # asked for this GPU's SMs, never for the host plan


# ---- masks that select every block: whole-span tasks ---------------------------------------
# sm90 producer regimes of the span-by-span walk: 64-, 128- and 192-row tiles, rings, the wide
# step, no GQA packing. (A dense mask's tasks all cost the same: none splits.)
WHOLE_SPAN_REGIMES = [
    Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
           combine_threshold=0.0, whole_spans=True),
    Regime(family="sm90", block_m=192, num_warps=16, block_n=128, stages=3,
           combine_threshold=0.0, whole_spans=True),
    Regime(family="sm90", block_m=64, num_warps=20, block_n=64, stages=3,
           combine_threshold=0.0, whole_spans=True),
    Regime(family="sm90", block_m=64, num_warps=8, block_n=128, stages=3,
           combine_threshold=0.0, whole_spans=True),
    Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
           combine_threshold=0.0, wide_steps=True, whole_spans=True, pack_gqa=False),
]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), regime=st.sampled_from(WHOLE_SPAN_REGIMES),
       shape=st.sampled_from([(1, 1, 1), (1, 4, 2), (2, 2, 2), (2, 8, 1)]))
def test_a_mask_selecting_every_block_plans_whole_span_tasks(data, regime, shape):
    """Regime.whole_spans rests on this: a mask that selects every block -- uniform, ragged or
    variable blocks, any constructor, per-head or broadcast, GQA packing -- plans
    tasks that are each one span over all their rows (the kernel's whole_span_task, mirrored by
    tasks.whole_span_tasks), and the plan computes the reference attention."""
    geo, n_q, n_kv = data.draw(geometries())
    batch, hq, hkv = shape
    n_mh = data.draw(st.sampled_from(sorted({1, hkv, hq})))
    mask = build_mask(data.draw, np.ones((batch, n_mh, n_q, n_kv), bool), geo, n_kv)
    plan = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=64, regime=regime)
    check_queue(plan)
    queue = plan.queue
    assert queue.tasks.shape[0] > 0
    assert whole_span_tasks(queue.tasks, queue.spans).all()
    if mask.seq_len_q * mask.seq_len_kv <= 200_000:
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        check_emulation(plan, mask, *random_qkv(rng, batch, hq, hkv, mask.seq_len_q,
                                                mask.seq_len_kv), None)


def test_a_dense_host_mask_takes_whole_spans_and_a_sparse_one_does_not():
    """The plan's pick (selection.whole_span_pick): a host mask that selects every block runs
    its selected sm90 regime with whole_spans at head dim 128, and says the mask decided it; one
    block left out, another family or head dim 64 keeps the regime as selected."""
    dense = np.ones((2, 6, 5), bool)
    mask = BlockMask.from_dense(dense, block_size=128, seq_len_kv=600)
    p = tessera.plan(mask, num_q_heads=2, head_dim=128, arch=90)
    assert p.regime.whole_spans and not p.regime_by_geometry
    assert whole_span_tasks(p.queue.tasks, p.queue.spans).all()
    assert not tessera.plan(mask, num_q_heads=2, head_dim=64, arch=90).regime.whole_spans
    dense[1, 3, 2] = False
    sparse = BlockMask.from_dense(dense, block_size=128, seq_len_kv=600)
    assert not tessera.plan(sparse, num_q_heads=2, head_dim=128, arch=90).regime.whole_spans
    assert not tessera.plan(mask, num_q_heads=2, head_dim=128, arch=80).regime.whole_spans
    given_regime = tessera.plan(mask, num_q_heads=2, head_dim=128, regime=WHOLE_SPAN_REGIMES[0])
    assert given_regime.regime_by_geometry  # a regime given holds for the geometry's masks
    with pytest.raises(ValueError, match="runs masks that select every block only; this one "
                                         "selects 59 of 60"):
        tessera.plan(sparse, num_q_heads=2, head_dim=128, regime=WHOLE_SPAN_REGIMES[0])


@pytest.mark.parametrize("regime,d", [(WHOLE_SPAN_REGIMES[0], 128), (WHOLE_SPAN_REGIMES[1], 64),
                                       (TILE_128x64, 64)])
def test_equal_tasks_fill_the_last_wave(monkeypatch, regime, d):
    """Planning for a GPU of 8 task slots, 2 x 2 heads of 5 equal tiles (20 tasks: two full
    waves and 4 over) cut their last 4 tasks into 2 parts each that the combine step merges
    (tasks.fill_last_wave); every part keeps its tile's rows (a whole span, where the regime
    walks them so), and the plan computes the reference. One block left out makes the tasks
    unequal; a never-split regime and a portable plan (no slots known) keep every task whole."""
    monkeypatch.setattr(tessera.cuda.device, "device_arch", lambda: 90)
    monkeypatch.setattr(tessera.cuda.device, "device_sm_count", lambda: 8)
    monkeypatch.setattr(tessera.runtime.regime.slots, "_device_tasks_in_flight",
                        lambda *args: 8)
    dense = np.ones((2, 2, 5, 9), bool)
    mask = BlockMask.from_dense(dense, block_size=(regime.block_m, 64),
                                seq_len_q=5 * regime.block_m - 7, seq_len_kv=9 * 64 - 20)
    r = regime.with_(min_split_chunks=2)
    p = tessera.plan(mask, num_q_heads=2, head_dim=d, batch=2, regime=r, arch=90)
    check_queue(p)
    t = records(p.queue.tasks, Task)
    assert p.queue.combine.shape[0] == 4 and p.queue.num_slots == 8
    assert (t.slot[:16] == -1).all() and (t.slot[16:] >= 0).all() and len(t) == 24
    assert t.cost[:16].tolist() == [p.tiles.chunks[0]] * 16
    assert t.cost[16:].sum() == 4 * p.tiles.chunks[0]
    if r.whole_spans:
        assert whole_span_tasks(p.queue.tasks, p.queue.spans).all()
    rng = np.random.default_rng(11)
    check_emulation(p, mask, *random_qkv(rng, 2, 2, 2, mask.seq_len_q, mask.seq_len_kv, d), None)
    dense[1, 0, 2, :5] = False  # one tile with fewer key chunks
    uneven = BlockMask.from_dense(dense, block_size=(regime.block_m, 64),
                                  seq_len_q=mask.seq_len_q, seq_len_kv=mask.seq_len_kv)
    assert tessera.plan(uneven, num_q_heads=2, head_dim=d, batch=2,
                        regime=r.with_(whole_spans=False), arch=90).queue.num_slots == 0
    never = r.with_(split_ratio=NEVER_SPLIT_RATIO)
    assert tessera.plan(mask, num_q_heads=2, head_dim=d, batch=2, regime=never,
                        arch=90).queue.num_slots == 0
    assert tessera.plan(mask, num_q_heads=2, head_dim=d, batch=2, regime=r).queue.num_slots == 0


# ---- arguments refused by name --------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [7, 8, 80, 256])
def test_unsupported_head_dims_refused(head_dim):
    mask = BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)
    with pytest.raises(ValueError, match=r"head_dim .* not supported \(supported: \(64, 96, 128\)"):
        tessera.plan(mask, num_q_heads=1, head_dim=head_dim)


def test_head_dim_v_must_equal_head_dim():
    """The kernels write head_dim values per row: a smaller head_dim_v wrote out of bounds."""
    mask = BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)
    with pytest.raises(ValueError, match="head_dim_v must equal head_dim"):
        tessera.plan(mask, num_q_heads=1, head_dim=128, head_dim_v=64)
    assert tessera.plan(mask, num_q_heads=1, head_dim=96, head_dim_v=96).head_dim_v == 96


@pytest.mark.parametrize("arch", ["sm90", "sm_90", 9.0, 12345, 75, True, "90"])
def test_bad_arch_refused(arch):
    mask = BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)
    with pytest.raises(ValueError, match="arch must be None or a compute capability int"):
        tessera.plan(mask, num_q_heads=1, head_dim=64, arch=arch)


@pytest.mark.parametrize("arch, family", [(80, "sm80"), (86, "sm80"), (90, "sm90"),
                                          (100, "sm80"), (None, "sm80")])
def test_supported_archs_planned(arch, family):
    mask = BlockMask.from_dense(np.ones((2, 2), bool), block_size=128)
    assert tessera.plan(mask, num_q_heads=1, head_dim=64, arch=arch).regime.family == family
