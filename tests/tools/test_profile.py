"""CPU tests of the profiler and its evaluation (tessera.tools.profile), with a fake timer."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import tessera
from tessera import BlockMask
from tessera.runtime.regime import (
    MaskFeatures,
    Regime,
    RegimeTable,
    candidate_regimes,
    default_regime,
    mask_features,
    regime_from_name,
)
from tessera.tools import profile as prof
from tests.runtime.regime.regime_helpers import (
    _profiled_entry,
    clean_selection,  # noqa: F401 (autouse fixture)
    feats,
    planned_heuristic,
)


def small_case(label: str, *, density: float, seed: int, head_dim: int = 64,
               shape: str = "toy", family: str = "random_blocks", block: int = 128) -> prof.Case:
    def build():
        dense = np.random.default_rng(seed).random((2, 8, 8)) < density
        dense[:, :, 0] = True
        return BlockMask.from_dense(dense, block_size=block)
    return prof.Case(label, shape, family, head_dim, 2, build)


def planned_default(case: prof.Case) -> str:
    """The profile's and the evaluation's ``default`` for ``case``: what its plan takes here
    without a table."""
    return planned_heuristic(case.build(), 90, case.head_dim, case.heads).name


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
    """--kernel-families sm90 times only that family (50 candidates instead of 74 on sm_90),
    records the limit, refuses to resume a table made with another, and refuses a limit that
    leaves no candidate; the evaluation's oracle is limited the same way."""
    assert len(candidate_regimes(128, 90, ("sm90",))) == 34
    assert len(candidate_regimes(64, 90, ("sm90",))) == 50
    assert {r.family for r in candidate_regimes(64, 90, ("sm90",))} == {"sm90"}
    assert candidate_regimes(128, 80, ("sm90",)) == []
    fav = Regime(family="sm90", block_m=64, block_n=64, num_warps=20, stages=3,
                 combine_threshold=0.0)
    cases = [small_case("a", density=0.2, seed=0), small_case("b", density=0.6, seed=1)]
    timer = FakeTimer({"a": fav})
    out = tmp_path / "t.json"
    res = prof.profile(cases[:1], out=out, arch=90, timer=timer, clock=timer.clock,
                       progress=None, kernel_families=("sm90",))
    assert res.stopped == "done" and timer.calls == {"a": 50}
    t = RegimeTable.load(out)
    assert t.provenance["corpus"]["kernel_families"] == ["sm90"]
    assert Regime.from_dict(t.entries[0]["regime"]) == fav
    assert all(name.startswith("sm90_") for name in t.entries[0]["candidates"])
    with pytest.raises(ValueError, match="kernel_families"):
        prof.profile(cases, out=out, arch=90, timer=timer, progress=None, resume=True)
    res = prof.profile(cases, out=out, arch=90, timer=timer, clock=timer.clock, progress=None,
                       resume=True, kernel_families=["sm90"])
    assert res.profiled == ["b"] and timer.calls["b"] == 50
    with pytest.raises(ValueError, match="no candidate regimes"):
        prof.profile(cases, out=tmp_path / "u.json", arch=80, timer=timer, progress=None,
                     kernel_families=("sm90",))
    t2 = FakeTimer({"h": fav})
    doc = prof.evaluate([small_case("h", density=0.2, seed=5)], table=RegimeTable.load(out),
                        out=tmp_path / "e.json", arch=90, timer=t2, clock=t2.clock,
                        progress=None, kernel_families=("sm90",))
    assert t2.calls == {"h": 50} and doc["kernel_families"] == ["sm90"]


def test_profile_limited_to_combine_thresholds(tmp_path):
    """--combine-thresholds 0 times only the one-sync mapping policy (32 sm90 candidates on
    sm_90), records it, refuses to resume a table profiled with every policy (or with none
    recorded), and limits the evaluation's oracle the same way."""
    assert len(candidate_regimes(128, 90, ("sm90",), (0.0,))) == 22
    assert len(candidate_regimes(64, 90, ("sm90",), (0.0,))) == 32
    assert {r.combine_threshold for r in candidate_regimes(64, 90, None, (0.0,))} == {0.0}
    assert candidate_regimes(64, 90, None, (0.5,)) == []
    fav = Regime(family="sm90", block_m=64, block_n=64, num_warps=4, stages=3,
                 combine_threshold=0.0)
    cases = [small_case("a", density=0.2, seed=0), small_case("b", density=0.6, seed=1)]
    timer = FakeTimer({"a": fav})
    out = tmp_path / "t.json"
    kw = dict(arch=90, timer=timer, clock=timer.clock, progress=None, kernel_families=("sm90",))
    prof.profile(cases[:1], out=out, combine_thresholds=(0.0,), **kw)
    assert timer.calls == {"a": 32}
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
    assert t2.calls == {"h": 32} and doc["combine_thresholds"] == [0.0]


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
    # 32 candidates: 5 tile shapes plain, packed and (128 rows) aligned, each in 1-3 policies,
    # the 128x128 tiles with wide steps and the rings' one-ring form: 14 distinct plans at 16+
    # tasks a slot.
    assert timer.calls == {"a": 14}
    entry = RegimeTable.load(out).entries[0]
    times = {n: c["ms"] if isinstance(c, dict) else c for n, c in entry["candidates"].items()}
    assert len(times) == 32
    by_shape: dict[str, set] = {}
    for name, t in times.items():
        r = regime_from_name(name)
        by_shape.setdefault(r.with_(split_ratio=1e9).name, set()).add(str(t))
    assert len(by_shape) == 14
    assert all(len(v) == 1 for v in by_shape.values())  # twins share their timing
    many = FakeTimer({"a": fav})
    prof.profile([case], out=tmp_path / "u.json", timer=many, clock=many.clock,
                 provenance=dict(sms=1000), **kw)
    assert many.calls == {"a": 32}
    t2 = FakeTimer({"h": fav})
    prof.evaluate([eight_heads("h", 5)], table=RegimeTable.load(out),
                  out=tmp_path / "e.json", timer=t2, clock=t2.clock, provenance=dict(sms=1),
                  **kw)
    assert t2.calls == {"h": 14}


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
    assert "sm_90 head dim 64: 32 candidate regimes" in out
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
    assert res.timings == 148 and timer.calls == {"a": 74, "b": 74}  # 24 sm80 + 50 sm90
    t = RegimeTable.load(out)
    assert len(t) == 2 and t.arch == 90 and t.gpu == "NVIDIA H200"
    assert t.provenance["corpus"]["masks"] == 2 and t.provenance["driver"] == "x"
    assert t.provenance["date"] and t.provenance["tessera"] == tessera.__version__
    by_mask = {e["masks"][0]: e for e in t.entries}
    a, b = by_mask["a"], by_mask["b"]
    assert Regime.from_dict(a["regime"]) == fav and a["name"] == fav.name
    assert a["ms"] == pytest.approx(a["oracle_ms"]) == pytest.approx((1.0 + 0.128 + 0.0032)
                                                                      * 0.8 + 0.05, abs=1e-4)
    assert a["default"] == planned_default(cases[0]) and a["default_ms"] > a["ms"]
    assert len(a["candidates"]) == 74 and a["candidates"][fav.name]["rel"] == 1.0
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
    assert res.stopped == "budget" and res.profiled == ["a"] and t1.calls == {"a": 74}
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
    assert bad.name not in e["candidates"] and len(e["candidates"]) == 73
    assert "variant failed to build" in log.getvalue()


def test_corpus_from_workloads():
    cases = prof.build_corpus(["wan-1.3b-480p"], ["radial", "random_blocks"], heads=4)
    labels = [c.label for c in cases]
    assert labels[0] == "wan-1.3b-480p/radial"
    assert "wan-1.3b-480p/random_blocks@0.8/b128" in labels
    assert "wan-1.3b-480p/random_blocks@0.3/b64" in labels
    assert "wan-1.3b-480p/random_blocks@0.1/v32-256" in labels
    assert len(cases) == 1 + len(prof.DENSITIES) + len(prof.SMALL_BLOCK_DENSITIES) + len(
        prof.VARIABLE_DENSITIES)
    assert all(c.head_dim == 128 and c.heads == 4 for c in cases)
    m = next(c for c in cases if c.label.endswith("@0.1/b64")).build()
    assert m.batch_heads == (1, 4) and m.uniform_block_size() == (64, 64)
    assert mask_features(m, head_dim=128, dtype="bfloat16", arch=90, num_q_heads=4,
                         batch=1).density == "5-15%"
    v = next(c for c in cases if c.label.endswith("@0.3/v32-256")).build()
    sizes = np.diff(v.q_bounds)[:-1]  # the variable geometry packed keys and aligned tiles are for
    assert np.array_equal(v.q_bounds, v.kv_bounds) and v.uniform_block_size() is None
    assert sizes.min() >= 1 and sizes.max() <= 256 and np.median(sizes) > 100
    assert mask_features(v, head_dim=128, dtype="bfloat16", arch=90, num_q_heads=4,
                         batch=1).geometry.startswith("variable-")
    # Six models and two short clips (7 families: 15 cases each), and text-free masks for the
    # five shapes with text.
    assert len(prof.build_corpus()) == 8 * 15 + 5 * 4
    assert not any(c.label.endswith("-textless") for c in cases)  # Wan has no text tokens


def test_corpus_has_uniform_masks_for_shapes_with_text():
    """A shape with text tokens gives variable geometries; its text-free masks give the uniform
    ones the tables answer for callers who cut the whole sequence into equal blocks."""
    cases = prof.build_corpus(["cogvideox-5b"], ["random_blocks"], heads=4)
    textless = [c for c in cases if c.label.endswith("-textless")]
    assert [c.label for c in textless] == [
        f"cogvideox-5b/random_blocks@{d:g}/b{b}-textless"
        for b in (128, 64) for d in prof.TEXTLESS_DENSITIES]
    for c in textless:
        m = c.build()
        geometry = mask_features(m, head_dim=64, dtype="bfloat16", arch=90, num_q_heads=4,
                                 batch=1).geometry
        block = int(c.label.split("/b")[1].split("-")[0])
        assert geometry == f"uniform-{block}x{block}", c.label
        assert m.seq_len_q == 17776 and m.batch_heads == (1, 4)
    texted = next(c for c in cases if c.label == "cogvideox-5b/random_blocks@0.1/b128").build()
    assert texted.uniform_block_size() is None  # the text block: a variable geometry
    held = [c.label for c in prof.build_heldout_corpus(heads=4) if c.label.endswith("-textless")]
    assert held and all(label.split("/")[0] in ("hunyuan-540p", "cogvideox-5b-9f")
                        for label in held)
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


def test_summarize_evaluation_by_hand():
    """Three masks, three regimes, figures worked by hand."""
    recs = [  # times: name -> [kernel_ms, plan_ms]
        dict(label="m1", shape="s1", chosen="A", default="C", exact=True,
             times={"A": [1.0, 0.0], "B": [2.0, 0.0], "C": [1.2, 0.0]}),
        dict(label="m2", shape="s1", chosen="B", default="C", exact=False,
             times={"A": [3.0, 0.0], "B": [1.0, 0.0], "C": [1.5, 0.0]}),
        dict(label="m3", shape="s2", chosen="A", default="C", exact=True,
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
    # the heuristic (C) alone: m1 1.2, m2 1.5, m3 2.1/1.1 against the oracle
    assert req["default_within_5pct"] == 0 and req["default_worst"] == pytest.approx(2.1 / 1.1)
    assert ker["default_within_5pct"] == 0 and ker["default_worst"] == pytest.approx(2.0)
    assert set(prof.summarize_evaluation(recs, "kernel")) == {"kernel", "exact_keys"}
    assert req["by_shape"] == {"s1": [2, 2, 0], "s2": [1, 0, 0]}
    text = prof.format_summary(s)
    assert "within 5% of the oracle 67%" in text and "best fixed regime B" in text
    assert "the heuristic alone: within 5% 0%, worst x1.91" in text
    assert "by shape, within 5% (table / heuristic): s1 2/2 0/2; s2 0/1 0/1" in text


def test_the_request_objective_compares_what_requests_run():
    """A request never splits a task, so the request objective times every regime by its
    never-split form: a split policy's timing (its host planning included) is neither the
    oracle nor what the heuristic's pick costs a request; kernel time keeps every form."""
    plain = "sm90_128x128_w12_s3[combine_threshold=0.0]"
    never = prof.request_form(plain)
    assert never == "sm90_128x128_w12_s3[combine_threshold=0.0,split_ratio=1000000000.0]"
    packed = "sm90_64x64_w8_s3[combine_threshold=0.0,pack_keys=True]"
    assert prof.request_form(packed) == packed and prof.request_form("A") == "A"
    split2 = "sm90_128x128_w12_s3[combine_threshold=0.0,split_ratio=2.0]"
    rec = dict(label="m", chosen=split2, default=plain, exact=True,
               times={plain: [0.5, 3.0], never: [1.0, 0.2], split2: [0.4, 3.0],
                      packed: [1.1, 0.2]})
    s = prof.summarize_evaluation([rec], "request")
    # requests run `never` for both picks: the oracle among never (1.2) and packed (1.3)
    assert s["request"]["within_5pct"] == 1 and s["request"]["default_within_5pct"] == 1
    assert s["request"]["worst"] == pytest.approx(1.0)
    assert s["kernel"]["worst"] == pytest.approx(1.0)  # split2's 0.4 is the kernel oracle
    assert s["kernel"]["default_worst"] == pytest.approx(0.5 / 0.4)


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
                        budget_s=100, progress=None)
    assert [r["label"] for r in doc["records"]] == ["h1", "h2"]  # budget: 74 calls a mask
    assert all(isinstance(r["aligns"], bool) for r in doc["records"])
    # Whether the packed walk pays, for each sm90 tile shape among the candidates.
    assert all(set(r["packs"]) == {"64x64", "64x128", "128x64", "128x128", "192x128"}
               and all(isinstance(p, bool) for p in r["packs"].values())
               for r in doc["records"])
    r1, r2 = doc["records"]
    assert r1["chosen"] == fav.name and r1["exact"] and r2["chosen"] == fav.name
    assert r1["default"] == planned_default(held[0])
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
    # A plain 128-row sm90 pick on a mask whose estimate said aligned tiles pay is rescored as
    # the plan takes it (aligned); records without the flag keep the pick.
    plain = Regime(family="sm90", block_m=128, block_n=128, num_warps=12, stages=3,
                   combine_threshold=0.0)
    aligned = plain.with_(align_tiles=True)
    t = RegimeTable([_profiled_entry(f, {plain: 1.0, aligned: 1.1})], {})
    times = {plain.name: [1.5, 0.0], aligned.name: [1.0, 0.0]}
    doc = {"objective": "kernel", "records": [
        dict(label="c", key=f.key(), chosen=plain.name, default=plain.name, exact=True,
             aligns=True, times=times),
        dict(label="r", key=f.key(), chosen=plain.name, default=plain.name, exact=True,
             times=times)]}
    assert [r["chosen"] for r in prof.rescore_evaluation(doc, t)["records"]] == [
        aligned.name, plain.name]
    # Where the estimate said the packed walk pays for the pick's tile shape, the pick is
    # rescored packed (the default split policy, as profiled), and a packed pick where it does
    # not pays walks span by span; shapes not recorded keep the pick's walk.
    packed = plain.with_(pack_keys=True)
    t = RegimeTable([_profiled_entry(f, {plain.with_(split_ratio=2.0): 1.0})], {})
    times = {plain.with_(split_ratio=2.0).name: [1.5, 0.0], packed.name: [1.0, 0.0]}
    doc = {"objective": "kernel", "records": [
        dict(label=k, key=f.key(), chosen=packed.name, default=packed.name, exact=True,
             aligns=False, packs=p, times=times)
        for k, p in (("p", {"128x128": True}), ("s", {"128x128": False}), ("o", {"64x64": True}))]}
    assert [r["chosen"] for r in prof.rescore_evaluation(doc, t)["records"]] == [
        packed.name, plain.with_(split_ratio=2.0).name, plain.with_(split_ratio=2.0).name]
    t = RegimeTable([_profiled_entry(f, {packed: 1.0})], {})
    doc["records"][1]["times"] = {**times, plain.name: [1.2, 0.0]}
    assert prof.rescore_evaluation(doc, t)["records"][1]["chosen"] == plain.name
