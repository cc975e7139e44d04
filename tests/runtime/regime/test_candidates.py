"""CPU tests of candidate regimes (tessera.runtime.regime.candidates)."""

from __future__ import annotations

import pytest

from tessera.runtime import regime as R
from tessera.runtime.regime import Regime, candidate_regimes, default_regime
from tests.runtime.regime.regime_helpers import clean_selection  # noqa: F401 (autouse fixture)


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
                assert res.spill_bytes == 0 and res.stack_bytes <= res.variant.local_bytes
