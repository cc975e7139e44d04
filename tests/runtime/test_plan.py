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
from tessera import BlockMask
from tessera.runtime.queue import Task, records
from tests.runtime.runtime_helpers import (
    PLANNER_STAND_INS,
    TILE_128x64,
    brute_useful_pairs,
    check_emulation,
    check_queue,
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
