"""CPU tests of regime selection (tessera.runtime.regime.selection): tables in ``tessera.plan``
with their fallbacks, the env var and default location, warnings and remembered selections."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import tessera
from tessera import BlockMask
from tessera.cuda import device as D
from tessera.runtime import regime as R
from tessera.runtime.regime import Regime, RegimeTable, default_regime, mask_features
from tessera.runtime.regime import features as F
from tessera.runtime.regime import selection as S
from tests.runtime.regime.regime_helpers import (
    _write,
    clean_selection,  # noqa: F401 (autouse fixture)
    entry,
    planned_heuristic,
)


def wan_like_mask() -> BlockMask:
    dense = np.random.default_rng(0).random((2, 16, 16)) < 0.1
    return BlockMask.from_dense(dense, block_size=128, seq_len_q=2000, seq_len_kv=2000)


# What the test tables say for sm_90 (a Hopper-family regime no heuristic picks) and for sm_80.
PICK = Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=3, split_ratio=2.0,
              combine_threshold=0.0)


PICK80 = Regime(block_m=64, block_n=32, split_ratio=2.0, combine_threshold=0.0)


def table_for(mask: BlockMask, *, arch=90, gpu="NVIDIA H200", regime=None) -> RegimeTable:
    f = mask_features(mask, head_dim=128, dtype="bfloat16", arch=arch, num_q_heads=2, batch=1)
    regime = regime or (PICK if arch == 90 else PICK80)
    return RegimeTable([entry(f, regime)], {"gpu": gpu, "arch": arch, "date": "2025-01-02"})


def test_table_without_the_hopper_family_is_not_used_on_hopper():
    """A table profiled before the sm90 family existed would steer sm_90 plans to the portable
    kernel: it warns once and the heuristic (the sm90 default) plans instead."""
    m = wan_like_mask()
    R.use_table(table_for(m, regime=PICK80))
    with pytest.warns(RuntimeWarning, match="no sm90 regimes"):
        assert plan90(m).regime == planned_heuristic(m)
    assert planned_heuristic(m).family == "sm90"
    assert table_for(m).families == {"sm90"}


def plan90(mask, **kw):
    kw = {"num_q_heads": 2, "head_dim": 128, "arch": 90, **kw}
    return tessera.plan(mask, **kw)


def test_plan_uses_table_and_falls_back():
    m = wan_like_mask()
    assert plan90(m).regime == planned_heuristic(m)  # no table anywhere
    assert R.use_table(table_for(m)) is not None
    assert plan90(m).regime == PICK
    assert plan90(m, regime=Regime()).regime == Regime()  # an explicit regime wins
    assert plan90(m, head_dim=64).regime == planned_heuristic(m, head_dim=64)  # no d64 entries
    assert plan90(m, dtype="float16").regime == planned_heuristic(m)
    assert tessera.plan(m, num_q_heads=2, head_dim=128).regime == planned_heuristic(m, None)  # CPU
    # Nearest entry: more heads are another batch x heads bucket of the same group.
    assert plan90(m, batch=20).regime == PICK
    R.use_table(None)
    assert plan90(m).regime == planned_heuristic(m)


def test_features_measured_only_when_the_table_could_answer(monkeypatch):
    m = wan_like_mask()
    R.use_table(table_for(m))
    calls = []
    real = F.mask_features
    monkeypatch.setattr(F, "mask_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert plan90(m, dtype="float16").regime == planned_heuristic(m)
    assert plan90(m, head_dim=64).regime == planned_heuristic(m, head_dim=64)
    assert calls == []
    # Nor a geometry the table has no evidence for (variable blocks against uniform entries).
    qb = np.r_[0, np.cumsum(np.random.default_rng(5).integers(60, 200, 16))]
    variable = BlockMask.from_dense(np.random.default_rng(6).random((2, 16, 16)) < 0.2,
                                    q_bounds=qb, kv_bounds=qb)
    assert plan90(variable).regime == planned_heuristic(variable) and calls == []
    assert plan90(m).regime == PICK and calls == [1]
    assert R.active_table(90).covers(90, 128, "bfloat16")
    assert not R.active_table(90).covers(90, 128, "float16")


def test_table_looked_up_only_where_tasks_may_split(monkeypatch):
    """Planning for this GPU, a shape with 16+ tasks per task slot keeps the heuristic without
    measuring the mask (its plan needs no synchronization, and at the models' head counts the
    H200 table's picks equal the heuristic's); a GPU with more slots than that, or a portable
    plan, looks the table up."""
    m = wan_like_mask()
    R.use_table(table_for(m))
    measured = []
    real = F.mask_features
    monkeypatch.setattr(F, "mask_features", lambda *a, **k: measured.append(1) or real(*a, **k))
    monkeypatch.setattr(D, "device_arch", lambda: 90)
    for sms, looked_up in ((1, False), (10_000, True)):
        monkeypatch.setattr(D, "device_sm_count", lambda sms=sms: sms)
        measured.clear()
        got = R.select_regime(m, arch=90, head_dim=128, dtype="bfloat16", num_q_heads=2,
                              batch=1)
        assert got == (PICK if looked_up else planned_heuristic(m)) and bool(measured) == looked_up
    monkeypatch.setattr(D, "device_arch", lambda: None)  # a portable plan: the split rule
    assert R.select_regime(m, arch=90, head_dim=128, dtype="bfloat16", num_q_heads=2,
                           batch=1) == PICK


def test_env_var_and_default_location(tmp_path, monkeypatch):
    m = wan_like_mask()
    path = tmp_path / "mine.json"
    table_for(m).save(path)
    monkeypatch.setenv(R.ENV_TABLE, str(path))
    assert plan90(m).regime == PICK
    assert "mine.json" in R.describe_table_in_use(90)
    monkeypatch.delenv(R.ENV_TABLE)
    assert plan90(m).regime == planned_heuristic(m)  # no GPU name: no default table
    # tables/<gpu-slug>.json beside the package, for the GPU this process runs on, unless
    # $TESSERA_REGIME_TABLE=none.
    monkeypatch.setattr(S, "TABLES_DIR", tmp_path)
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA H200")
    own = PICK.with_(block_m=128, num_warps=8)
    table_for(m, regime=own).save(tmp_path / "nvidia-h200.json")
    assert plan90(m).regime == own
    assert "nvidia-h200.json" in R.describe_table_in_use(90)
    monkeypatch.setenv(R.ENV_TABLE, "none")
    assert plan90(m).regime == planned_heuristic(m)
    assert "TESSERA_REGIME_TABLE=none" in R.describe_table_in_use(90)
    monkeypatch.setenv(R.ENV_TABLE, "auto")
    assert plan90(m).regime == own
    assert "nvidia-h200.json" in R.describe_table_in_use(90)
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA A100-SXM4-80GB")
    assert plan90(m).regime == planned_heuristic(m)  # no table for that GPU: quietly the heuristic
    assert "no table at" in R.describe_table_in_use(90)
    # use_table overrides the environment; use_table(None) means the heuristic.
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setenv(R.ENV_TABLE, str(path))
    R.use_table(tmp_path / "nvidia-h200.json")
    assert plan90(m).regime == own
    R.use_table(None)
    assert plan90(m).regime == planned_heuristic(m)
    assert R.describe_table_in_use(90) == "none: heuristic (use_table(None))"


@pytest.mark.parametrize("content", ["{oops", json.dumps({"format": "tessera-regime-table",
                                                          "version": 7, "entries": []})])
def test_corrupt_table_warns_once_and_plans_with_heuristic(tmp_path, monkeypatch, content):
    m = wan_like_mask()
    bad = _write(tmp_path, content, "bad.json")
    monkeypatch.setenv(R.ENV_TABLE, str(bad))
    with pytest.warns(RuntimeWarning, match="unusable.*bad.json"):
        p = plan90(m)
    assert p.regime == planned_heuristic(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second plan does not warn again
        assert plan90(m).regime == planned_heuristic(m)
    assert "none: heuristic" in R.describe_table_in_use(90)
    with pytest.raises(ValueError, match="bad.json"):
        R.use_table(bad)  # an explicit choice fails loudly


def test_missing_env_table_warns(tmp_path, monkeypatch):
    monkeypatch.setenv(R.ENV_TABLE, str(tmp_path / "nope.json"))
    with pytest.warns(RuntimeWarning, match="does not exist"):
        assert plan90(wan_like_mask()).regime == planned_heuristic(wan_like_mask())


def test_other_gpu_table_warns_and_falls_back(monkeypatch):
    m = wan_like_mask()
    R.use_table(table_for(m, arch=80, gpu="NVIDIA A100-SXM4-80GB"))
    with pytest.warns(RuntimeWarning, match="profiled on sm_80.*sm_90"):
        assert plan90(m).regime == planned_heuristic(m)
    # Same architecture, another GPU model (known only where a GPU is present).
    R.use_table(table_for(m, gpu="NVIDIA H100 80GB HBM3"))
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA H200")
    with pytest.warns(RuntimeWarning, match="profiled on NVIDIA H100 80GB HBM3"):
        assert plan90(m).regime == planned_heuristic(m)
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    R.use_table(table_for(m, gpu="NVIDIA H100 80GB HBM3"))
    assert plan90(m).regime == PICK


def test_info_shows_table_in_use(capsys):
    from tessera.tools.cli import main

    assert main(["info"]) == 0
    assert "Regime table in use: none: heuristic" in capsys.readouterr().out
    R.use_table(table_for(wan_like_mask()))
    line = R.describe_table_in_use(90)
    assert "NVIDIA H200" in line and "2025-01-02" in line and "1 entries" in line


def test_selection_remembered_only_where_the_geometry_decides(monkeypatch):
    """select_regime answers a geometry it has seen without deciding again -- unless the answer
    read the selection (align_pays on ragged query blocks), or the shapes, GPU or table differ."""
    from tessera.mask import BlockMask

    decided = []
    real = S._select_regime
    monkeypatch.setattr(S, "_select_regime", lambda *a: decided.append(1) or real(*a))
    monkeypatch.setattr(S, "_selections", {})
    rng = np.random.default_rng(3)

    def pick(m, arch=90, hq=2):
        return R.select_regime(m, arch=arch, head_dim=128, dtype="bfloat16", num_q_heads=hq,
                               batch=1)

    uniform = [BlockMask.from_dense(rng.random((2, 8, 8)) < p, block_size=128) for p in (.2, .9)]
    first = pick(uniform[0])
    assert pick(uniform[1]) is first and len(decided) == 1  # same geometry, other selection
    pick(uniform[0], hq=4)
    pick(uniform[0], arch=80)
    assert len(decided) == 3
    monkeypatch.setattr(D, "device_sm_count", lambda: 7)  # another GPU's task slots
    pick(uniform[0])
    assert len(decided) == 4
    generation = R.selection_generation()
    R.use_table(None)  # a table change forgets every answer
    try:
        pick(uniform[0])
        assert len(decided) == 5 and R.selection_generation() != generation
    finally:
        R.use_table("auto")
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, 30))]
    ragged = [BlockMask.from_dense(rng.random((2, 30, 30)) < p, q_bounds=qb, kv_bounds=qb)
              for p in (0.3, 0.95)]
    assert not pick(ragged[0]).align_tiles and pick(ragged[1]).align_tiles
    assert len(decided) == 7 and not pick(ragged[0]).align_tiles and len(decided) == 8
    # selected_regime says which answers every mask of the geometry gets (plans record it:
    # tessera.attention replans only those for later masks).
    kw = dict(arch=90, head_dim=128, dtype="bfloat16", num_q_heads=2, batch=1)
    assert R.selected_regime(uniform[1], **kw) == (first, True)
    assert R.selected_regime(ragged[1], **kw)[1] is False


def test_table_still_answers_masks_the_heuristic_would_pack():
    """A ragged key geometry makes the heuristic pack its keys (never split), but whether the
    table is asked is decided on the unpacked form: masks with few tasks per slot keep the
    table's pick."""
    rng = np.random.default_rng(3)
    kb = np.r_[0, np.cumsum(rng.integers(20, 120, 28))]
    m = BlockMask.from_dense(rng.random((2, 32, kb.size - 1)) < 0.3, block_size=None,
                             q_bounds=np.arange(0, 32 * 64 + 1, 64), kv_bounds=kb)
    assert planned_heuristic(m).pack_keys  # 64-token query blocks, keys ragged against 64-key steps
    try:
        assert R.use_table(table_for(m)) is not None
        # The table's pick, with the key walk the mask's estimate says pays (packed_pick).
        assert R.pack_pays(m, 64, 64)
        assert (plan90(m).regime == PICK.with_(pack_keys=True, split_ratio=4.0)
                != planned_heuristic(m))
    finally:
        R.use_table(None)
    assert plan90(m).regime == planned_heuristic(m)


def test_a_tables_plain_128_row_pick_takes_aligned_tiles_where_they_pay(monkeypatch):
    """The features cannot tell semantic clusters from random variable blocks: a table's plain
    128-row sm90 pick takes aligned tiles where align_pays says so of the mask; other picks
    (64-row, packed, aligned already) are kept without the estimate being read."""
    rng = np.random.default_rng(1)
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, 60))]
    clustered = BlockMask.from_dense(rng.random((2, 60, 60)) < 0.95, q_bounds=qb, kv_bounds=qb)
    scattered = BlockMask.from_dense(rng.random((2, 60, 60)) < 0.3, q_bounds=qb, kv_bounds=qb)
    assert R.align_pays(clustered, 128) and not R.align_pays(scattered, 128)
    plain = R.heuristic.SM90_ROWS128.with_(split_ratio=2.0)
    assert S.aligned_pick(plain, True) == plain.with_(align_tiles=True)
    assert S.aligned_pick(plain, False) == plain
    # The scattered blocks' keys are ragged against 128-key steps: that pick packs them
    # (packed_pick), the clusters' aligned tiles keep theirs.
    assert R.pack_pays(scattered, 128, 128)
    for m, want in ((clustered, plain.with_(align_tiles=True)),
                    (scattered, plain.with_(pack_keys=True, split_ratio=4.0))):
        R.use_table(table_for(m, regime=plain))
        assert plan90(m).regime == want
    estimated = []
    monkeypatch.setattr(S, "align_pays", lambda *a: estimated.append(1) or True)
    for pick in (PICK, plain.with_(pack_keys=True, split_ratio=4.0),
                 plain.with_(align_tiles=True)):
        # pack_pays keeps each pick's walk here: only whether align_pays is read is asked.
        monkeypatch.setattr(S, "pack_pays", lambda *a, keep=pick.pack_keys: keep)
        R.use_table(table_for(clustered, regime=pick))
        assert plan90(clustered).regime == pick
    assert estimated == []
    R.use_table(None)


def test_a_tables_sm90_pick_takes_the_key_walk_pack_pays_says_pays(monkeypatch):
    """The features cannot see how many chunks a span-by-span walk wastes on short ragged key
    blocks: a table's sm90 pick packs its keys where pack_pays says so of the mask (taking the
    default split policy, the packed candidates' name) and walks span by span where it does not;
    the estimate is read only for ragged key blocks, and aligned, merging and 192-key-step picks
    keep their walk."""
    rng = np.random.default_rng(4)
    kb = np.r_[0, np.cumsum(rng.integers(16, 96, 40))]
    qb = np.arange(0, 48 * 64 + 1, 64)
    ragged = BlockMask.from_dense(rng.random((2, 48, 40)) < 0.15, q_bounds=qb, kv_bounds=kb)
    uniform = wan_like_mask()
    assert R.pack_pays(ragged, 128, 64) and not R.pack_pays(uniform, 128, 128)
    plain = R.heuristic.SM90_PACKED_D64.with_(pack_keys=False, split_ratio=2.0)
    packed = plain.with_(pack_keys=True, split_ratio=4.0)
    assert S.packed_pick(plain, True) == packed and S.packed_pick(plain, False) == plain
    assert S.packed_pick(packed, False) == packed.with_(pack_keys=False)
    for kept in (PICK80, plain.with_(combine_threshold=0.3),
                 R.heuristic.SM90_ROWS128.with_(align_tiles=True),
                 R.heuristic.SM90_ROWS128.with_(block_n=128, wide_steps=True)):
        assert S.packed_pick(kept, True) == kept == S.packed_pick(kept, False)
    R.use_table(table_for(ragged, regime=plain))
    assert plan90(ragged).regime == packed
    R.use_table(table_for(ragged, regime=packed))
    assert plan90(ragged).regime == packed
    # A uniform geometry: pack_pays answers no from the bounds alone, and a packed pick walks
    # span by span.
    reads = []
    real = R.heuristic.mapping.key_walk_chunks
    monkeypatch.setattr(R.heuristic.mapping, "key_walk_chunks",
                        lambda *a: reads.append(1) or real(*a))
    upick = R.heuristic.SM90_ROWS128.with_(pack_keys=True)
    R.use_table(table_for(uniform, regime=upick))
    assert plan90(uniform).regime == upick.with_(pack_keys=False)
    assert reads == []
    R.use_table(table_for(ragged, regime=plain))
    assert plan90(ragged).regime == packed and reads == [1]
    R.use_table(None)


def test_heuristic_choice_is_the_selection_without_a_table():
    """heuristic_choice (what the profiler calls the default) is what plans take with no table:
    the heuristic with aligned tiles, packed keys or 192-row tiles where those pay, and says
    whether it read the mask for it."""
    rng = np.random.default_rng(2)
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, 60))]
    clustered = BlockMask.from_dense(rng.random((2, 60, 60)) < 0.95, q_bounds=qb, kv_bounds=qb)
    uniform = wan_like_mask()
    big = np.arange(0, 9 * 384 + 1, 384)
    sta = BlockMask.from_dense(rng.random((2, 9, 9)) < 0.5, q_bounds=big, kv_bounds=big)
    for m, d, want, read in ((clustered, 128, R.heuristic.SM90_ROWS128.with_(align_tiles=True),
                              True),
                             (uniform, 128, planned_heuristic(uniform), False),
                             (sta, 64, R.heuristic.SM90_ROWS192_D64, False)):
        assert S.heuristic_choice(m, 90, d) == (want, read)
        assert plan90(m, head_dim=d).regime == want
    assert S.heuristic_choice(clustered, 80, 128) == (default_regime(80, 128, 150.0), False)


def test_a_dense_layer_at_head_dim_64_takes_192_row_tiles():
    """A host mask selecting every block (a dense layer) fills 192-row tiles at head dim 64 on
    sm_90 whatever its block size (at head dim 128 its plan walks whole spans); one block short
    of that takes 128-row tiles, as any host mask selecting ROWS128_MIN_DENSITY_D64 of its
    blocks does, and a sparser one keeps the 64-row tiles. Deciding it
    reads the mask's count, so the answer is not one for the geometry. Head dim 128 and other
    GPUs are unchanged. (Device masks keep the 64-row tiles without reading anything back:
    tests/gpu/test_attention.py's sync-free requests.)"""
    qb = np.arange(0, 20 * 128 + 1, 128)
    full = np.ones((2, 20, 20), bool)
    dense = BlockMask.from_dense(full, q_bounds=qb, kv_bounds=qb)
    holed = full.copy()
    holed[1, 7, 3] = False
    nearly = BlockMask.from_dense(holed, q_bounds=qb, kv_bounds=qb)
    assert R.heuristic.selects_every_block(dense) and not R.heuristic.selects_every_block(nearly)
    assert S.heuristic_choice(dense, 90, 64) == (R.heuristic.SM90_ROWS192_D64, True)
    assert S.heuristic_choice(nearly, 90, 64) == (R.heuristic.SM90_ROWS128, True)
    rng = np.random.default_rng(3)
    least = R.heuristic.ROWS128_MIN_DENSITY_D64
    for density, want in ((least - 0.1, R.heuristic.SM90_ROWS64_D64), (least + 0.1,
                                                                     R.heuristic.SM90_ROWS128)):
        m = BlockMask.from_dense(rng.random((2, 20, 20)) < density, q_bounds=qb, kv_bounds=qb)
        assert abs(m.density - density) < 0.05
        assert S.heuristic_choice(m, 90, 64) == (want, True)
        assert plan90(m, head_dim=64).regime == want
        assert S.heuristic_choice(m, 90, 128)[0] == R.heuristic.SM90_ROWS128
    assert plan90(dense, head_dim=64).regime == R.heuristic.SM90_ROWS192_D64
    # At head dim 128 the plan walks its tasks as whole spans (selection.whole_span_pick).
    assert S.heuristic_choice(dense, 90, 128) == (R.heuristic.SM90_ROWS128, False)
    assert plan90(dense, head_dim=128).regime == R.heuristic.SM90_ROWS128.with_(whole_spans=True)
    assert not plan90(nearly, head_dim=128).regime.whole_spans
    assert S.heuristic_choice(dense, 80, 64)[0] == default_regime(80, 64, 128.0)
    # The 64-token blocks of a dense layer keep their own rule (four rings).
    small = np.arange(0, 40 * 64 + 1, 64)
    dense64 = BlockMask.from_dense(np.ones((2, 40, 40), bool), q_bounds=small, kv_bounds=small)
    assert S.heuristic_choice(dense64, 90, 64)[0].rings == 4




def test_a_device_mask_is_counted_only_where_its_plan_may_read(monkeypatch):
    """A device mask's block count decides the head-dim-64 tiles and a dense layer's whole
    spans as a host mask's does, but only with ``count_blocks`` (a plan made directly, which
    may read a scalar back); without it (a request's selection) nothing is counted and the
    geometry's answer stands. (Host masks stand in for device ones: ``on_device`` patched.)"""
    H = R.heuristic
    qb = np.arange(0, 20 * 128 + 1, 128)
    dense = BlockMask.from_dense(np.ones((2, 20, 20), bool), q_bounds=qb, kv_bounds=qb)
    half = BlockMask.from_dense(np.random.default_rng(4).random((2, 20, 20)) < 0.5,
                                q_bounds=qb, kv_bounds=qb)
    monkeypatch.setattr(BlockMask, "on_device", property(lambda m: True))
    kw = dict(arch=90, head_dim=64, dtype="bfloat16", num_q_heads=2, batch=1)
    for m, want in ((dense, H.SM90_ROWS192_D64), (half, H.SM90_ROWS128)):
        assert S.heuristic_choice(m, 90, 64, count_blocks=True) == (want, True)
        assert S.selected_regime(m, count_blocks=True, **kw) == (want, False)
    assert S.whole_span_pick(H.SM90_ROWS128, dense, 128, count_blocks=True).whole_spans
    assert not S.whole_span_pick(H.SM90_ROWS128, half, 128, count_blocks=True).whole_spans
    monkeypatch.setattr(BlockMask, "nnz", property(lambda m: pytest.fail("counted the blocks")))
    for m in (dense, half):
        assert S.heuristic_choice(m, 90, 64) == (H.SM90_ROWS64_D64, False)
        # A request reading nothing takes the last answer read for the geometry.
        assert S.selected_regime(m, read_mask=False, **kw)[0] == H.SM90_ROWS128
    assert S.whole_span_pick(H.SM90_ROWS128, dense, 128) == H.SM90_ROWS128

def test_rings_with_enough_tasks_stand_against_the_table(monkeypatch):
    """Where the heuristic's four-ring tiles (head dim 64) get enough tasks (128, ~5 a ring on
    a 6-SM GPU, which may still split them), the table is not looked up -- no features are
    measured -- and the rings plan; with few tasks (16 SMs: 2 a ring) the table's pick stands."""
    from tessera.runtime.regime.heuristic import SM90_ROWS64_D64

    m = BlockMask.from_dense(np.random.default_rng(2).random((2, 64, 64)) < 0.2, block_size=64)
    f = mask_features(m, head_dim=64, dtype="bfloat16", arch=90, num_q_heads=2, batch=1)
    pick = SM90_ROWS64_D64.with_(num_warps=8, split_ratio=2.0)
    R.use_table(RegimeTable([entry(f, pick)], {"gpu": "NVIDIA H200", "arch": 90}))
    measured = []
    real = F.mask_features
    monkeypatch.setattr(F, "mask_features", lambda *a, **k: measured.append(1) or real(*a, **k))
    monkeypatch.setattr(D, "device_arch", lambda: 90)
    for sms, want, looked_up in ((6, SM90_ROWS64_D64, False), (16, pick, True)):
        monkeypatch.setattr(D, "device_sm_count", lambda sms=sms: sms)
        measured.clear()
        got = R.select_regime(m, arch=90, head_dim=64, dtype="bfloat16", num_q_heads=2,
                              batch=1)
        assert got == want and bool(measured) == looked_up, (sms, got.name)
    # A portable plan (no SMs to count) looks the table up.
    monkeypatch.setattr(D, "device_arch", lambda: None)
    assert R.select_regime(m, arch=90, head_dim=64, dtype="bfloat16", num_q_heads=2,
                           batch=1) == pick
