"""The backward regimes (runtime/regime/backward.py), a table's backward section and the
selection that reads it, with a fake timer through the profiler (CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tessera
from tessera import BlockMask
from tessera.runtime import regime as R
from tessera.runtime.regime import BackwardRegime, RegimeTable
from tessera.runtime.regime.backward import (backward_regime_from_name,
                                             candidate_backward_regimes, default_backward_regime)
from tessera.tools import profile as prof
from tests.runtime.regime.regime_helpers import clean_selection  # noqa: F401 (autouse fixture)

ATOMIC = BackwardRegime("sm90", 128, "atomics", True)
PASSES_CPA = BackwardRegime("sm90", 128, "passes", False)


def test_backward_regimes_check_their_fields_and_names():
    """Every candidate's name parses back to it; a regime that no kernel runs is refused
    naming the field and what it takes."""
    cands = candidate_backward_regimes(90)
    assert len(cands) == 6 and len({r.name for r in cands}) == 6
    assert all(backward_regime_from_name(r.name) == r for r in cands)
    assert candidate_backward_regimes(86) == [BackwardRegime("sm80", 64, "passes", False)]
    assert backward_regime_from_name("sm90_128x128_w12_s3") is None
    with pytest.raises(ValueError, match="128-row tasks only"):
        BackwardRegime("sm90", 64, "atomics", True)
    with pytest.raises(ValueError, match="block_m must be one of"):
        BackwardRegime("sm90", 192, "passes", True)
    with pytest.raises(ValueError, match="tma=True"):
        BackwardRegime("sm80", 64, "passes", True)
    with pytest.raises(ValueError, match="dq must be one of"):
        BackwardRegime("sm90", 128, "atomic", True)
    with pytest.raises(TypeError, match="block_m must be an int"):
        BackwardRegime("sm90", 128.0, "passes", True)
    assert ATOMIC.kernels(128, True, 90)[1] is None  # dQ summed by the dK/dV kernel
    assert PASSES_CPA.kernels(128, True, 90)[1].kernel == "bsa_bwd_dq_sm90"


def test_the_heuristic_default():
    """Hopper: 128-row tasks with dQ by atomics, 64-row tasks (two passes) for small blocks on
    both axes, the two passes when deterministic; the portable kernels elsewhere."""
    assert default_backward_regime(90, 128, 128) == ATOMIC
    assert default_backward_regime(90, 64, 128).block_m == 128
    assert default_backward_regime(90, 64, 64) == BackwardRegime("sm90", 64, "passes", True)
    assert default_backward_regime(90, 128, 128, deterministic=True).dq == "passes"
    assert default_backward_regime(90, 128, 128, portable=True).family == "sm80"
    assert default_backward_regime(None, 128, 128).family == "sm80"


def _case(label, density, seed, block=128):
    def build():
        dense = np.random.default_rng(seed).random((2, 8, 8)) < density
        dense[:, :, 0] = True
        return BlockMask.from_dense(dense, block_size=block)
    return prof.Case(label, "toy", "random_blocks", 64, 2, build)


class FakeBackwardTimer:
    """Passes by cp.async 25% faster than the rest on every mask; 64-row tasks slower."""

    def __call__(self, case, mask, regime):
        assert isinstance(regime, BackwardRegime)
        t = 1.0 + regime.block_m / 1000 + (0.1 if regime.tma else 0.0)
        return (0.75 * t if regime == PASSES_CPA else t), 0.02


def _profiled(tmp_path, forward=True):
    out = tmp_path / "t.json"
    if forward:  # a table with forward entries first: the backward profile keeps them
        entry = {"features": {"arch": 90, "head_dim": 64, "dtype": "bfloat16",
                              "geometry": "uniform-128x128", "seq_len": "<=16k",
                              "density": "15-30%", "imbalance": "<1.5", "batch_heads": "<=16"},
                 "regime": tessera.Regime(family="sm90", block_m=128, block_n=128, num_warps=12,
                                          stages=3, combine_threshold=0.0).to_dict(),
                 "ms": 1.0, "oracle_ms": 1.0}
        RegimeTable([entry], {"gpu": "Fake GPU", "arch": 90}).save(out)
    cases = [_case("a", 0.2, 0), _case("b", 0.5, 1), _case("c", 0.1, 2, block=64)]
    res = prof.profile(cases, out=out, arch=90, timer=FakeBackwardTimer(), section="backward",
                       provenance={"gpu": "Fake GPU"}, progress=None, kernel_families=("sm90",))
    return out, res


def test_a_backward_profile_writes_the_backward_section_and_keeps_the_rest(tmp_path):
    """The profile times the six Hopper candidates on each mask and writes them into the
    table's backward section; the forward entries stay; the file reads back equal; resuming
    skips the masks it has; a second profile without --resume or --overwrite is refused."""
    out, res = _profiled(tmp_path)
    assert res.profiled == ["a", "b", "c"] and res.timings == 18
    table = RegimeTable.load(out)
    assert len(table) == 1 and table.backward is not None and len(table.backward) == 3
    doc = json.loads(out.read_text())
    assert set(doc["backward"]) == {"provenance", "entries"}
    for e in table.backward.entries:
        assert e["name"] == PASSES_CPA.name and len(e["candidates"]) == 6
        assert e["default"] in (ATOMIC.name, "bwd_sm90_64_passes_tma")
    assert RegimeTable.from_json(table.to_json()).to_json() == table.to_json()
    again = prof.profile([_case("a", 0.2, 0)], out=out, arch=90, timer=FakeBackwardTimer(),
                         section="backward", resume=True, progress=None,
                         kernel_families=("sm90",))
    assert again.skipped == ["a"] and again.timings == 0
    with pytest.raises(ValueError, match="kernel_families"):  # resumed with another limit
        prof.profile([_case("a", 0.2, 0)], out=out, arch=90, timer=FakeBackwardTimer(),
                     section="backward", resume=True, progress=None)
    with pytest.raises(FileExistsError):
        prof.profile([_case("a", 0.2, 0)], out=out, arch=90, timer=FakeBackwardTimer(),
                     section="backward", progress=None)
    # A forward profile over the same file keeps the backward section.
    new, _ = _profiled(tmp_path / "fresh", forward=False)
    assert len(RegimeTable.load(new)) == 0 and RegimeTable.load(new).backward is not None


def test_selection_reads_the_backward_section(tmp_path, monkeypatch):
    """A plan takes the section's pick for its mask; in deterministic mode the fastest
    bitwise-repeatable regime; a device mask's request (nothing read) the geometry's vote; the
    portable mode and a table without a section keep the heuristic."""
    out, _ = _profiled(tmp_path)
    table = R.use_table(out)
    mask = _case("a", 0.2, 0).build()
    kw = dict(arch=90, head_dim=64, dtype="bfloat16", num_q_heads=2, batch=1)
    assert R.select_backward_regime(mask, **kw) == PASSES_CPA
    assert R.select_backward_regime(mask, deterministic=True, **kw) == PASSES_CPA
    assert R.select_backward_regime(mask, portable=True, **kw).family == "sm80"
    # A mask the section has no evidence of its kind of geometry for (variable blocks): the
    # heuristic.
    bounds = np.array([0, 100, 300, 420, 640])
    odd = BlockMask.from_dense(np.ones((1, 4, 4), bool), q_bounds=bounds, kv_bounds=bounds)
    assert R.select_backward_regime(odd, **kw) == ATOMIC
    # Nothing read of the mask: the lookup that ignores density and imbalance answers, and
    # a device mask's request never measures it (features would synchronize).
    monkeypatch.setattr(type(mask), "on_device", property(lambda self: True))
    monkeypatch.setattr(R.features, "mask_features",
                        lambda *a, **k: pytest.fail("a request read the mask"))
    assert R.select_backward_regime(mask, read_mask=False, **kw) == PASSES_CPA
    R.use_table(table.with_backward(None))
    assert R.select_backward_regime(mask, read_mask=False, **kw) == ATOMIC


def test_a_deterministic_lookup_never_answers_atomics():
    """Where dQ by atomics measured fastest, the deterministic index answers the fastest of
    the two passes instead."""
    feats = {"arch": 90, "head_dim": 128, "dtype": "bfloat16", "geometry": "uniform-128x128",
             "seq_len": "<=32k", "density": "5-15%", "imbalance": "<1.5",
             "batch_heads": "<=16"}
    cands = {ATOMIC.name: {"ms": 1.0, "rel": 1.0}, PASSES_CPA.name: {"ms": 1.3, "rel": 1.3},
             "bwd_sm90_128_passes_tma": {"ms": 1.1, "rel": 1.1}}
    section = RegimeTable([{"features": feats, "regime": ATOMIC.to_dict(), "ms": 1.0,
                            "oracle_ms": 1.0, "candidates": cands, "masks": ["m"]}],
                          section="backward")
    f = R.MaskFeatures(**feats)
    assert section.lookup(f) == ATOMIC
    assert section.lookup(f, deterministic=True).name == "bwd_sm90_128_passes_tma"
    assert section.lookup_unread(f) == ATOMIC
    assert section.lookup_unread(f, deterministic=True).name == "bwd_sm90_128_passes_tma"
    with pytest.raises(ValueError, match="backward regime"):
        RegimeTable([{"features": feats, "regime": {"family": "sm90", "block_m": 256},
                      "ms": 1.0, "oracle_ms": 1.0}], section="backward")


def test_entry_points_refuse_a_bad_backward_regime():
    """attention_backward and Plan.run_backward name the argument before anything runs."""
    mask = _case("a", 0.2, 0).build()
    x = np.zeros((1, 2, mask.seq_len_q, 64), np.float32)
    with pytest.raises(TypeError, match="regime must be None or a tessera.BackwardRegime"):
        tessera.attention_backward(x, x, x, x, x[..., 0], x, mask, regime="bwd_sm90_128")
    p = tessera.plan(mask, num_q_heads=2, head_dim=64)
    with pytest.raises(TypeError, match="regime must be None or a tessera.BackwardRegime"):
        p.run_backward(x, x, x, x, x[..., 0], x, regime=tessera.Regime())
