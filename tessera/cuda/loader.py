"""Kernel loader: compiles the ``.cu`` sources with NVRTC per architecture and loads them as CuPy
``RawModule``s.

A kernel *variant* is a source plus parameter values (tile shape, head dim, dtype, ...), which
reach the source as one generated header, ``variant.cuh``: a ``Config`` struct of compile-time
constants (``variants.config_header``). A variant compiles
once per process and architecture (and once per machine: cubins are cached on disk, keyed by the
source text, options and NVRTC version), never on the request path after the first call.
Compilation needs only NVRTC (the CuPy CUDA extras ship it); the sources include no toolkit
headers. Every build reads ptxas' resource report and refuses register spills, so a variant that
would spill fails at build time (in CI, for every target) instead of running slowly.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..distribution import install_hint
from .._array import cupy_or_none
from .device import device_cc
from .variants import (BACKWARD_SOURCES, SM90, SM90_BACKWARD_KERNELS, Variant, config_header,
                       smem_bytes)

__all__ = ["CompileResult", "BuildError", "CI_TARGETS", "compile_variant", "target_for",
           "load_kernel", "blocks_per_sm", "nvrtc_version", "cache_dir"]

SOURCE_DIR = Path(__file__).resolve().parent
# Every header of the tree, by its path under SOURCE_DIR: sources include them by that name.
HEADERS = tuple(sorted(p.relative_to(SOURCE_DIR).as_posix() for p in SOURCE_DIR.rglob("*.cuh")))
# Targets CI compiles every variant for (no GPU needed): Ampere, Ada, Hopper, Blackwell.
CI_TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a")
# Sources built for sm_90a alone (wgmma exists on no other target).
SM90A_ONLY = (SM90,) + tuple(BACKWARD_SOURCES[k] for k in SM90_BACKWARD_KERNELS)


class BuildError(RuntimeError):
    """A kernel failed to compile, spilled registers, or no compiler could be found."""


@dataclass
class CompileResult:
    """A cubin and what ptxas said about it."""

    variant: Variant
    target: str
    cubin: bytes
    log: str
    registers: int
    spill_bytes: int
    stack_bytes: int


def target_for(cc: int) -> str:
    """The NVRTC ``-arch`` for compute capability ``cc`` (e.g. 90 -> sm_90a, 86 -> sm_86)."""
    return {90: "sm_90a", 100: "sm_100a", 101: "sm_101a", 120: "sm_120a"}.get(cc, f"sm_{cc}")


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc  # noqa: PLC0415

        nvrtc.getVersion()
        return nvrtc
    except Exception as exc:
        raise BuildError("NVRTC is not available: install Tessera with the CUDA extras "
                         f"({install_hint('cuda13')}, or cuda12)") from exc


def nvrtc_version() -> tuple[int, int] | None:
    """NVRTC's (major, minor), or None when it cannot be loaded."""
    try:
        return tuple(_nvrtc().getVersion())  # type: ignore[return-value]
    except BuildError:
        return None


def cache_dir() -> Path:
    """Where cubins are cached: ``$TESSERA_CACHE_DIR`` or ``~/.cache/tessera``."""
    return Path(os.environ.get("TESSERA_CACHE_DIR", Path.home() / ".cache" / "tessera"))


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a private temporary file and a rename, so that a reader
    sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read_source(name: str) -> str:
    path = SOURCE_DIR / name
    if not path.is_file():
        raise BuildError(f"kernel source {name} not found in {SOURCE_DIR}")
    return path.read_text()


_built: dict[str, tuple[bytes, str]] = {}  # this process's builds, by cache path
_RES = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


def _kernel_report(log: str, kernel: str) -> str:
    """The part of ptxas' log about one entry function."""
    parts = _ENTRY.split(log)  # [preamble, name1, text1, name2, text2, ...]
    for name, text in zip(parts[1::2], parts[2::2]):
        if name == kernel:
            return text
    return ""


def compile_variant(variant: Variant, target: str, *, allow_spills: bool = False,
                    use_cache: bool = True, require_report: bool = True) -> CompileResult:
    """Compile ``variant`` for ``target`` (e.g. "sm_90a") to a cubin; raise BuildError on a
    compile error or, unless ``allow_spills``, on any register spill.

    ``require_report=False`` accepts a build whose ptxas report is missing, whatever else the
    log holds (compiler warnings): the H200 machine's NVRTC leaves it out when the same program
    was compiled before on the machine -- by another process, or into another cache directory
    (a fresh ``TESSERA_CACHE_DIR`` after the test suite had built the same sources would
    otherwise fail every request) -- and once for a program compiled after CuPy's own kernels.
    The spill gate is CI's job, where the report is always required. Registers are then -1.
    """
    if variant.source in SM90A_ONLY and target != "sm_90a":
        raise BuildError(f"{variant.label} uses wgmma and builds for sm_90a only, not {target}")
    nvrtc = _nvrtc()
    src = _read_source(variant.source)
    try:
        config = config_header(variant)
    except ValueError as exc:
        raise BuildError(str(exc)) from exc
    names = (*HEADERS, "variant.cuh")
    headers = [*(_read_source(h) for h in HEADERS), config]
    # -default-device: every function of our sources is device code, which NVRTC otherwise
    # refuses for generic lambdas (the bodies of static_for, common/types.cuh).
    options = [f"-arch={target}", "-std=c++17", "-default-device", "-Xptxas=-v", "-lineinfo"]
    key = hashlib.sha256("\0".join([src, *headers, *options, str(nvrtc.getVersion())])
                         .encode()).hexdigest()[:24]
    cubin_path = cache_dir() / f"{variant.label}_{target}_{key}.cubin"
    log_path = cubin_path.with_suffix(".log")
    if use_cache and str(cubin_path) in _built:
        # Compiled earlier in this process (NVRTC may not repeat ptxas' report for a program it
        # has just compiled, so the first report is kept).
        cubin, log = _built[str(cubin_path)]
    elif use_cache and cubin_path.is_file() and log_path.is_file():
        cubin, log = cubin_path.read_bytes(), log_path.read_text()
    else:
        prog = nvrtc.createProgram(src, variant.source, [h.encode() for h in headers],
                                   [h.encode() for h in names])
        try:
            try:
                nvrtc.compileProgram(prog, options)
            except Exception as exc:
                raise BuildError(f"{variant.label} for {target} failed to compile:\n"
                                 f"{nvrtc.getProgramLog(prog)}") from exc
            log = nvrtc.getProgramLog(prog).rstrip("\0")
            cubin = nvrtc.getCUBIN(prog)
        finally:
            nvrtc.destroyProgram(prog)
        if use_cache:
            try:
                # The log first: a reader takes the cubin only when its log is there.
                _write_atomic(log_path, log.encode())
                _write_atomic(cubin_path, cubin)
            except OSError:
                pass  # a read-only home is fine: the process keeps its own copy
    if use_cache:
        _built[str(cubin_path)] = (cubin, log)
    report = _kernel_report(log, variant.kernel)
    res = _RES.search(report)
    regs = _REGS.search(report)
    if res is None or regs is None:
        if not require_report and "ptxas" not in log:
            return CompileResult(variant, target, cubin, log, -1, 0, 0)
        raise BuildError(f"could not read ptxas' resource report for {variant.kernel} in "
                         f"{variant.label}:\n{log}")
    # Every kernel of the module must be spill-free, not only the one asked for.
    spills = [int(a) + int(b) for _, a, b in _RES.findall(log)]
    if not allow_spills and any(spills):
        raise BuildError(f"{variant.label} spills registers on {target}:\n{log}")
    stack, spill_st, spill_ld = (int(x) for x in res.groups())
    result = CompileResult(variant, target, cubin, log, int(regs.group(1)), spill_st + spill_ld,
                           stack)
    if not allow_spills and result.spill_bytes:
        raise BuildError(f"{variant.label} spills registers on {target} "
                         f"({spill_st} B stores, {spill_ld} B loads):\n{log}")
    if not allow_spills and result.stack_bytes > variant.local_bytes:
        # Local memory beyond the variant's own (an array the compiler could not keep in
        # registers) is as slow as a spill.
        raise BuildError(f"{variant.label} on {target}: {result.stack_bytes} B of local memory, "
                         f"{variant.local_bytes} B by design:\n{log}")
    if "wgmma.mma_async instructions are serialized" in log:
        raise BuildError(f"{variant.label} on {target}: ptxas serialized its wgmma:\n{log}")
    launch_regs = 65536 // (variant.threads * variant.min_blocks) // 8 * 8 \
        if variant.persistent else 0
    if -(-result.registers // 8) * 8 < launch_regs:
        # sm90/traits.cuh splits a pool of 64K / (NT x MIN_BLOCKS) registers per thread (in eights)
        # between producer and consumers; a kernel launched with fewer would hang in
        # setmaxnreg.inc.
        raise BuildError(f"{variant.label} on {target}: {result.registers} registers per thread "
                         f"at launch, fewer than the {launch_regs} its register reallocation "
                         f"assumes:\n{log}")
    if "C7508" in log or "setmaxnreg ignored" in log:
        raise BuildError(f"{variant.label} on {target}: ptxas ignored setmaxnreg:\n{log}")
    return result


_loaded: dict[tuple[Variant, int], Any] = {}  # per (variant, device id)
_modules: dict[tuple[str, tuple, int], Any] = {}  # per (source, macros, device id)


def load_kernel(variant: Variant) -> Any:
    """The CuPy kernel function of ``variant`` for the current device, compiled at most once per
    process and architecture, loaded once per device (a module lives in one device's context:
    its functions cannot launch on another GPU), with its dynamic shared-memory limit raised to
    what it needs."""
    cc = device_cc()  # (a BuildError without CuPy)
    cp = cupy_or_none()
    device = cp.cuda.Device().id
    key = (variant, device)
    fn = _loaded.get(key)
    if fn is None:
        result = compile_variant(variant, target_for(cc), require_report=False)
        mkey = (variant.source, variant.macros, device)
        module = _modules.get(mkey)
        if module is None:
            # Named by its content and written atomically: processes loading at once (torchrun)
            # never read a file another is writing, nor another version's kernels.
            digest = hashlib.sha256(result.cubin).hexdigest()[:24]
            path = cache_dir() / f"{variant.label}_{result.target}_{digest}.loaded.cubin"
            try:
                if not path.is_file():
                    _write_atomic(path, result.cubin)
                module = cp.RawModule(path=str(path))
            except OSError:
                with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                    f.write(result.cubin)
                module = cp.RawModule(path=f.name)
            _modules[mkey] = module
        fn = module.get_function(variant.kernel)
        smem = smem_bytes(variant)
        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
        _loaded[key] = fn
    return fn


_resident: dict[tuple, int] = {}


def blocks_per_sm(variant: Variant) -> int:
    """CTAs of ``variant`` one SM of the current device holds at once (the driver's occupancy
    calculation, from registers, threads and shared memory); sizes persistent grids."""
    key = (variant, cupy_or_none().cuda.Device().id)
    if key not in _resident:
        from cupy_backends.cuda.api import driver  # noqa: PLC0415 - device only

        fn = load_kernel(variant).kernel  # the RawKernel's driver function
        _resident[key] = max(1, int(driver.occupancyMaxActiveBlocksPerMultiprocessor(
            fn.ptr, variant.threads, smem_bytes(variant))))
    return _resident[key]
