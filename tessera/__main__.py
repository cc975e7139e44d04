"""Command line: ``python -m tessera info`` (what this machine can run, with or without a GPU)."""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np
import scipy

import tessera

from ._array import cupy_or_none

TABLES_DIR = Path(__file__).resolve().parent.parent / "tables"


def _gpu_lines() -> tuple[list[str], int | None]:
    cp = cupy_or_none()
    if cp is None:
        return ["CuPy: not installed (CPU-only: masks, planning, reference, emulator)"], None
    lines = [f"CuPy: {cp.__version__}"]
    try:
        rt = cp.cuda.runtime.runtimeGetVersion()
        lines.append(f"CUDA runtime: {rt // 1000}.{rt % 1000 // 10}")
    except Exception as exc:  # CuPy present but its CUDA libraries are not
        lines.append(f"CUDA runtime: unavailable ({type(exc).__name__})")
    from .cuda.loader import nvrtc_version, target_for  # noqa: PLC0415

    v = nvrtc_version()
    lines.append(f"NVRTC: {'%d.%d' % v if v else 'not found (install the cuda12/cuda13 extra)'}")
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception:
        n = 0
    if n == 0:
        lines.append("GPU: none found (kernels can still be compiled: see targets below)")
        return lines, None
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    cc = int(dev.compute_capability)
    drv = cp.cuda.runtime.driverGetVersion()
    lines.append(f"GPU: {props['name'].decode()} (compute capability {cc // 10}.{cc % 10}, "
                 f"{props['multiProcessorCount']} SMs), driver CUDA {drv // 1000}."
                 f"{drv % 1000 // 10}, kernels built for {target_for(cc)}")
    return lines, cc


def info() -> int:
    """Print versions, the GPU (if any), kernel targets and regime tables."""
    from .cuda.loader import CI_TARGETS, cache_dir  # noqa: PLC0415
    from .runtime.regime import default_regime  # noqa: PLC0415

    print(f"Tessera {tessera.__version__} (Python {platform.python_version()}, numpy "
          f"{np.__version__}, scipy {scipy.__version__})")
    lines, cc = _gpu_lines()
    for line in lines:
        print(line)
    print("Kernel families: sm80 (mma.sync, runs on sm_80 and newer); combine")
    print(f"Compile targets checked in CI: {', '.join(CI_TARGETS)}")
    cached = sorted(p.name for p in cache_dir().glob("*.cubin")) if cache_dir().is_dir() else []
    print(f"Compiled kernels cached in {cache_dir()}: {len(cached)}")
    tables = sorted(TABLES_DIR.glob("*.json")) if TABLES_DIR.is_dir() else []
    if tables:
        print("Regime tables: " + ", ".join(t.name for t in tables))
    else:
        print("Regime tables: none yet; plans use the heuristic default regime")
    for d in (64, 128):
        print(f"Default regime for head dim {d}: {default_regime(cc, d).name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera",
                                 description="Tessera: block-sparse attention for video DiTs")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("info", help="versions, GPU, kernel targets and regime tables")
    args = ap.parse_args(argv)
    if args.cmd in (None, "info"):
        return info()
    return 2


if __name__ == "__main__":
    sys.exit(main())
