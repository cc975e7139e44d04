"""Command line: ``python -m tessera info`` (what this machine can run, with or without a GPU),
``plan``, ``demo``, ``bench``, ``pipeline``, ``quality`` (what a method costs in quality),
``profile`` (write this GPU's regime table) and ``kernels`` (every kernel variant's machine code,
no GPU needed)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import time

import numpy as np
import scipy

import tessera

from .._array import cupy_or_none
from ..cuda import device
from ..cuda.loader import CI_TARGETS, cache_dir, nvrtc_version, target_for
from ..cuda.tma import driver_encodes_maps
from ..runtime.plan import plan
from ..runtime.regime.backward import SM90_SMALL_BLOCK_TOKENS, default_backward_regime
from ..runtime.regime import (
    TABLES_DIR,  # noqa: F401 - tables/ beside the package
    default_regime,
    describe_table_in_use,
)
from ..distribution import install_hint
from ..dtypes import SUPPORTED_HEAD_DIMS
from ..integrations.video_models import FAMILIES as VIDEO_FAMILIES, TESTED_DIFFUSERS, is_tested
from .args import int_choice, nonnegative_int, positive_int, require_matplotlib
from .bench import main as bench_main
from .pipeline import main as pipeline_main
from .quality import main as quality_main
from .quant_error import main as quant_error_main
from .demo import run
from . import kernels
from .plot import draw_plan
from .profile import add_arguments, command
from .workloads import FAMILIES, WORKLOADS, example_mask


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

    v = nvrtc_version()
    lines.append(f"NVRTC: {'%d.%d' % v if v else 'not found (install the cuda12/cuda13 extra)'}")
    if device.gpu_count() == 0:
        lines.append("GPU: none found (kernels can still be compiled: see targets below)")
        return lines, None
    cc = device.device_arch()
    drv = cp.cuda.runtime.driverGetVersion()
    lines.append(f"GPU: {device.current_gpu_name()} (compute capability {cc // 10}.{cc % 10}, "
                 f"{device.device_sm_count()} SMs), driver CUDA {drv // 1000}."
                 f"{drv % 1000 // 10}, kernels built for {target_for(cc)}")
    return lines, cc


def _backward_line(cc: int | None) -> str:
    """Which backward regime this GPU's heuristic runs (``default_backward_regime``)."""
    if cc is None:
        return "the sm90 kernels on sm_90, the portable ones elsewhere (no GPU here)"
    r = default_backward_regime(cc, 128, 128,
                                deterministic=tessera.config.deterministic_backward,
                                portable=tessera.config.portable_backward)
    family = "sm90 (wgmma)" if r.family == "sm90" else "sm80 (mma.sync)"
    if r.family != "sm90":
        return f"the {family} kernels on this GPU ({r.name}: {r.block_m}-row tasks)"
    return (f"the {family} kernels on this GPU ({r.name}: {r.block_m}-row tasks, 64 for masks "
            f"of blocks up to {SM90_SMALL_BLOCK_TOKENS} tokens; chunks by TMA with "
            "config.use_tma where the operands allow; dQ by atomics in 128-row tasks unless "
            "config.deterministic_backward; config.portable_backward forces the sm80 ones); "
            "the regime table's backward section decides where it answers")


def info() -> int:
    """Print versions, the GPU (if any), kernel targets and regime tables."""

    print(f"Tessera {tessera.__version__} (Python {platform.python_version()}, numpy "
          f"{np.__version__}, scipy {scipy.__version__})")
    lines, cc = _gpu_lines()
    for line in lines:
        print(line)
    print("Kernel families: sm80 (mma.sync, runs on sm_80 and newer); sm90 (wgmma, sm_90 "
          "only, the default there); combine")
    print("Backward pass (tessera.attention_backward, torch autograd, jax.grad): "
          + _backward_line(cc))
    print("8-bit forwards (tessera.attention(..., precision=\"int8\" or \"int8-qk\"), "
          "opt-in): " + (
        "runs here (Hopper)" if cc == 90 else "Hopper GPUs only; on CPU tensors through the "
        "torch integration, its arithmetic by the emulator" if cc is None else
        f"Hopper GPUs only; this GPU is sm_{cc}"))
    print(f"Compile targets checked in CI: {', '.join(CI_TARGETS)} (sm90 family: sm_90a)")

    print("TMA copies (sm90 family, producer variants of the span-by-span walk): " + (
        "the driver encodes tensor maps" if driver_encodes_maps() else
        "no CUDA driver with cuTensorMapEncodeTiled here: cp.async copies"))
    cached = sorted(p.name for p in cache_dir().glob("*.cubin")) if cache_dir().is_dir() else []
    print(f"Compiled kernels cached in {cache_dir()}: {len(cached)}")
    tables = sorted(TABLES_DIR.glob("*.json")) if TABLES_DIR.is_dir() else []
    if tables:
        print("Regime tables: " + ", ".join(t.name for t in tables))
    else:
        print("Regime tables: none yet; plans use the heuristic default regime")
    print(f"Regime table in use: {describe_table_in_use(cc)}")
    print(_diffusers_line())
    where = f"sm_{cc}" if cc is not None else "no GPU"
    for d in (64, 128):
        line = f"Default regime for head dim {d} ({where}): {default_regime(cc, d).name}"
        if cc != 90:  # what a Hopper GPU would take instead
            line += f"; on sm_90: {default_regime(90, d).name}"
        # Masks of small query blocks (64-token cubes) take 64-row tiles.
        line += f"; 64-token query blocks: {default_regime(cc, d, q_block=64).name}"
        if cc != 90:
            line += f" (sm_90: {default_regime(90, d, q_block=64).name})"
        print(line)
    return 0


def _diffusers_line() -> str:
    """The installed diffusers release against the tested ones, and the families the
    integration routes (read from the package metadata: diffusers is not imported)."""
    try:
        version = importlib.metadata.version("diffusers")
    except importlib.metadata.PackageNotFoundError:
        return f"diffusers: not installed ({install_hint('diffusers')})"
    tested = ", ".join(TESTED_DIFFUSERS)
    state = "tested" if is_tested(version) else f"outside the tested {tested}: " \
        "enable checks each model"
    return (f"diffusers: {version} ({state}); families routed: "
            + ", ".join(f.name for f in VIDEO_FAMILIES))


# Tile rows ``plan --block-m`` takes: the portable family's, two 16-row tiles a warp.
BLOCK_M_CHOICES = (32, 64, 128, 192, 256)


def _check_plan_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse's types cannot see alone: the drawn head among the mask heads, and
    matplotlib for --png."""
    if not 0 <= args.head < args.heads:
        ap.error(f"--head must be in [0, {args.heads}) (one of the --heads {args.heads} mask "
                 f"heads), got {args.head}")
    if args.png:
        require_matplotlib(ap, "--png")


def plan_command(args: argparse.Namespace) -> int:
    """Build a family's mask for a workload, plan it, print its stats, optionally draw it."""

    w = WORKLOADS[args.shape]
    d = args.head_dim or w.head_dim
    t0 = time.perf_counter()
    vm = example_mask(w, args.family, heads=args.heads)
    t1 = time.perf_counter()
    regime = default_regime(None, d)
    if args.block_m:
        regime = regime.with_(block_m=args.block_m, num_warps=args.block_m // 32)
    h = vm.mask.batch_heads[1]
    p = plan(vm.mask, num_q_heads=max(h, args.heads), head_dim=d, regime=regime)
    t2 = time.perf_counter()
    print(f"{args.family} on {w.name} ({w.seq_len} tokens, {args.heads} heads): {vm.mask}")
    print(f"mask built in {(t1 - t0) * 1e3:.1f} ms, planned in {(t2 - t1) * 1e3:.1f} ms "
          f"({p.regime.name})")
    print(f"plan: {p.stats()}")
    if args.png:
        out = draw_plan(p, args.png, head=args.head,
                        title=f"{args.family} on {w.name}, head {args.head}")
        print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status. Output piped into a reader that closes early
    (``| head``) ends the command quietly, as Unix tools do."""
    try:
        rc = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in Python's flush at exit
        return rc
    except BrokenPipeError:
        # Python would report the broken pipe again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera",
                                 description="Tessera: block-sparse attention for video DiTs")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("info", help="versions, GPU, kernel targets and regime tables")
    demo = sub.add_parser("demo", help="STA and top-k masks on a Wan-1.3B-shaped attention, "
                                       "checked against the float64 reference")
    demo.add_argument("--size", choices=["auto", "full", "small"], default="auto",
                      help="full: the GPU run; small: the CPU emulator at a reduced size; "
                           "auto: full when a GPU is present")
    pl = sub.add_parser("plan", help="plan a video mask family and print (or draw) the plan")
    pl.add_argument("--shape", default="wan-1.3b-480p", choices=list(WORKLOADS),
                    help="a workload of tessera.tools.workloads")
    pl.add_argument("--family", default="sliding_tile", choices=list(FAMILIES),
                    help="a family of tessera.families")
    pl.add_argument("--heads", type=positive_int, default=2, help="mask heads to generate")
    pl.add_argument("--head-dim", type=int_choice(SUPPORTED_HEAD_DIMS), default=None,
                    help="64, 96 or 128 (default: the workload's)")
    pl.add_argument("--head", type=nonnegative_int, default=0, help="head to draw")
    pl.add_argument("--block-m", type=int_choice(BLOCK_M_CHOICES), default=None,
                    help=f"physical tile rows: {', '.join(map(str, BLOCK_M_CHOICES))}")
    pl.add_argument("--png", help="draw the plan to this PNG (needs matplotlib)")
    pr = sub.add_parser("profile", help="time candidate regimes on a mask corpus and write "
                                         "this GPU's regime table (needs a GPU and PyTorch)")

    add_arguments(pr)
    kn = sub.add_parser("kernels", help="compile every kernel variant the runtime can pick and "
                                        "print its registers and machine-code size (no GPU)")
    kernels.add_arguments(kn)
    sub.add_parser("bench", add_help=False,
                   help="Tessera vs dense SDPA and FlexAttention on a GPU (see --help there)")
    sub.add_parser("pipeline", add_help=False,
                   help="a diffusers video transformer's forwards: dense, Tessera and "
                        "FlexAttention on one method's masks (see --help there)")
    sub.add_parser("quality", add_help=False,
                   help="a denoising run dense and sparse from the same noise: PSNR and SSIM "
                        "of the latents per step, and the speed-up (see --help there)")
    sub.add_parser("quant-error", add_help=False,
                   help="an 8-bit forward's rounding error against float64 per model shape, "
                        "on the CPU (see --help there)")
    args, rest = ap.parse_known_args(argv)
    if args.cmd == "quant-error":
        return quant_error_main(rest)
    if args.cmd == "bench":
        return bench_main(rest)
    if args.cmd == "pipeline":
        return pipeline_main(rest)
    if args.cmd == "quality":
        return quality_main(rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.cmd in (None, "info"):
        return info()
    if args.cmd == "plan":
        _check_plan_args(pl, args)
        return plan_command(args)
    if args.cmd == "profile":
        return command(args)
    if args.cmd == "demo":
        return run(args.size)
    if args.cmd == "kernels":
        return kernels.command(args)
    return 2

