"""``python -m tessera kernels``: the machine code of every attention kernel variant a plan can
launch (:func:`regimes_in_use`: the heuristic's picks, the committed regime tables' entries, the
profiler's candidates, in their TMA and whole-span forms where they have them; the backward
pass's kernels, both families on sm_90) compiled for the CI targets (no GPU needed): registers,
machine-code bytes and a hash of the machine code.

``--json PATH`` writes them; ``--against OLD.json`` compares with an earlier run, so a change to
the kernel sources that should not change the code (a move, a rename) shows that it did not, or
which variants it changed and how much:

    python -m tessera kernels --json before.json      # on the old tree
    python -m tessera kernels --against before.json   # on the new one
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..cuda import loader
from ..cuda.variants import QUANTIZE_KERNELS, Variant
from ..dtypes import SUPPORTED_HEAD_DIMS
from ..mask import BlockMask
from ..runtime.regime import (TABLES_DIR, Regime, RegimeTable, candidate_regimes,
                              default_regime, regime_fits, whole_span_pick)
from ..runtime.regime.backward import candidate_backward_regimes
from ..runtime.regime.heuristic import INT8_REGIME, SM90_ROWS192_D64

__all__ = ["KernelCode", "regimes_in_use", "variants_in_use", "machine_code", "text_section",
           "compare", "add_arguments", "command"]

# The architectures whose targets CI compiles, by compute capability.
_ARCHES = {80: "sm_80", 86: "sm_86", 89: "sm_89", 90: "sm_90a"}


@dataclass(frozen=True)
class KernelCode:
    """One variant's build for one target: what ptxas made of it."""

    target: str
    label: str
    registers: int
    code_bytes: int
    code_hash: str  # sha256 of the kernel's machine code, 16 hex digits


# Key blocks of mixed sizes: the heuristic picks other tiles for ragged keys.
_RAGGED_KEYS = np.array([0, 64, 128, 144, 208, 272, 288])


def regimes_in_use(arch: int, head_dim: int) -> set[Regime]:
    """Every regime a plan on ``arch`` at ``head_dim`` can run: the profiler's candidates, the
    heuristic's picks for 64- and 128-token query blocks with aligned and ragged keys (and the
    192-row tiles of large query blocks at head dim 64), the committed tables' entries, and what
    a dense host mask makes of each (``whole_span_pick``)."""
    found = set(candidate_regimes(head_dim, arch))
    found |= {default_regime(arch, head_dim, qb, kb) for qb in (64.0, 128.0)
              for kb in (None, _RAGGED_KEYS)}
    if arch == 90 and head_dim == 64:
        found.add(SM90_ROWS192_D64)
    for path in sorted(Path(TABLES_DIR).glob("*.json")):
        table = RegimeTable.load(path)
        found |= {Regime.from_dict(e["regime"]) for e in table.entries
                  if e["features"]["arch"] == arch and e["features"]["head_dim"] == head_dim}
    dense = BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)
    found |= {whole_span_pick(r, dense, head_dim) for r in found}
    return {r for r in found if regime_fits(r, head_dim, arch)}


def variants_in_use(targets: tuple[str, ...] = tuple(_ARCHES.values()), *,
                    bf16: tuple[bool, ...] = (True, False)) -> list[tuple[str, Variant]]:
    """(target, variant) of every kernel a plan can launch on the given targets, sorted by
    label: each of :func:`regimes_in_use` in the element types ``bf16`` says, in its TMA form
    too where it has one, the 8-bit forwards' (sm_90, head dims 64 and 128), and the backward
    pass's kernels (on sm_90 both families')."""
    found: set[tuple[str, Variant]] = set()
    for arch, target in _ARCHES.items():
        if target not in targets:
            continue
        for d in SUPPORTED_HEAD_DIMS:
            for r in regimes_in_use(arch, d):
                for b in bf16:
                    for tma in ((False, True) if r.tma_capable else (False,)):
                        found.add((target, r.variant(d, b, tma)))
            for b in bf16:
                found.add((target, Variant.bwd_delta(head_dim=d, bf16=b)))
                found.add((target, Variant.bwd_dq_convert(head_dim=d, bf16=b)))
                found.update((target, Variant.quantize(kn, head_dim=d, bf16=b))
                             for kn in QUANTIZE_KERNELS)
                if arch == 90 and d in (64, 128):  # (both 8-bit forms)
                    found.update((target, INT8_REGIME.variant(d, b, tma=True, int8=m))
                                 for m in (1, 2))
                for r in candidate_backward_regimes(arch) + (
                        candidate_backward_regimes(None) if arch == 90 else []):
                    found.update((target, v) for v in r.kernels(d, b, arch) if v)
    return sorted(found, key=lambda tv: (tv[0], tv[1].label))


def text_section(cubin: bytes, name: str) -> bytes:
    """The bytes of ELF section ``name`` of a cubin (64-bit little-endian ELF)."""
    if cubin[:5] != b"\x7fELF\x02":
        raise ValueError("not a 64-bit ELF cubin")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]
    for name_at, _type, _flags, _addr, offset, size in headers:
        start = names_at + name_at
        if cubin[start:cubin.index(b"\0", start)].decode() == name:
            return cubin[offset:offset + size]
    raise ValueError(f"the cubin has no section {name!r}")


def machine_code(target: str, variant: Variant) -> KernelCode:
    """Compile ``variant`` for ``target`` and describe its kernel's machine code. Variants the
    loader refuses (spills, serialized wgmma) are described anyway: the comparison is the point."""
    res = loader.compile_variant(variant, target, allow_spills=True)
    code = text_section(res.cubin, f".text.{variant.kernel}")
    return KernelCode(target, variant.label, res.registers, len(code),
                      hashlib.sha256(code).hexdigest()[:16])


def compare(old: dict[str, dict], new: dict[str, dict]) -> list[str]:
    """Lines saying which kernels differ between two ``--json`` dumps (keyed by target and
    label); empty when every kernel of both has the same machine code."""
    lines = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            lines.append(f"{key}: only in the {'new' if a is None else 'old'} build")
        elif a["code_hash"] != b["code_hash"]:
            lines.append(f"{key}: machine code differs: registers {a['registers']} -> "
                         f"{b['registers']}, bytes {a['code_bytes']} -> {b['code_bytes']}")
    return lines


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--target", action="append", choices=sorted(set(_ARCHES.values())),
                    help="a target to build for (repeatable; default: sm_80, sm_86, sm_89, "
                         "sm_90a)")
    ap.add_argument("--json", help="write the kernels' descriptions to this file")
    ap.add_argument("--against", help="an earlier --json file to compare with")


def command(args: argparse.Namespace) -> int:
    """Build, describe, and optionally write or compare; 1 when a comparison found changes."""
    old = None
    if args.against:
        try:
            old = json.loads(Path(args.against).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--against: cannot read {args.against}: {exc}") from exc
    targets = tuple(args.target or _ARCHES.values())
    codes = {}
    for target, variant in variants_in_use(targets):
        k = machine_code(target, variant)
        codes[f"{target} {k.label}"] = {"registers": k.registers, "code_bytes": k.code_bytes,
                                        "code_hash": k.code_hash}
        print(f"{target:7} {k.registers:4} regs {k.code_bytes:7} B  {k.code_hash}  {k.label}")
    print(f"{len(codes)} kernels")
    if args.json:
        Path(args.json).write_text(json.dumps(codes, indent=1, sort_keys=True) + "\n")
    if old is not None:
        changed = compare({k: v for k, v in old.items() if k.split()[0] in targets}, codes)
        print("\n".join(changed) if changed else f"machine code identical to {args.against}")
        return 1 if changed else 0
    return 0
