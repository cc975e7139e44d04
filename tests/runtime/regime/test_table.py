"""CPU tests of regime tables (tessera.runtime.regime.table): file format, validation and lookup."""

from __future__ import annotations

import json
import os

import pytest

from tessera.runtime import regime as R
from tessera.runtime.regime import MaskFeatures, Regime, RegimeTable
from tests.runtime.regime.regime_helpers import (
    _profiled_entry,
    _write,
    clean_selection,  # noqa: F401 (autouse fixture)
    entry,
    feats,
)


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
    # The nearest rule answers exactly the groups it has entries of.
    assert t.covers(90, 64, "bfloat16", "variable-64")
    assert not t.covers(90, 64, "bfloat16", "variable-128")
    assert not t.covers(90, 128, "bfloat16", "uniform-64x64") and not t.covers(80, 128, "bfloat16")
    assert not RegimeTable([], {}).covers(90, 128, "bfloat16")


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
        **o["entries"][0]["regime"], "block_n": "64"}}]}, "block_n must be an int"),
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


def test_gpu_slug():
    assert R.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert R.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert R.gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"


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
    # Another block size of the same kind answers too (from the nearest evidence); the other
    # kind of geometry (variable blocks) and another head dim do not.
    assert t.lookup(feats(geometry="uniform-64x64")) == a
    assert t.lookup(feats(geometry="variable-128")) is None
    assert t.lookup(feats(head_dim=64)) is None
    # covers says the same of whole groups, so a plan skips measuring a mask none answers.
    g = feats().geometry
    assert g.startswith("uniform-") and t.covers(90, 128, "bfloat16", g)
    assert t.covers(90, 128, "bfloat16", "uniform-64x64")
    assert not t.covers(90, 128, "bfloat16", "variable-128")
    assert t.covers(90, 128, "bfloat16") and not t.covers(90, 64, "bfloat16")
    # A regime some weighted entry never measured is not eligible.
    t3 = RegimeTable([
        _profiled_entry(here, {a: 1.1, c: 1.0}),
        _profiled_entry(feats(density="5-15%"), {a: 1.0, b: 1.3}),
    ], {})
    assert t3.lookup(here) == a
