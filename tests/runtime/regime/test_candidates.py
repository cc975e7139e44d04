"""CPU tests of candidate regimes (tessera.runtime.regime.candidates)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.runtime import regime as R
from tessera.runtime.regime import Regime, candidate_regimes, default_regime
from tessera.runtime.regime.candidates import CANDIDATE_SPLIT_RATIO
from tessera.runtime.regime.heuristic import (SM90_ROWS128, SM90_ROWS192_D64,
                                              one_ring_where_few_tasks)
from tests.runtime.regime.regime_helpers import clean_selection  # noqa: F401 (autouse fixture)


def test_candidates_small_valid_and_fitting():
    for d in (64, 96, 128):
        for arch in (80, 86, 89, 90, 100, None):
            cands = candidate_regimes(d, arch)
            assert 0 < len(cands) <= (74 if arch == 90 else 24)
            assert len({r.name for r in cands}) == len(cands)
            assert all(R.regime_fits(r, d, arch) for r in cands)
            assert all(r.num_warps == 4 and r.block_m in (64, 128) and r.block_n in (32, 64)
                       for r in cands if r.family == "sm80")
            # 64-row sm90 tiles plain at head dim 96 (with a producer warpgroup at 64 and 128),
            # 128- and 192-row ones warp-specialized; 192 rows only at head dim 64 with 128-key
            # steps.
            sm90 = [r for r in cands if r.family == "sm90"]
            assert all(r.producer == (r.block_m >= 128 or d in (64, 128))
                       and r.block_n in (64, 128) for r in sm90)
            assert {(r.block_m, r.block_n) for r in sm90 if r.block_m == 192} == (
                {(192, 128)} if (d, arch) == (64, 90) else set())
            # The ragged-geometry forms: packed keys per sm90 shape (one split policy: packed
            # plans never split), aligned tiles on 128 rows per split policy.
            packed = [r for r in sm90 if r.pack_keys]
            aligned = [r for r in sm90 if r.align_tiles]
            assert len(packed) == len({(r.block_m, r.block_n) for r in sm90})
            assert all(r.combine_threshold == 0 and r.split_ratio == Regime.split_ratio
                       for r in packed)
            assert all(r.block_m == 128 and r.combine_threshold == 0 for r in aligned)
            assert len(aligned) == (6 if arch == 90 else 0)
            assert {r.family for r in cands} == ({"sm80", "sm90"} if arch == 90 else {"sm80"})
    # sm80's 24, and sm90's four shapes x 6 policies + 4 packed + 6 aligned (at head dim 64 a
    # fifth shape, 192 rows, the 128x128 tiles' three wide-step forms and the rings' one-ring
    # form in its 6 policies, not packed).
    assert len(candidate_regimes(128, 90)) == 58
    assert len(candidate_regimes(64, 90)) == 74
    # What the ring rule takes where tasks are few is measured too.
    for q_block in (64.0, 128.0):
        one = one_ring_where_few_tasks(default_regime(90, 64, q_block), 1, 132, q_block)
        assert one.rings == 1 and one in candidate_regimes(64, 90)
    # The heuristic's and the selection's choices are measured too.
    assert Regime() in candidate_regimes(128, 90)
    ragged = np.array([0, 64, 128, 144, 208, 272, 288])
    for d in (64, 96, 128):
        cands = candidate_regimes(d, 90)
        for q_block in (64, 128):
            for kv in (None, ragged):
                reg = default_regime(90, d, q_block, kv)
                assert reg in cands and reg.with_(pack_keys=True) in cands
        assert SM90_ROWS128.with_(align_tiles=True) in cands
    assert SM90_ROWS192_D64 in candidate_regimes(64, 90)
    # 192-key steps: the 128x128 producer tiles at head dim 64 only, in each split policy.
    wide = [r for d in (64, 96, 128) for r in candidate_regimes(d, 90) if r.wide_steps]
    assert {(r.block_m, r.block_n, r.producer, r.combine_threshold) for r in wide} == {
        (128, 128, True, 0.0)}
    assert sorted(r.split_ratio for r in wide) == sorted(CANDIDATE_SPLIT_RATIO)
    assert all(r in candidate_regimes(64, 90) for r in wide)
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
