"""benchmarks/ablate.py (CPU): every source patch still applies to the kernels as they are and
the patched TMA kernel builds for sm_90a without spills or serialized wgmma."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tessera.cuda import loader

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "ablate.py"
_spec = importlib.util.spec_from_file_location("ablate", _PATH)
ablate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ablate)


@pytest.mark.parametrize("name", sorted(ablate.PATCHES))
def test_every_patch_applies_once_and_changes_its_files(name):
    out = ablate.patched_sources([name])
    assert out, name
    for path, text in out.items():
        assert text != loader._read_source(path)


def test_patches_combine_and_unknown_or_stale_ones_are_refused(monkeypatch):
    both = ablate.patched_sources(["softmax", "exp"])
    assert set(both) == {"sm90/mainloop.cuh", "common/types.cuh"}
    with pytest.raises(ValueError, match="unknown patch 'nope'"):
        ablate.patched_sources(["nope"])
    monkeypatch.setitem(ablate.PATCHES, "stale",
                        ("gone", (("sm90/mainloop.cuh", "text that is not in the kernel", ""),)))
    with pytest.raises(ValueError, match="'stale' no longer applies"):
        ablate.patched_sources(["stale"])


def test_against_names_split_outside_brackets():
    """--against takes regime names whose policy lists hold commas themselves."""
    names = ablate._regime_names("sm90_64x64_w20_s3[combine_threshold=0.0,split_ratio=2.0],"
                                 "sm90_64x64_w8_s3,,sm90_128x128_w12_s3[combine_threshold=0.0]")
    assert names == ["sm90_64x64_w20_s3[combine_threshold=0.0,split_ratio=2.0]",
                     "sm90_64x64_w8_s3", "sm90_128x128_w12_s3[combine_threshold=0.0]"]
    assert all(ablate.regime_from_name(n) is not None for n in names)
    assert ablate._regime_names("") == []


pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC comes with the CUDA extras")


@pytest.mark.parametrize("name", ["anchor", "softmax+exp+pv+turns", "unstaged+producer-warps",
                                  "assume-tid+no-fence+exp-poly", "early-rescale",
                                  "whole-span-all", "no-whole-span"])
def test_patched_kernel_builds(name, tmp_path, monkeypatch):
    from tessera.runtime.regime.heuristic import SM90_ROWS128

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    sources = ablate.patched_sources(name.split("+"))
    v = SM90_ROWS128.variant(128, True, tma=True)
    with ablate._SourceOverride(sources):
        res = loader.compile_variant(v, "sm_90a", use_cache=False)
    assert res.spill_bytes == 0
