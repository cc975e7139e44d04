"""``python -m tessera kernels`` (CPU): which variants it describes, how it reads a kernel's
machine code out of a cubin, and what a comparison reports."""

from __future__ import annotations

import pytest

from tessera.cuda.variants import Variant
from tessera.runtime.regime import default_regime
from tessera.tools import kernels


def test_variants_in_use_hold_the_defaults_in_both_element_types():
    found = kernels.variants_in_use(("sm_80", "sm_90a"))
    assert found == sorted(found, key=lambda tv: (tv[0], tv[1].label))
    for target, arch in (("sm_80", 80), ("sm_90a", 90)):
        for d in (64, 128):
            for bf16 in (True, False):
                assert (target, default_regime(arch, d).variant(d, bf16)) in found
    assert all(t in ("sm_80", "sm_90a") for t, _ in found)
    # the Hopper defaults' TMA forms too
    assert ("sm_90a", default_regime(90, 128).variant(128, True, tma=True)) in found


def test_compare_names_each_changed_or_missing_kernel():
    a = {"sm_80 x": {"registers": 96, "code_bytes": 100, "code_hash": "aa"},
         "sm_80 y": {"registers": 96, "code_bytes": 100, "code_hash": "bb"}}
    b = {"sm_80 x": {"registers": 96, "code_bytes": 100, "code_hash": "aa"},
         "sm_80 y": {"registers": 104, "code_bytes": 128, "code_hash": "cc"},
         "sm_80 z": {"registers": 8, "code_bytes": 8, "code_hash": "dd"}}
    assert kernels.compare(a, a) == []
    assert kernels.compare(a, b) == [
        "sm_80 y: machine code differs: registers 96 -> 104, bytes 100 -> 128",
        "sm_80 z: only in the new build"]


def test_machine_code_reads_the_kernels_text_section(tmp_path, monkeypatch):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC comes with the CUDA extras")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    v = Variant.combine(bf16=True)
    code = kernels.machine_code("sm_80", v)
    again = kernels.machine_code("sm_80", v)
    assert code == again and code.code_bytes > 0 and code.registers > 0
    other = kernels.machine_code("sm_80", Variant.combine(bf16=False))
    assert other.code_hash != code.code_hash  # the conversions differ
    cubin = kernels.loader.compile_variant(v, "sm_80").cubin
    assert kernels.text_section(cubin, ".text.bsa_combine")[:16] != b""
    with pytest.raises(ValueError, match="no section"):
        kernels.text_section(cubin, ".text.nothing")
    with pytest.raises(ValueError, match="not a 64-bit ELF"):
        kernels.text_section(b"\0" * 64, ".text.nothing")
