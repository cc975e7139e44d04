"""CPU tests of regime values (tessera.runtime.regime.value): checking, names and variants."""

from __future__ import annotations

import pytest

from tessera import Regime
from tessera.runtime import regime as R
from tessera.runtime.regime import MaskFeatures, candidate_regimes
from tests.runtime.regime.regime_helpers import (
    clean_selection,  # noqa: F401 (autouse fixture)
    feats,
)


def test_192_row_tiles_need_the_producer():
    """Three consumer warpgroups take turns only in the warp-specialized variant."""
    with pytest.raises(ValueError, match="192: with the producer"):
        Regime(family="sm90", block_m=192, num_warps=12, block_n=64, stages=3)
    r = Regime(family="sm90", block_m=192, num_warps=16, block_n=64, stages=3)
    assert r.producer and r.variant(64).threads == 512 and r.variant(64).persistent


def test_align_tiles_needs_no_merges_or_packing():
    from tessera.runtime.regime import regime_from_name

    with pytest.raises(ValueError, match="align_tiles needs combine_threshold 0"):
        Regime(align_tiles=True)
    with pytest.raises(ValueError, match="align_tiles needs"):
        Regime(family="sm90", block_m=64, num_warps=4, block_n=64, stages=3,
               combine_threshold=0.0, pack_keys=True, align_tiles=True)
    r = Regime(combine_threshold=0.0, align_tiles=True)
    assert "align_tiles=True" in r.name and regime_from_name(r.name) == r


def test_pack_keys_needs_sm90_and_no_restricted_merges():
    with pytest.raises(ValueError, match="pack_keys needs the sm90 family"):
        Regime(pack_keys=True, combine_threshold=0.0)
    with pytest.raises(ValueError, match="combine_threshold 0"):
        Regime(family="sm90", block_m=64, num_warps=4, block_n=64, stages=3, pack_keys=True)
    r = Regime(family="sm90", block_m=64, num_warps=4, block_n=64, stages=3,
               combine_threshold=0.0, pack_keys=True)
    assert "pack_keys=True" in r.name and dict(r.variant(64).macros)["PACK_KEYS"] == 1
    assert "PACK_KEYS" not in dict(r.with_(pack_keys=False).variant(64).macros)


def test_whole_spans_needs_the_producers_span_by_span_walk_on_plain_tiles():
    """Regime.whole_spans: sm90 producer regimes with combine threshold 0, no packed keys and
    no aligned tiles; its variant builds TESSERA_WHOLE_TASKS, in both copy forms."""
    base = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                  combine_threshold=0.0)
    for bad in (dict(num_warps=8), dict(combine_threshold=0.3), dict(pack_keys=True),
                dict(align_tiles=True)):
        with pytest.raises(ValueError, match="whole_spans needs an sm90 producer regime"):
            base.with_(whole_spans=True, **bad)
    with pytest.raises(ValueError, match="whole_spans needs"):
        Regime(combine_threshold=0.0, whole_spans=True)
    w = base.with_(whole_spans=True)
    assert w.name == "sm90_128x128_w12_s3[combine_threshold=0.0,whole_spans=True]"
    assert R.regime_from_name(w.name) == w
    for tma in (True, False):
        assert dict(w.variant(128, tma=tma).macros)["WHOLE_TASKS"] == 1
        assert "WHOLE_TASKS" not in dict(base.variant(128, tma=tma).macros)
    from tessera.cuda.variants import Variant
    with pytest.raises(ValueError, match="whole_tasks needs the producer"):
        Variant.bsa_sm90(block_m=128, block_n=128, head_dim=128, stages=3, bf16=True,
                         whole_tasks=True)


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


def test_sm90_regimes_are_checked_and_map_to_the_hopper_variant():
    r = Regime(family="sm90", block_m=128, num_warps=8, block_n=128, stages=3)
    v = r.variant(128, bf16=False)
    assert v.source == "sm90/bsa.cu" and v.threads == 256
    assert dict(v.macros) == {"BM": 128, "BN": 128, "D": 128, "STAGES": 3, "BF16": 0}
    assert Regime().variant(64).source == "sm80/bsa.cu" and Regime().variant(64).threads == 128
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
