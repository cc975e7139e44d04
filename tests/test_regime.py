"""Regime selection on the CPU (DESIGN.md section 4): candidate regimes, mask features, regime
tables (file format, validation, lookup), selection in ``tessera.plan`` with its fallbacks, and
the profiler's bookkeeping with a fake timer (the GPU timer itself is not exercised here)."""

from __future__ import annotations

import io
import json
import os
import warnings

import numpy as np
import pytest

import tessera
import tessera.runtime.mapping
from tessera import BlockMask
from tessera.tools import profile as prof
from tessera.cuda import device as D
from tessera.runtime import regime as R
from tessera.runtime.regime import features as F
from tessera.runtime.regime import selection as S
from tessera.runtime.regime import (MaskFeatures, Regime, RegimeTable, candidate_regimes,
                                    default_regime, mask_features, mask_measures)


REAL_GPU_NAME = D.current_gpu_name  # the fixture below stubs it; one test checks the real one


@pytest.fixture(autouse=True)
def clean_selection(monkeypatch):
    """Every test starts from discovery with no env var and no GPU name (deterministic on GPU
    machines too), and leaves it that way."""
    monkeypatch.delenv(R.ENV_TABLE, raising=False)
    monkeypatch.setattr(D, "current_gpu_name", lambda: None)
    R.use_table("auto")
    yield
    R.use_table("auto")


def feats(**kw) -> MaskFeatures:
    base = dict(arch=90, head_dim=128, dtype="bfloat16", geometry="uniform-128x128",
                seq_len="<=32k", density="5-15%", imbalance="<1.5", batch_heads="<=16")
    base.update(kw)
    return MaskFeatures(**base)


def entry(f: MaskFeatures, regime: Regime, ms: float = 1.0, **extra) -> dict:
    return dict(features=f.to_dict(), regime=regime.to_dict(), ms=ms, oracle_ms=ms, **extra)


def brute_measures(dense: np.ndarray, qb: np.ndarray, kb: np.ndarray) -> tuple[float, float]:
    """Token-pair density and heaviest/mean row, by expanding every row of ``dense``."""
    qlen, klen = np.diff(qb), np.diff(kb)
    rows = dense.reshape(-1, dense.shape[-1])
    pairs = np.array([qlen[i % qlen.size] * klen[r].sum() for i, r in enumerate(rows)])
    n_bh = rows.shape[0] // qlen.size
    return pairs.sum() / (n_bh * qb[-1] * kb[-1]), pairs.max() / pairs.mean()


# ---------------------------------------------------------------------------- candidates
def test_candidates_small_valid_and_fitting():
    for d in (64, 96, 128):
        for arch in (80, 86, 89, 90, 100, None):
            cands = candidate_regimes(d, arch)
            assert 0 < len(cands) <= (48 if arch == 90 else 24)
            assert len({r.name for r in cands}) == len(cands)
            assert all(R.regime_fits(r, d, arch) for r in cands)
            assert all(r.num_warps == 4 and r.block_m in (64, 128) and r.block_n in (32, 64)
                       for r in cands if r.family == "sm80")
            # 64-row sm90 tiles plain (with a producer warpgroup at head dim 128, and for
            # 128-key steps at 64), 128-row ones warp-specialized.
            assert all(r.producer == (r.block_m == 128 or d == 128
                                      or (d, r.block_n) == (64, 128))
                       and r.block_n in (64, 128) for r in cands if r.family == "sm90")
            assert {r.family for r in cands} == ({"sm80", "sm90"} if arch == 90 else {"sm80"})
    assert len(candidate_regimes(128, 90)) == 48
    # The heuristic's choices are measured too.
    assert Regime() in candidate_regimes(128, 90)
    for d in (64, 96, 128):
        for q_block in (64, 128):
            assert default_regime(90, d, q_block) in candidate_regimes(d, 90)
    # sm_86/89 (99 KB) cannot hold the 128x64 tile at head dim 128; unknown arch is as strict.
    small = candidate_regimes(128, 86)
    assert len(small) == 18 and all((r.block_m, r.block_n) != (128, 64) for r in small)
    assert candidate_regimes(128, None) == small
    assert default_regime(86, 128) in small
    assert {r.split_ratio for r in small} == {2.0, 4.0, 1e9}
    assert {r.combine_threshold for r in small} == {0.0, 0.3}


def test_new_candidate_tiles_compile_without_spills(tmp_path, monkeypatch):
    """The 32-key variants are new to CI (the default regimes use 64): they must build
    without spills too."""
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    from tessera.cuda import loader, variants

    if loader.nvrtc_version() is None:
        pytest.skip("NVRTC not available")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    for target, cc in (("sm_80", 80), ("sm_90a", 90)):
        for d in (64, 128):
            shapes = {(r.block_m, r.block_n) for r in candidate_regimes(d, cc)}
            for bm, bn in sorted(s for s in shapes if s[1] == 32):
                v = variants.Variant.bsa_sm80(block_m=bm, block_n=bn, head_dim=d, num_warps=4,
                                            stages=2, bf16=True)
                res = loader.compile_variant(v, target)
                assert res.spill_bytes == 0 and res.stack_bytes == 0


# ---------------------------------------------------------------------------- features
def test_features_uniform_128_known_density_and_balance():
    rng = np.random.default_rng(0)
    dense = np.zeros((4, 8, 8), bool)
    for h in range(4):
        for i in range(8):
            dense[h, i, rng.choice(8, 4, replace=False)] = True  # half of every row
    m = BlockMask.from_dense(dense, block_size=128)
    meas = mask_measures(m)
    assert m._indptr is None  # measured from the dense rows: the CSR was not derived
    assert meas.density == pytest.approx(0.5) and meas.imbalance == pytest.approx(1.0)
    assert meas.uniform == (128, 128) and meas.seq_len == 1024 and meas.q_block == 128
    f = mask_features(m, head_dim=128, dtype="bfloat16", arch=90, num_q_heads=4, batch=1)
    assert (f.geometry, f.seq_len, f.density, f.imbalance, f.batch_heads) == \
        ("uniform-128x128", "<=16k", "30-60%", "<1.5", "<=16")
    # The same selection through CSR gives the same measures.
    csr = BlockMask(m.q_bounds, m.kv_bounds, m.indptr, m.indices, m.batch_heads)
    assert mask_measures(csr) == meas


def _np_mask_pairs(grid, block, args):
    """numpy stand-in for plan.cu's mask_pairs (out[0] += pairs, out[1] = max, per row)."""
    dense, n_rows, n_kv, n_q, qb, kb, out = args
    for r in range(int(n_rows)):
        i = r % int(n_q)
        pairs = int(np.diff(kb)[dense[r].astype(bool)].sum()) * int(qb[i + 1] - qb[i])
        out[0] += np.uint64(pairs)
        out[1] = max(int(out[1]), pairs)


def test_device_measures_equal_host_measures(monkeypatch):
    """The one-kernel device path (kernel replaced by its numpy stand-in) measures uniform,
    ragged, variable, per-head and empty masks exactly as the host path does."""
    from tessera.cuda import loader
    from tessera.runtime import mapping

    rng = np.random.default_rng(7)
    variable = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(8, 300, 10))],
                    kv_bounds=np.r_[0, np.cumsum(rng.integers(8, 200, 13))])
    heavy = rng.random((3, 10, 13)) < 0.2
    heavy[1, 4] = True  # one row far heavier than the rest
    masks = [BlockMask.from_dense(rng.random((4, 9, 9)) < 0.4, block_size=128),
             BlockMask.from_dense(rng.random((2, 8, 8)) < 0.3, block_size=128, seq_len_q=1000,
                                  seq_len_kv=900),
             BlockMask.from_dense(heavy, **variable),
             BlockMask.from_dense(rng.random((2, 3, 10, 13)) < 0.5, **variable),
             BlockMask.from_dense(np.zeros((2, 5, 5), bool), block_size=64)]
    host = [mask_measures(m) for m in masks]
    assert host[2].imbalance > 2
    calls = []
    monkeypatch.setattr(loader, "load_kernel", lambda v: calls.append(v.kernel) or _np_mask_pairs)
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    for m, want in zip(masks, host):
        assert mask_measures(m) == want
    assert calls == ["mask_pairs"] * len(masks)
    # A mask given as CSR only (no dense rows) keeps the array path.
    csr = BlockMask(masks[0].q_bounds, masks[0].kv_bounds, masks[0].indptr, masks[0].indices,
                    masks[0].batch_heads)
    assert mask_measures(csr) == host[0] and len(calls) == len(masks)


def test_features_ragged_and_variable_match_brute_force():
    rng = np.random.default_rng(1)
    # Ragged: 1000 query and 900 key tokens in 128-token blocks (short last blocks).
    dense = rng.random((2, 8, 8)) < 0.3
    m = BlockMask.from_dense(dense, block_size=128, seq_len_q=1000, seq_len_kv=900)
    meas = mask_measures(m)
    dens, imb = brute_measures(dense, m.q_bounds, m.kv_bounds)
    assert meas.density == pytest.approx(dens) and meas.imbalance == pytest.approx(imb)
    assert meas.uniform == (128, 128) and meas.seq_len == 1000
    # Variable blocks on both axes: the dense path's weighted sum, and the CSR path.
    qb = np.array([0, 30, 80, 140, 340, 410])
    kb = np.array([0, 100, 130, 300, 310, 500, 512])
    dense = rng.random((3, 5, 6)) < 0.5
    dense[0, 0] = False  # an empty row
    m = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    meas = mask_measures(m)
    assert m._indptr is None
    dens, imb = brute_measures(dense, qb, kb)
    assert meas.density == pytest.approx(dens) and meas.imbalance == pytest.approx(imb)
    assert mask_measures(BlockMask(m.q_bounds, m.kv_bounds, m.indptr, m.indices,
                                   m.batch_heads)) == meas
    assert meas.uniform is None and meas.q_block == 60.0
    f = mask_features(m, head_dim=64, dtype="float16", arch=80, num_q_heads=6, batch=3)
    assert f.geometry == "variable-64" and f.batch_heads == "17-64" and f.dtype == "float16"


def test_features_heavy_rows_and_buckets():
    dense = np.zeros((1, 16, 16), bool)
    dense[0, np.arange(16), np.arange(16)] = True  # diagonal: one block a row
    m = BlockMask.from_dense(dense, block_size=64)
    assert mask_measures(m).imbalance == pytest.approx(1.0)
    dense[0, 3] = True  # one row selects everything: 16 / (31/16) = 8.3 x the mean
    meas = mask_measures(BlockMask.from_dense(dense, block_size=64))
    assert meas.imbalance == pytest.approx(16 / (31 / 16))
    f = mask_features(BlockMask.from_dense(dense, block_size=64), head_dim=128, dtype="bf16",
                      arch=90, num_q_heads=40, batch=2)
    assert (f.geometry, f.imbalance, f.batch_heads, f.dtype) == \
        ("uniform-64x64", ">=3", ">64", "bfloat16")
    dense[0, 3] = False
    dense[0, 3, :4] = True  # 4 / (19/16) = 3.4; with 3 blocks 3/(18/16) = 2.7
    dense[0, 3, 3] = False
    assert mask_features(BlockMask.from_dense(dense, block_size=64), head_dim=128,
                         dtype="bfloat16", arch=90, num_q_heads=1, batch=1).imbalance == "1.5-3"
    empty = BlockMask.from_dense(np.zeros((2, 3), bool), block_size=(256, 512))
    f = mask_features(empty, head_dim=64, dtype="bfloat16", arch=90, num_q_heads=1, batch=1)
    assert (f.geometry, f.density, f.imbalance) == ("uniform-256x384+", "0-5%", "<1.5")


def test_bucket_edges():
    assert [F.block_bucket(b) for b in (16, 64, 65, 128, 129, 256, 384, 4096)] == \
        ["64", "64", "128", "128", "256", "256", "384+", "384+"]
    sb = lambda n: F._bucket(n, F._SEQ_EDGES, F.SEQ_BUCKETS, True)  # noqa: E731
    assert [sb(n) for n in (1000, 16384, 16385, 32768, 75_000, 131072, 200_000)] == \
        ["<=16k", "<=16k", "<=32k", "<=32k", "<=128k", "<=128k", ">128k"]
    db = lambda d: F._bucket(d, F._DENSITY_EDGES, F.DENSITY_BUCKETS, False)  # noqa: E731
    assert [db(d) for d in (0, 0.049, 0.05, 0.15, 0.3, 0.59, 0.6, 1.0)] == \
        ["0-5%", "0-5%", "5-15%", "15-30%", "30-60%", "30-60%", "60-100%", "60-100%"]


def test_feature_key_is_stable_and_round_trips():
    f = feats()
    # The key is the table's index: changing its spelling breaks every committed table.
    assert f.key() == "sm90/d128/bfloat16/uniform-128x128/L<=32k/p5-15%/r<1.5/bh<=16"
    assert feats().key() == f.key() and feats(density="0-5%").key() != f.key()
    assert MaskFeatures.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    m = BlockMask.from_dense(np.eye(8, dtype=bool), block_size=128)
    k1 = mask_features(m, head_dim=128, dtype="bfloat16", arch=90, num_q_heads=2, batch=1).key()
    k2 = mask_features(BlockMask.from_dense(np.eye(8, dtype=bool), block_size=128),
                       head_dim=128, dtype="bfloat16", arch=90, num_q_heads=2, batch=1).key()
    assert k1 == k2


# ---------------------------------------------------------------------------- tables
def sample_table(source: str = "<test>") -> RegimeTable:
    small = Regime(block_m=64, block_n=32, split_ratio=2.0, combine_threshold=0.0)
    dense = Regime(split_ratio=1e9)
    entries = [entry(feats(density="5-15%"), small, 1.5),
               entry(feats(density="60-100%"), dense, 9.0),
               entry(feats(density="15-30%", seq_len=">128k"), Regime(block_n=32), 4.0),
               entry(feats(head_dim=64, geometry="variable-64"), small, 0.5)]
    return RegimeTable(entries, {"gpu": "NVIDIA H200", "arch": 90, "date": "2025-01-01"},
                       source=source)


def test_table_round_trip(tmp_path):
    t = sample_table()
    path = tmp_path / "sub" / "nvidia-h200.json"
    t.save(path)
    assert sorted(os.listdir(path.parent)) == ["nvidia-h200.json"]  # no temporary left over
    assert (path.stat().st_mode & 0o777) == 0o644
    raw = json.loads(path.read_text())
    assert raw["format"] == "tessera-regime-table" and raw["version"] == 1
    assert raw["provenance"]["gpu"] == "NVIDIA H200"
    u = RegimeTable.load(path)
    assert u.entries == t.entries and u.provenance == t.provenance and u.arch == 90
    assert u.gpu == "NVIDIA H200" and len(u) == 4 and "nvidia-h200.json" in u.describe()
    for e in t.entries:
        f = MaskFeatures.from_dict(e["features"])
        assert u.lookup(f) == t.lookup(f) == Regime.from_dict(e["regime"])
    u.save(path)  # saving again keeps the content
    assert json.loads(path.read_text()) == raw


def test_lookup_exact_nearest_and_none():
    t = sample_table()
    small = Regime(block_m=64, block_n=32, split_ratio=2.0, combine_threshold=0.0)
    assert t.lookup(feats(density="5-15%")) == small
    assert t.lookup_exact(feats(density="0-5%")) is None
    assert t.lookup(feats(density="0-5%")) == small  # one density bucket away
    # Density first: the 15-30% entry is 3 seq buckets away but 0 density buckets.
    assert t.lookup(feats(density="15-30%")) == Regime(block_n=32)
    assert t.lookup(feats(density="60-100%", seq_len=">128k")) == Regime(split_ratio=1e9)
    # 30-60% is one bucket from both 15-30% (at >128k) and 60-100% (at <=32k): seq decides.
    assert t.lookup(feats(density="30-60%")) == Regime(split_ratio=1e9)
    assert t.lookup(feats(density="30-60%", seq_len=">128k")) == Regime(block_n=32)
    assert t.lookup(feats(density="30-60%", seq_len="<=128k")) == Regime(block_n=32)
    assert t.lookup(feats(density="30-60%", seq_len="<=16k")) == Regime(split_ratio=1e9)
    assert t.lookup(feats(imbalance=">=3", batch_heads=">64")) == small
    # Nothing of this group: arch, head dim, dtype or geometry differ.
    assert t.lookup(feats(arch=80)) is None
    assert t.lookup(feats(head_dim=96)) is None
    assert t.lookup(feats(dtype="float16")) is None
    assert t.lookup(feats(geometry="uniform-64x64")) is None
    assert t.lookup(feats(head_dim=64, geometry="variable-64", density="60-100%")) == small
    assert RegimeTable([], {}).lookup(feats()) is None


def _write(tmp_path, obj, name="t.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def good_json() -> dict:
    return sample_table().to_json()


@pytest.mark.parametrize("mutate,message", [
    (lambda o: "{not json", "not a JSON file"),
    (lambda o: [o], "not a regime table"),
    (lambda o: {**o, "format": "something-else"}, "format is 'something-else'"),
    (lambda o: {**o, "version": 2}, "version 2 is not supported"),
    (lambda o: {k: v for k, v in o.items() if k != "entries"}, "missing 'entries'"),
    (lambda o: {**o, "extra": 1}, "unknown top-level fields ['extra']"),
    (lambda o: {**o, "entries": {}}, "entries must be a list"),
    (lambda o: {**o, "entries": [{k: v for k, v in o["entries"][0].items()
                                  if k != "oracle_ms"}]}, "missing fields ['oracle_ms']"),
    (lambda o: {**o, "entries": [{**o["entries"][0], "regime": {
        **o["entries"][0]["regime"], "tile": 3}}]}, "unknown fields ['tile']"),
    (lambda o: {**o, "entries": [{**o["entries"][0], "regime": {
        **o["entries"][0]["regime"], "block_m": 100}}]}, "block_m"),
    (lambda o: {**o, "entries": [{**o["entries"][0], "regime": {
        **o["entries"][0]["regime"], "block_n": "64"}}]}, "block_n must be int"),
    (lambda o: {**o, "entries": [{**o["entries"][0], "regime": {
        **o["entries"][0]["regime"], "family": "sm70"}}]}, "family must be one of"),
    (lambda o: {**o, "entries": [{**o["entries"][0], "features": {
        **o["entries"][0]["features"], "density": "7%"}}]}, "density must be one of"),
    (lambda o: {**o, "entries": [{**o["entries"][0], "features": {
        **o["entries"][0]["features"], "colour": 1}}]}, "unknown fields ['colour']"),
    (lambda o: {**o, "entries": [{**o["entries"][0], "ms": -1}]}, "ms must be"),
    (lambda o: {**o, "entries": [{**o["entries"][0], "key": "x"}]}, "does not match"),
    (lambda o: {**o, "entries": o["entries"][:1] * 2}, "duplicate features"),
    (lambda o: {**o, "provenance": {"arch": 80}}, "several architectures"),
])
def test_load_rejects_bad_files_clearly(tmp_path, mutate, message):
    p = _write(tmp_path, mutate(good_json()))
    with pytest.raises(ValueError) as err:
        RegimeTable.load(p)
    assert message in str(err.value) and str(p) in str(err.value)


def test_load_rejects_regime_that_does_not_fit_the_gpu(tmp_path):
    f = feats(arch=86)  # 99 KB: no 128x64 tile at head dim 128
    p = _write(tmp_path, RegimeTable([entry(f, Regime(block_n=32))]).to_json())
    assert RegimeTable.load(p).lookup(f) == Regime(block_n=32)
    obj = json.loads(p.read_text())
    obj["entries"][0]["regime"]["block_n"] = 64
    with pytest.raises(ValueError, match="shared memory"):
        RegimeTable.load(_write(tmp_path, obj))


def test_load_missing_file():
    with pytest.raises(FileNotFoundError):
        RegimeTable.load("/nonexistent/tessera-table.json")


# ---------------------------------------------------------------------------- selection
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
        assert plan90(m).regime == heuristic(m)
    assert heuristic(m).family == "sm90"
    assert table_for(m).families == {"sm90"}


def plan90(mask, **kw):
    kw = {"num_q_heads": 2, "head_dim": 128, "arch": 90, **kw}
    return tessera.plan(mask, **kw)


def heuristic(mask, arch=90, head_dim=128):
    return default_regime(arch, head_dim, float(np.median(np.diff(mask.q_bounds))),
                          mask.kv_bounds)


def test_plan_uses_table_and_falls_back():
    m = wan_like_mask()
    assert plan90(m).regime == heuristic(m)  # no table anywhere
    assert R.use_table(table_for(m)) is not None
    assert plan90(m).regime == PICK
    assert plan90(m, regime=Regime()).regime == Regime()  # an explicit regime wins
    assert plan90(m, head_dim=64).regime == heuristic(m, head_dim=64)  # no d64 entries
    assert plan90(m, dtype="float16").regime == heuristic(m)
    assert tessera.plan(m, num_q_heads=2, head_dim=128).regime == heuristic(m, None)  # CPU
    # Nearest entry: more heads are another batch x heads bucket of the same group.
    assert plan90(m, batch=20).regime == PICK
    R.use_table(None)
    assert plan90(m).regime == heuristic(m)


def test_features_measured_only_when_the_table_could_answer(monkeypatch):
    m = wan_like_mask()
    R.use_table(table_for(m))
    calls = []
    real = F.mask_features
    monkeypatch.setattr(F, "mask_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert plan90(m, dtype="float16").regime == heuristic(m)
    assert plan90(m, head_dim=64).regime == heuristic(m, head_dim=64)
    assert calls == []
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
        assert got == (PICK if looked_up else heuristic(m)) and bool(measured) == looked_up
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
    assert plan90(m).regime == heuristic(m)  # no GPU name: no default table
    # tables/<gpu-slug>.json beside the package, for the GPU this process runs on, unless
    # $TESSERA_REGIME_TABLE=none.
    monkeypatch.setattr(S, "TABLES_DIR", tmp_path)
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA H200")
    own = PICK.with_(block_m=128, num_warps=8)
    table_for(m, regime=own).save(tmp_path / "nvidia-h200.json")
    assert plan90(m).regime == own
    assert "nvidia-h200.json" in R.describe_table_in_use(90)
    monkeypatch.setenv(R.ENV_TABLE, "none")
    assert plan90(m).regime == heuristic(m)
    assert "TESSERA_REGIME_TABLE=none" in R.describe_table_in_use(90)
    monkeypatch.setenv(R.ENV_TABLE, "auto")
    assert plan90(m).regime == own
    assert "nvidia-h200.json" in R.describe_table_in_use(90)
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA A100-SXM4-80GB")
    assert plan90(m).regime == heuristic(m)  # no table for that GPU: quietly the heuristic
    assert "no table at" in R.describe_table_in_use(90)
    # use_table overrides the environment; use_table(None) means the heuristic.
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setenv(R.ENV_TABLE, str(path))
    R.use_table(tmp_path / "nvidia-h200.json")
    assert plan90(m).regime == own
    R.use_table(None)
    assert plan90(m).regime == heuristic(m)
    assert R.describe_table_in_use(90) == "none: heuristic (use_table(None))"


def test_gpu_slug():
    assert R.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert R.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert R.gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"


@pytest.mark.parametrize("content", ["{oops", json.dumps({"format": "tessera-regime-table",
                                                          "version": 7, "entries": []})])
def test_corrupt_table_warns_once_and_plans_with_heuristic(tmp_path, monkeypatch, content):
    m = wan_like_mask()
    bad = _write(tmp_path, content, "bad.json")
    monkeypatch.setenv(R.ENV_TABLE, str(bad))
    with pytest.warns(RuntimeWarning, match="unusable.*bad.json"):
        p = plan90(m)
    assert p.regime == heuristic(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second plan does not warn again
        assert plan90(m).regime == heuristic(m)
    assert "none: heuristic" in R.describe_table_in_use(90)
    with pytest.raises(ValueError, match="bad.json"):
        R.use_table(bad)  # an explicit choice fails loudly


def test_missing_env_table_warns(tmp_path, monkeypatch):
    monkeypatch.setenv(R.ENV_TABLE, str(tmp_path / "nope.json"))
    with pytest.warns(RuntimeWarning, match="does not exist"):
        assert plan90(wan_like_mask()).regime == heuristic(wan_like_mask())


def test_other_gpu_table_warns_and_falls_back(monkeypatch):
    m = wan_like_mask()
    R.use_table(table_for(m, arch=80, gpu="NVIDIA A100-SXM4-80GB"))
    with pytest.warns(RuntimeWarning, match="profiled on sm_80.*sm_90"):
        assert plan90(m).regime == heuristic(m)
    # Same architecture, another GPU model (known only where a GPU is present).
    R.use_table(table_for(m, gpu="NVIDIA H100 80GB HBM3"))
    monkeypatch.setattr(D, "current_gpu_name", lambda: "NVIDIA H200")
    with pytest.warns(RuntimeWarning, match="profiled on NVIDIA H100 80GB HBM3"):
        assert plan90(m).regime == heuristic(m)
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


# ---------------------------------------------------------------------------- profiler
def small_case(label: str, *, density: float, seed: int, head_dim: int = 64,
               shape: str = "toy", family: str = "random_blocks", block: int = 128) -> prof.Case:
    def build():
        dense = np.random.default_rng(seed).random((2, 8, 8)) < density
        dense[:, :, 0] = True
        return BlockMask.from_dense(dense, block_size=block)
    return prof.Case(label, shape, family, head_dim, 2, build)


class FakeTimer:
    """Kernel time by regime: ``favourite`` per label is 20% faster, every regime a bit
    different; the fake clock advances one second a call."""

    def __init__(self, favourite: dict[str, Regime], fail: set[str] = frozenset()):
        self.favourite, self.fail = favourite, fail
        self.now = 0.0
        self.calls: dict[str, int] = {}

    def clock(self) -> float:
        return self.now

    def __call__(self, case, mask, regime):
        self.now += 1.0
        self.calls[case.label] = self.calls.get(case.label, 0) + 1
        assert isinstance(mask, BlockMask)
        if regime.name in self.fail or case.label in self.fail:
            raise RuntimeError("variant failed to build")
        base = 1.0 + regime.block_m / 1000 + regime.block_n / 10000 + regime.split_ratio / 1e12
        if regime == self.favourite.get(case.label):
            base *= 0.8
        return base, 0.05


def test_profile_limited_to_kernel_families(tmp_path):
    """--kernel-families sm90 times only that family (24 candidates instead of 48 on sm_90),
    records the limit, refuses to resume a table made with another, and refuses a limit that
    leaves no candidate; the evaluation's oracle is limited the same way."""
    assert len(candidate_regimes(128, 90, ("sm90",))) == 24
    assert {r.family for r in candidate_regimes(64, 90, ("sm90",))} == {"sm90"}
    assert candidate_regimes(128, 80, ("sm90",)) == []
    fav = Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=3,
                 combine_threshold=0.0)
    cases = [small_case("a", density=0.2, seed=0), small_case("b", density=0.6, seed=1)]
    timer = FakeTimer({"a": fav})
    out = tmp_path / "t.json"
    res = prof.profile(cases[:1], out=out, arch=90, timer=timer, clock=timer.clock,
                       progress=None, kernel_families=("sm90",))
    assert res.stopped == "done" and timer.calls == {"a": 24}
    t = RegimeTable.load(out)
    assert t.provenance["corpus"]["kernel_families"] == ["sm90"]
    assert Regime.from_dict(t.entries[0]["regime"]) == fav
    assert all(name.startswith("sm90_") for name in t.entries[0]["candidates"])
    with pytest.raises(ValueError, match="kernel_families"):
        prof.profile(cases, out=out, arch=90, timer=timer, progress=None, resume=True)
    res = prof.profile(cases, out=out, arch=90, timer=timer, clock=timer.clock, progress=None,
                       resume=True, kernel_families=["sm90"])
    assert res.profiled == ["b"] and timer.calls["b"] == 24
    with pytest.raises(ValueError, match="no candidate regimes"):
        prof.profile(cases, out=tmp_path / "u.json", arch=80, timer=timer, progress=None,
                     kernel_families=("sm90",))
    t2 = FakeTimer({"h": fav})
    doc = prof.evaluate([small_case("h", density=0.2, seed=5)], table=RegimeTable.load(out),
                        out=tmp_path / "e.json", arch=90, timer=t2, clock=t2.clock,
                        progress=None, kernel_families=("sm90",))
    assert t2.calls == {"h": 24} and doc["kernel_families"] == ["sm90"]


def test_profile_limited_to_combine_thresholds(tmp_path):
    """--combine-thresholds 0 times only the one-sync mapping policy (12 sm90 candidates on
    sm_90), records it, refuses to resume a table profiled with every policy (or with none
    recorded), and limits the evaluation's oracle the same way."""
    assert len(candidate_regimes(128, 90, ("sm90",), (0.0,))) == 12
    assert {r.combine_threshold for r in candidate_regimes(64, 90, None, (0.0,))} == {0.0}
    assert candidate_regimes(64, 90, None, (0.5,)) == []
    fav = Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=3,
                 combine_threshold=0.0)
    cases = [small_case("a", density=0.2, seed=0), small_case("b", density=0.6, seed=1)]
    timer = FakeTimer({"a": fav})
    out = tmp_path / "t.json"
    kw = dict(arch=90, timer=timer, clock=timer.clock, progress=None, kernel_families=("sm90",))
    prof.profile(cases[:1], out=out, combine_thresholds=(0.0,), **kw)
    assert timer.calls == {"a": 12}
    corpus = RegimeTable.load(out).provenance["corpus"]
    assert corpus["combine_thresholds"] == [0.0] and corpus["kernel_families"] == ["sm90"]
    with pytest.raises(ValueError, match="combine_thresholds"):
        prof.profile(cases, out=out, resume=True, **kw)
    prof.profile(cases[:1], out=tmp_path / "all.json", **kw)  # every policy: "all" recorded
    assert RegimeTable.load(tmp_path / "all.json").provenance["corpus"][
        "combine_thresholds"] == "all"
    with pytest.raises(ValueError, match="combine_thresholds"):
        prof.profile(cases, out=tmp_path / "all.json", resume=True, combine_thresholds=(0.0,),
                     **kw)
    with pytest.raises(ValueError, match="no candidate regimes"):
        prof.profile(cases, out=tmp_path / "u.json", combine_thresholds=(0.5,), **kw)
    t2 = FakeTimer({"h": fav})
    doc = prof.evaluate([small_case("h", density=0.2, seed=5)], table=RegimeTable.load(out),
                        out=tmp_path / "e.json", arch=90, timer=t2, clock=t2.clock,
                        progress=None, kernel_families=("sm90",), combine_thresholds=(0.0,))
    assert t2.calls == {"h": 12} and doc["combine_thresholds"] == [0.0]


def test_regimes_that_plan_alike_are_timed_once(tmp_path):
    """With the GPU's SM count known (provenance "sms"), candidates that differ only in split
    policy where no task may split (16+ tasks per slot: here one SM) plan identically and are
    timed once, the others sharing the timing; with more slots than that they are all timed.
    The evaluation's oracle does the same."""
    fav = Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=3,
                 combine_threshold=0.0)

    def eight_heads(label: str, seed: int) -> prof.Case:
        # 8 heads x 8 query blocks of 128: 64 tasks of 128 rows, 128 of 64 -- at least 16 per
        # slot of a one-SM GPU for every tile shape (up to 3 resident CTAs).
        def build():
            dense = np.random.default_rng(seed).random((1, 8, 8)) < 0.3
            dense[:, :, 0] = True
            return BlockMask.from_dense(dense, block_size=128)
        return prof.Case(label, "toy", "random_blocks", 64, 8, build)

    case = eight_heads("a", 0)
    kw = dict(arch=90, progress=None, kernel_families=("sm90",), combine_thresholds=(0.0,))
    timer = FakeTimer({"a": fav})
    out = tmp_path / "t.json"
    prof.profile([case], out=out, timer=timer, clock=timer.clock, provenance=dict(sms=1), **kw)
    assert timer.calls == {"a": 4}  # 12 candidates, 4 tile shapes
    entry = RegimeTable.load(out).entries[0]
    times = {n: c["ms"] if isinstance(c, dict) else c for n, c in entry["candidates"].items()}
    assert len(times) == 12
    by_shape: dict[str, set] = {}
    for name, t in times.items():
        by_shape.setdefault(name.split("[")[0], set()).add(str(t))
    assert all(len(v) == 1 for v in by_shape.values())  # twins share their timing
    many = FakeTimer({"a": fav})
    prof.profile([case], out=tmp_path / "u.json", timer=many, clock=many.clock,
                 provenance=dict(sms=1000), **kw)
    assert many.calls == {"a": 12}
    t2 = FakeTimer({"h": fav})
    prof.evaluate([eight_heads("h", 5)], table=RegimeTable.load(out),
                  out=tmp_path / "e.json", timer=t2, clock=t2.clock, provenance=dict(sms=1),
                  **kw)
    assert t2.calls == {"h": 4}


def test_corpora_at_the_models_head_counts():
    """heads=None builds every mask with its model's head count (each case its own: the
    builders bind their shape's count, not the loop's last)."""
    from tessera.tools.workloads import WORKLOADS

    cases = prof.build_corpus(["wan-1.3b-480p", "cogvideox-5b-5f"], ["sliding_tile",
                                                                   "random_blocks"], heads=None)
    assert {c.shape: c.heads for c in cases} == {"wan-1.3b-480p": 12, "cogvideox-5b-5f": 48}
    first = next(c for c in cases if c.shape == "wan-1.3b-480p" and c.family == "random_blocks")
    assert first.build().batch_heads == (1, WORKLOADS["wan-1.3b-480p"].heads)
    held = prof.build_heldout_corpus(["wan-1.3b-480p-31f", "cogvideox-5b-9f"], heads=None)
    assert {c.shape: c.heads for c in held} == {"wan-1.3b-480p-31f": 12, "cogvideox-5b-9f": 48}
    for c in held:
        if c.family in ("sliding_tile", "random_blocks"):
            assert c.build().batch_heads == (1, c.heads), c.label
    with pytest.raises(ValueError, match="heads"):
        prof.build_corpus(heads=0)


def test_profile_command_options(capsys):
    from tessera.tools.cli import main

    assert main(["profile", "--list", "--shapes", "cogvideox-5b", "--families", "radial",
                 "--heads", "model", "--kernel-families", "sm90", "--combine-thresholds",
                 "0"]) == 0
    out = capsys.readouterr().out
    assert "cogvideox-5b/radial (head dim 64, 48 heads)" in out
    assert "sm_90 head dim 64: 12 candidate regimes" in out
    assert main(["profile", "--list", "--combine-thresholds", "zero"]) == 2
    assert "--combine-thresholds" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["profile", "--list", "--heads", "0"])


def test_profiler_picks_fastest_and_writes_valid_table(tmp_path):
    fav = Regime(block_m=128, block_n=32, split_ratio=2.0, combine_threshold=0.0)
    cases = [small_case("a", density=0.1, seed=0), small_case("b", density=0.9, seed=1)]
    timer = FakeTimer({"a": fav})
    out = tmp_path / "t.json"
    log = io.StringIO()
    res = prof.profile(cases, out=out, arch=90, timer=timer, clock=timer.clock, progress=log,
                       provenance={"gpu": "NVIDIA H200", "driver": "x"})
    assert res.stopped == "done" and res.profiled == ["a", "b"] and not res.failed
    assert res.timings == 96 and timer.calls == {"a": 48, "b": 48}  # 24 sm80 + 24 sm90
    t = RegimeTable.load(out)
    assert len(t) == 2 and t.arch == 90 and t.gpu == "NVIDIA H200"
    assert t.provenance["corpus"]["masks"] == 2 and t.provenance["driver"] == "x"
    assert t.provenance["date"] and t.provenance["tessera"] == tessera.__version__
    by_mask = {e["masks"][0]: e for e in t.entries}
    a, b = by_mask["a"], by_mask["b"]
    assert Regime.from_dict(a["regime"]) == fav and a["name"] == fav.name
    assert a["ms"] == pytest.approx(a["oracle_ms"]) == pytest.approx((1.0 + 0.128 + 0.0032)
                                                                      * 0.8 + 0.05, abs=1e-4)
    assert a["default"] == default_regime(90, 64, 128.0).name and a["default_ms"] > a["ms"]
    assert len(a["candidates"]) == 48 and a["candidates"][fav.name]["rel"] == 1.0
    # Without a favourite the cheapest by construction: 64-row tiles, 32 keys, split 2.
    assert (b["regime"]["block_m"], b["regime"]["block_n"], b["regime"]["split_ratio"]) == \
        (64, 32, 2.0)
    f = MaskFeatures.from_dict(a["features"])
    assert t.lookup(f) == fav
    text = log.getvalue()
    assert "[1/2]" in text and "[2/2]" in text and fav.name in text


def test_profiler_merges_masks_of_one_key(tmp_path):
    x = Regime(block_m=64, block_n=64, split_ratio=4.0, combine_threshold=0.3)
    y = Regime(block_m=128, block_n=64, split_ratio=1e9, combine_threshold=0.0)
    # Same geometry and density bucket: one key. x wins "p" by 20%, y wins "q" by 20%, and
    # "r" (y again): y has the lower mean relative time.
    cases = [small_case(n, density=0.5, seed=2) for n in ("p", "q", "r")]
    timer = FakeTimer({"p": x, "q": y, "r": y})
    res = prof.profile(cases, out=tmp_path / "t.json", arch=90, timer=timer, clock=timer.clock,
                       progress=None)
    (e,) = res.table.entries
    assert e["masks"] == ["p", "q", "r"] and len(e["measures"]) == 3
    assert Regime.from_dict(e["regime"]) == y
    assert e["ms"] >= e["oracle_ms"] > 0
    single = prof.merge_entry(None, MaskFeatures.from_dict(e["features"]), "p",
                              {x.name: (x, 1.0, 0.0), y.name: (y, 2.0, 0.0)}, x.name, "kernel")
    assert single["name"] == x.name and single["ms"] == single["oracle_ms"] == 1.0
    merged = prof.merge_entry(single, MaskFeatures.from_dict(e["features"]), "q",
                              {y.name: (y, 1.0, 0.0), x.name: (x, 4.0, 0.0)}, x.name, "kernel")
    # rel: x (1 + 4) / 2 = 2.5, y (2 + 1) / 2 = 1.5
    assert merged["name"] == y.name and merged["oracle_ms"] == 1.0
    assert merged["candidates"][x.name]["rel"] == 2.5 and merged["ms"] == 1.5
    # A regime missing from one mask is no longer eligible.
    z = Regime(block_n=32)
    again = prof.merge_entry(merged, MaskFeatures.from_dict(e["features"]), "s",
                             {z.name: (z, 0.1, 0.0), y.name: (y, 1.0, 0.0)}, x.name, "kernel")
    assert set(again["candidates"]) == {y.name} and again["name"] == y.name


def test_profiler_budget_and_resume(tmp_path):
    cases = [small_case("a", density=0.1, seed=0),
             small_case("b", density=0.9, seed=1, head_dim=128),
             small_case("c", density=0.3, seed=3, block=64)]
    out = tmp_path / "t.json"
    t1 = FakeTimer({})
    res = prof.profile(cases, out=out, arch=90, timer=t1, clock=t1.clock, budget_s=10,
                       progress=None, provenance={"gpu": "NVIDIA H200"})
    assert res.stopped == "budget" and res.profiled == ["a"] and t1.calls == {"a": 48}
    assert len(RegimeTable.load(out)) == 1
    with pytest.raises(FileExistsError, match="--resume"):
        prof.profile(cases, out=out, arch=90, timer=t1, progress=None)
    with pytest.raises(ValueError, match="sm_90, this GPU is sm_80"):
        prof.profile(cases, out=out, arch=80, timer=t1, resume=True, progress=None)
    with pytest.raises(ValueError, match="profiled on NVIDIA H200"):
        prof.profile(cases, out=out, arch=90, timer=t1, resume=True, progress=None,
                     provenance={"gpu": "NVIDIA H100"})
    with pytest.raises(ValueError, match="objective"):
        prof.profile(cases, out=out, arch=90, timer=t1, resume=True, progress=None,
                     objective="kernel")
    t2 = FakeTimer({})
    res = prof.profile(cases, out=out, arch=90, timer=t2, clock=t2.clock, budget_s=1000,
                       resume=True, progress=None, provenance={"gpu": "NVIDIA H200"})
    assert res.skipped == ["a"] and res.profiled == ["b", "c"] and "a" not in t2.calls
    t = RegimeTable.load(out)
    assert len(t) == 3 and t.provenance["corpus"]["masks"] == 3
    assert t.provenance["started"] <= t.provenance["date"]
    t3 = FakeTimer({})
    res = prof.profile(cases, out=out, arch=90, timer=t3, clock=t3.clock, resume=True,
                       progress=None)
    assert res.skipped == ["a", "b", "c"] and t3.calls == {} and len(res.table) == 3
    # Overwrite starts over.
    res = prof.profile(cases[:1], out=out, arch=90, timer=FakeTimer({}), overwrite=True,
                       progress=None)
    assert len(RegimeTable.load(out)) == 1


def test_profiler_survives_failing_regimes(tmp_path):
    bad = candidate_regimes(64, 90)[0]
    cases = [small_case("a", density=0.1, seed=0), small_case("dead", density=0.5, seed=5)]
    timer = FakeTimer({}, fail={bad.name, "dead"})
    log = io.StringIO()
    res = prof.profile(cases, out=tmp_path / "t.json", arch=90, timer=timer, clock=timer.clock,
                       progress=log)
    assert res.profiled == ["a"] and res.failed == ["dead"]
    (e,) = res.table.entries
    assert bad.name not in e["candidates"] and len(e["candidates"]) == 47
    assert "variant failed to build" in log.getvalue()


def test_corpus_from_workloads():
    cases = prof.build_corpus(["wan-1.3b-480p"], ["radial", "random_blocks"], heads=4)
    labels = [c.label for c in cases]
    assert labels[0] == "wan-1.3b-480p/radial"
    assert "wan-1.3b-480p/random_blocks@0.8/b128" in labels
    assert "wan-1.3b-480p/random_blocks@0.3/b64" in labels
    assert len(cases) == 1 + len(prof.DENSITIES) + len(prof.SMALL_BLOCK_DENSITIES)
    assert all(c.head_dim == 128 and c.heads == 4 for c in cases)
    m = next(c for c in cases if c.label.endswith("@0.1/b64")).build()
    assert m.batch_heads == (1, 4) and m.uniform_block_size() == (64, 64)
    assert mask_features(m, head_dim=128, dtype="bfloat16", arch=90, num_q_heads=4,
                         batch=1).density == "5-15%"
    assert len(prof.build_corpus()) == 8 * 12  # six models and two short clips
    clip = prof.build_corpus(["cogvideox-5b-5f"], ["radial"])[0].build()
    assert clip.seq_len_q == 5 * 30 * 45 + 226
    with pytest.raises(ValueError, match="unknown shape"):
        prof.build_corpus(["nope"])
    with pytest.raises(ValueError, match="unknown family"):
        prof.build_corpus(None, ["nope"])


def test_profile_command_without_gpu(tmp_path, capsys):
    import importlib.util

    from tessera.tools.cli import main

    assert main(["profile", "--list", "--shapes", "cogvideox-5b", "--families", "radial"]) == 0
    out = capsys.readouterr().out
    assert "cogvideox-5b/radial" in out and "candidate regimes" in out
    assert main(["profile", "--shapes", "nope"]) == 2
    capsys.readouterr()
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the profiler would run")
    assert main(["profile", "--out", str(tmp_path / "t.json"), "--budget-minutes", "1"]) == 1
    out = capsys.readouterr().out
    assert "profile needs" in out and not (tmp_path / "t.json").exists()


# ---------------------------------------------------------------------------- evaluation
def test_summarize_evaluation_by_hand():
    """Three masks, three regimes, figures worked by hand."""
    recs = [  # times: name -> [kernel_ms, plan_ms]
        dict(label="m1", chosen="A", default="C", exact=True,
             times={"A": [1.0, 0.0], "B": [2.0, 0.0], "C": [1.2, 0.0]}),
        dict(label="m2", chosen="B", default="C", exact=False,
             times={"A": [3.0, 0.0], "B": [1.0, 0.0], "C": [1.5, 0.0]}),
        dict(label="m3", chosen="A", default="C", exact=True,
             times={"A": [1.1, 0.1], "B": [1.0, 0.1], "C": [2.0, 0.1]}),
    ]
    s = prof.summarize_evaluation(recs, "request")
    req, ker = s["request"], s["kernel"]
    # request ratios: m1 1.0, m2 1.0, m3 1.2/1.1
    assert req["masks"] == 3 and req["within_5pct"] == pytest.approx(2 / 3)
    assert req["mean_slowdown"] == pytest.approx((1 + 1 + 1.2 / 1.1) / 3 - 1)
    assert req["worst"] == pytest.approx(1.2 / 1.1)
    # mean ratio per regime: A (1 + 3 + 1.2/1.1)/3, B (2 + 1 + 1)/3, C (1.2 + 1.5 + 2.1/1.1)/3
    assert req["best_fixed"] == "B"
    assert req["gain_vs_best_fixed"] == pytest.approx((2 + 1 + 1.1) / (1 + 1 + 1.2))
    assert req["gain_vs_default"] == pytest.approx((1.2 + 1.5 + 2.1) / (1 + 1 + 1.2))
    assert ker["worst"] == pytest.approx(1.1) and s["exact_keys"] == 2
    assert set(prof.summarize_evaluation(recs, "kernel")) == {"kernel", "exact_keys"}
    text = prof.format_summary(s)
    assert "within 5% of the oracle 67%" in text and "best fixed regime B" in text


def test_evaluate_with_fake_timer_resume_and_budget(tmp_path):
    fav = Regime(block_m=128, block_n=32, split_ratio=2.0, combine_threshold=0.0)
    train = [small_case("a", density=0.1, seed=0)]
    t0 = FakeTimer({"a": fav})
    table = prof.profile(train, out=tmp_path / "t.json", arch=90, timer=t0, clock=t0.clock,
                         progress=None, objective="kernel").table
    # Held out: same features as "a" (so the table's pick applies), one where fav is also the
    # oracle and one where it is not; and a head dim the table lacks (heuristic).
    held = [small_case("h1", density=0.1, seed=10), small_case("h2", density=0.1, seed=11),
            small_case("h3", density=0.1, seed=12, head_dim=128)]
    out = tmp_path / "eval.json"
    t1 = FakeTimer({"h1": fav, "h2": Regime(block_m=64, block_n=32, split_ratio=2.0)})
    doc = prof.evaluate(held, table=table, out=out, arch=90, timer=t1, clock=t1.clock,
                        budget_s=60, progress=None)
    assert [r["label"] for r in doc["records"]] == ["h1", "h2"]  # budget: 48 calls a mask
    r1, r2 = doc["records"]
    assert r1["chosen"] == fav.name and r1["exact"] and r2["chosen"] == fav.name
    assert r1["default"] == default_regime(90, 64, 128.0).name
    assert doc["objective"] == "kernel" and doc["summary"]["kernel"]["within_5pct"] == 0.5
    with pytest.raises(FileExistsError):
        prof.evaluate(held, table=table, out=out, arch=90, timer=t1, progress=None)
    with pytest.raises(ValueError, match="sm_90"):
        prof.evaluate(held, table=table, out=out, arch=80, timer=t1, resume=True,
                      progress=None)
    t2 = FakeTimer({})
    doc = prof.evaluate(held, table=table, out=out, arch=90, timer=t2, clock=t2.clock,
                        resume=True, progress=None)
    assert [r["label"] for r in doc["records"]] == ["h1", "h2", "h3"]
    assert set(t2.calls) == {"h3"}
    r3 = doc["records"][2]
    assert r3["chosen"] == r3["default"] == default_regime(90, 128, 128.0).name
    assert not r3["exact"]
    saved = json.loads(out.read_text())
    assert saved["summary"] == doc["summary"] and saved["format"] == prof.EVAL_FORMAT


def test_heldout_corpus_differs_from_profile_corpus():
    held = prof.build_heldout_corpus(heads=4)
    train = prof.build_corpus(heads=4)
    assert not {c.shape for c in held} & {c.shape for c in train}
    assert {c.family for c in held} == {c.family for c in train}
    m = next(c for c in held if c.label == "cogvideox-5b-9f/topk_pooled@0.2").build()
    assert 0.15 < m.density < 0.3 and m.batch_heads == (1, 4)
    with pytest.raises(ValueError, match="unknown held-out shape"):
        prof.build_heldout_corpus(["wan-1.3b-480p"])


def test_regime_names_parse_back():
    for d in (64, 128):
        for r in candidate_regimes(d, 90):
            assert R.regime_from_name(r.name) == r
    r = Regime(pack_gqa=False, min_split_chunks=3)
    assert R.regime_from_name(r.name) == r
    w = Regime(family="sm90", block_n=128, num_warps=12, stages=3, wide_steps=True)
    assert w.name == "sm90_128x128_w12_s3[wide_steps=True]" and R.regime_from_name(w.name) == w
    for bad in ("", "sm80_128x64", "sm80_128x64_w4_s2[colour=3]", "sm80_100x64_w4_s2",
                "sm80_128x64_w4_s2[split_ratio=x]", "sm80_128x64_w4_s2[wide_steps=True]",
                "sm90_128x128_w8_s3[wide_steps=True]"):
        assert R.regime_from_name(bad) is None
    f = feats(geometry="variable-384+", density="60-100%", seq_len=">128k")
    assert MaskFeatures.from_key(f.key()) == f
    with pytest.raises(ValueError, match="not a feature key"):
        MaskFeatures.from_key("sm90/d128")


def _profiled_entry(f: MaskFeatures, rels: dict[Regime, float], masks: int = 1) -> dict:
    """An entry as the profiler writes it: every candidate's mean relative time."""
    best = min(rels, key=lambda r: (rels[r], r.name))
    return {"features": f.to_dict(), "regime": best.to_dict(), "ms": 1.0, "oracle_ms": 1.0,
            "masks": [f"m{i}" for i in range(masks)],
            "candidates": {r.name: {"ms": v, "kernel_ms": v, "plan_ms": 0.0, "rel": v}
                           for r, v in rels.items()}}


def test_smoothed_lookup_pools_neighbours():
    a, b, c = Regime(), Regime(block_m=64), Regime(block_n=32)
    # Exact key: b wins by a hair on one mask; two neighbours one density step away say a
    # clearly, and b poorly: pooled (weights 1, 0.5, 0.5), a wins.
    here = feats(density="15-30%")
    t = RegimeTable([
        _profiled_entry(here, {a: 1.02, b: 1.0, c: 1.5}),
        _profiled_entry(feats(density="5-15%"), {a: 1.0, b: 1.3, c: 1.5}),
        _profiled_entry(feats(density="30-60%"), {a: 1.0, b: 1.3, c: 1.5}),
    ], {})
    assert t.lookup_exact(here) == b  # the entry's own pick is kept in the file
    assert t.lookup(here) == a
    # Evidence an entry holds many masks for outweighs a neighbour's single mask.
    t2 = RegimeTable([
        _profiled_entry(here, {a: 1.1, b: 1.0, c: 1.5}, masks=4),
        _profiled_entry(feats(density="5-15%"), {a: 1.0, b: 1.3, c: 1.5}),
    ], {})
    assert t2.lookup(here) == b
    # Another geometry answers too (from the nearest evidence), another head dim does not.
    assert t.lookup(feats(geometry="variable-128")) == a
    assert t.lookup(feats(head_dim=64)) is None
    # A regime some weighted entry never measured is not eligible.
    t3 = RegimeTable([
        _profiled_entry(here, {a: 1.1, c: 1.0}),
        _profiled_entry(feats(density="5-15%"), {a: 1.0, b: 1.3}),
    ], {})
    assert t3.lookup(here) == a


def test_rescore_evaluation_uses_the_tables_lookup():
    a, b = Regime(), Regime(block_m=64)
    f = feats(arch=90, head_dim=64)
    t = RegimeTable([_profiled_entry(f, {a: 1.0, b: 1.2})], {})
    doc = {"objective": "kernel", "records": [
        dict(label="x", key=f.key(), chosen=b.name, default=b.name, exact=False,
             times={a.name: [1.0, 0.0], b.name: [2.0, 0.0]}),
        dict(label="y", key=feats(arch=90, head_dim=96).key(), chosen=a.name, default=b.name,
             exact=False, times={a.name: [1.0, 0.0], b.name: [3.0, 0.0]})]}
    new = prof.rescore_evaluation(doc, t)
    assert [r["chosen"] for r in new["records"]] == [a.name, b.name]  # y: heuristic
    assert new["records"][0]["exact"] and not new["records"][1]["exact"]
    assert new["summary"]["kernel"]["within_5pct"] == 0.5


@pytest.mark.gpu
def test_short_profile_on_the_gpu_writes_a_valid_table(tmp_path, capsys):
    """``profile --budget-minutes 1`` on a small corpus: a loadable table for this GPU whose
    entries hold measured candidates. (Run on the H200 as part of the full profile, call B of
    the second session; this short form was written after the session's device time ran out.)"""
    pytest.importorskip("torch")
    from tessera.tools.cli import main

    out = tmp_path / "t.json"
    rc = main(["profile", "--out", str(out), "--budget-minutes", "1", "--shapes",
               "cogvideox-5b", "--families", "radial,spatial_temporal", "--reps", "3"])
    assert rc == 0, capsys.readouterr().out
    t = RegimeTable.load(out)
    assert len(t) >= 1 and t.gpu and t.arch == D.device_arch()
    for e in t.entries:
        assert len(e["candidates"]) >= 18 and e["oracle_ms"] > 0
        assert e["ms"] >= e["oracle_ms"] * 0.999
        assert e["name"] in e["candidates"]


# ---------------------------------------------------------------------------- kernel families
@pytest.mark.gpu
def test_device_measures_on_the_gpu():
    """The mask_pairs kernel measures device masks exactly as the host path measures the same
    selections (uniform, ragged, variable with a heavy row, per batch and head, empty)."""
    import cupy as cp

    rng = np.random.default_rng(11)
    variable = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(8, 300, 40))],
                    kv_bounds=np.r_[0, np.cumsum(rng.integers(8, 200, 70))])
    heavy = rng.random((3, 40, 70)) < 0.1
    heavy[2, 7] = True
    cases = [(rng.random((12, 256, 256)) < 0.1, dict(block_size=128)),
             (rng.random((2, 30, 33)) < 0.3, dict(block_size=64, seq_len_q=1900,
                                                  seq_len_kv=2100)),
             (heavy, variable), (rng.random((2, 3, 40, 70)) < 0.5, variable),
             (np.zeros((2, 5, 5), bool), dict(block_size=64))]
    for dense, geo in cases:
        want = mask_measures(BlockMask.from_dense(dense, **geo))
        assert mask_measures(BlockMask.from_dense(cp.asarray(dense), **geo)) == want


def test_sm90_regimes_are_checked_and_map_to_the_hopper_variant():
    r = Regime(family="sm90", block_m=128, num_warps=8, block_n=128, stages=3)
    v = r.variant(128, bf16=False)
    assert v.source == "bsa_sm90.cu" and v.threads == 256
    assert dict(v.macros) == {"BM": 128, "BN": 128, "D": 128, "STAGES": 3, "BF16": 0}
    assert Regime().variant(64).source == "bsa_sm80.cu" and Regime().variant(64).threads == 128
    assert r.runs_on(90) and not r.runs_on(80) and not r.runs_on(100) and Regime().runs_on(80)
    assert R.regime_from_name(r.name) == r
    for bad, word in ((dict(block_m=96, num_warps=6), "block_m 64 or 128"),
                      (dict(num_warps=4), "one warp per 16 rows"),
                      (dict(block_n=32), "block_n 64 or 128"),
                      (dict(stages=2), "stages >= 3")):
        with pytest.raises(ValueError, match=word):
            r.with_(**bad)
    with pytest.raises(ValueError, match="family must be one of"):
        Regime(family="sm70")
    # Four warps beyond the rows' own: the warp-specialized variant (a producer warpgroup).
    ws = r.with_(num_warps=12)
    assert ws.producer and not r.producer and not Regime().producer
    assert ws.name == "sm90_128x128_w12_s3" and R.regime_from_name(ws.name) == ws
    assert ws.variant(128).threads == 384 and dict(ws.variant(128).macros)["PRODUCER"] == 1
    assert "PRODUCER" not in dict(r.variant(128).macros)
    with pytest.raises(ValueError, match="plus 4 for a producer"):
        r.with_(num_warps=10)


def test_defaults_per_architecture():
    """sm_90 takes the Hopper family (warp-specialized 128x128 tiles; at head dim 64 64x128
    producer tiles, two CTAs an SM; 64-row tiles and 64-key steps for small query blocks);
    every other GPU the portable family."""
    assert default_regime(90, 128).name == "sm90_128x128_w12_s3[combine_threshold=0.0]"
    assert default_regime(90, 64).name == "sm90_64x128_w8_s3[combine_threshold=0.0]"
    assert default_regime(90, 64).variant(64).min_blocks == 2
    assert default_regime(90, 64).variant(64, tma=True).min_blocks == 2
    assert default_regime(90, 96).producer
    # Small query blocks: 64-row tiles, with a producer warpgroup (two CTAs an SM) at head dim
    # 128 only.
    assert default_regime(90, 128, q_block=64).name == "sm90_64x64_w8_s3[combine_threshold=0.0]"
    assert default_regime(90, 128, q_block=64).variant(128).min_blocks == 2
    for d in (64, 96):
        assert default_regime(90, d, q_block=64).name == "sm90_64x64_w4_s3[combine_threshold=0.0]"
    for arch in (80, 86, 89, 100, None):
        assert default_regime(arch, 128).family == "sm80"
    # The portable family: 128-row tiles at every head dim (two row tiles a warp), 64-row ones
    # where 128 rows do not fit (sm_86/sm_89 at head dim 128) or query blocks are small.
    for arch in (80, 100, None):
        for d in (64, 96, 128):
            assert default_regime(arch, d).name == "sm80_128x64_w4_s2[combine_threshold=0.0]"
    assert default_regime(89, 64).block_m == 128 and default_regime(89, 128).block_m == 64
    assert default_regime(80, 64, q_block=64).block_m == 64
    for arch in (80, 86, 89, 90, 100):
        for d in (64, 96, 128):
            assert R.regime_fits(default_regime(arch, d), d, arch)


def test_packed_keys_default_on_ragged_key_geometry():
    """sm_90 takes the packed key walk with 64-row tiles where key blocks end mid-step (top-k
    cubes with edge cubes), not on aligned or long blocks, never with 128-row tiles (their walk
    copies by TMA: variable clusters ran faster unpacked) and never off sm_90."""
    from tessera.tools.workloads import WORKLOADS, example_mask

    aligned = np.arange(0, 4097, 128)
    assert not R.blocks_ragged(aligned, 128) and not R.blocks_ragged(aligned, 64)
    cubes = np.array([0, 64, 128, 144, 208, 272, 288])  # a third of them 16-token edge cubes
    assert R.blocks_ragged(cubes, 64)
    assert not R.blocks_ragged(np.r_[np.arange(0, 20 * 64 + 1, 64), 20 * 64 + 16], 64)  # 1/21
    tiles = np.arange(0, 288 * 20 + 1, 288)  # long blocks: spans run over several of them
    assert not R.blocks_ragged(tiles, 128)
    assert not R.blocks_ragged(np.array([0]), 64)  # no key blocks
    assert default_regime(90, 128, 64.0, cubes).pack_keys
    assert not default_regime(90, 128, 64.0, aligned).pack_keys
    assert not default_regime(90, 128, 150.0, cubes).pack_keys  # 128-row tiles: TMA instead
    assert default_regime(90, 128, 64.0, cubes) == default_regime(90, 128, 64.0).with_(
        pack_keys=True)
    for arch in (80, 89, 100, None):
        assert not default_regime(arch, 128, 64.0, cubes).pack_keys
    for shape in ("cogvideox-5b", "hunyuan-720p"):  # top-k cubes 40% / 19% ragged at 64
        w = WORKLOADS[shape]
        for family, packed in (("topk_pooled", True), ("semantic_clusters", False),
                               ("random_blocks", False), ("sliding_tile", False)):
            m = example_mask(w, family, heads=2, head_dim=w.head_dim).mask
            r = R.select_regime(m, arch=90, head_dim=w.head_dim, dtype=np.dtype("float16"),
                                num_q_heads=w.heads, batch=1)
            assert r.pack_keys == packed, (shape, family)
    w = WORKLOADS["cogvideox-5b"]
    m = example_mask(w, "topk_pooled", heads=w.heads, head_dim=w.head_dim).mask
    r = R.select_regime(m, arch=90, head_dim=w.head_dim, dtype=np.dtype("float16"),
                        num_q_heads=w.heads, batch=1)
    assert tessera.plan(m, num_q_heads=w.heads, head_dim=w.head_dim, arch=90).regime == r


def test_aligned_tiles_chosen_where_they_pay(monkeypatch):
    """The sm90 heuristic aligns its 128-row tiles for the semantic clusters (variable blocks
    whose neighbours share keys) and not for random variable blocks at low density, nor off
    sm_90; masks whose query blocks are not ragged never pay for the estimate."""
    from tessera.mask import BlockMask
    from tessera.tools.workloads import WORKLOADS, example_mask

    def pick(m, arch=90):
        return R.select_regime(m, arch=arch, head_dim=64, dtype=np.dtype("float16"),
                               num_q_heads=2, batch=1)

    for shape in ("wan-1.3b-480p", "cogvideox-5b"):
        m = example_mask(WORKLOADS[shape], "semantic_clusters", heads=2, head_dim=64).mask
        assert R.align_pays(m, 128), shape
        assert pick(m).align_tiles and pick(m).block_m == 128 and not pick(m).pack_keys, shape
        assert not pick(m, arch=80).align_tiles
        assert tessera.plan(m, num_q_heads=2, head_dim=64, arch=90).regime.align_tiles
    rng = np.random.default_rng(0)
    qb = np.r_[0, np.cumsum(rng.integers(100, 200, 60))]
    sparse = BlockMask.from_dense(rng.random((2, 60, 60)) < 0.3, q_bounds=qb, kv_bounds=qb)
    assert R.blocks_ragged(qb, 128) and not R.align_pays(sparse, 128)
    assert not pick(sparse).align_tiles
    dense = BlockMask.from_dense(rng.random((2, 60, 60)) < 0.95, q_bounds=qb, kv_bounds=qb)
    assert R.align_pays(dense, 128) and pick(dense).align_tiles

    def no_estimate(*a, **k):
        raise AssertionError("estimated the tilings of a mask with aligned query blocks")

    monkeypatch.setattr(tessera.runtime.mapping, "tiling_pairs", no_estimate)
    for family in ("sliding_tile", "random_blocks"):
        m = example_mask(WORKLOADS["wan-1.3b-480p"], family, heads=2, head_dim=64).mask
        assert not R.align_pays(m, 128) and not pick(m).align_tiles, family
    # Small query blocks take the 64-row heuristic, which never asks.
    m = example_mask(WORKLOADS["wan-1.3b-480p"], "topk_pooled", heads=2, head_dim=64).mask
    assert pick(m).block_m == 64 and not pick(m).align_tiles


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


def test_device_properties_cached_per_device(monkeypatch):
    """Name, architecture and SM count of the current device are read once per device; a failed
    read gives the 'no GPU' answer and is retried (the name's failure is remembered)."""
    import types

    import tessera._array as A

    reads = {"device": 0}

    class Device:
        def __init__(self, dev):
            reads["device"] += 1
            self.compute_capability = "90"
            self.attributes = {"MultiProcessorCount": 132 if dev == 0 else 114}

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=Device, runtime=types.SimpleNamespace(
            getDeviceProperties=lambda dev: {"name": b"NVIDIA H200"})))
    monkeypatch.setattr(A, "cupy_or_none", lambda: fake)
    monkeypatch.setattr(D, "_gpu_names", {})
    monkeypatch.setattr(D, "_device_archs", {})
    monkeypatch.setattr(D, "_device_sms", {})
    dev = {"id": 0}
    monkeypatch.setattr(D, "_current_device_id", lambda: dev["id"])
    assert (REAL_GPU_NAME(), D.device_arch(), D.device_sm_count()) == ("NVIDIA H200", 90, 132)
    assert D.device_arch() == 90 and D.device_sm_count() == 132 and reads["device"] == 2  # cached
    dev["id"] = 1
    assert D.device_sm_count() == 114
    dev["id"] = None
    assert (REAL_GPU_NAME(), D.device_arch(), D.device_sm_count()) == (None, None, 0)
    dev["id"] = 2
    monkeypatch.setattr(fake.cuda, "Device", lambda d: 1 / 0)
    assert D.device_arch() is None and D.device_sm_count() == 0 and 2 not in D._device_archs


def test_table_still_answers_masks_the_heuristic_would_pack():
    """A ragged key geometry makes the heuristic pack its keys (never split), but whether the
    table is asked is decided on the unpacked form: masks with few tasks per slot keep the
    table's pick."""
    rng = np.random.default_rng(3)
    kb = np.r_[0, np.cumsum(rng.integers(20, 120, 28))]
    m = BlockMask.from_dense(rng.random((2, 32, kb.size - 1)) < 0.3, block_size=None,
                             q_bounds=np.arange(0, 32 * 64 + 1, 64), kv_bounds=kb)
    assert heuristic(m).pack_keys  # 64-token query blocks, keys ragged against 64-key steps
    try:
        assert R.use_table(table_for(m)) is not None
        assert plan90(m).regime == PICK
    finally:
        R.use_table(None)
    assert plan90(m).regime == heuristic(m)
