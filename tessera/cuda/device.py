"""Facts about the GPUs: compute capability, multiprocessors, shared-memory limits, names.

The one place that asks the driver (through CuPy) about a device; every answer is cached per
device, and every function answers something sensible without a GPU or without CuPy.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable

import numpy as np

from ..distribution import install_hint
from .. import _array

__all__ = ["device_cc", "device_arch", "device_sm_count", "current_gpu_name", "gpu_count",
           "require_gpu",
           "smem_limit_bytes", "SMEM_LIMIT_KIB", "check_arch", "SM90_SMEM_PER_SM",
           "SM90_SMEM_RESERVED", "driver_library", "stream_id"]

# Shared memory of one sm_90 SM, and what the driver reserves per resident CTA (CUDA
# programming guide, "Technical specifications" and "Shared memory"): two CTAs fit when
# 2 x (dynamic + reserved) is at most the SM's.
SM90_SMEM_PER_SM = 228 * 1024
SM90_SMEM_RESERVED = 1024

# Largest dynamic shared memory one CTA may use, in KiB, per compute capability (CUDA
# programming guide, "Technical specifications"). Unknown architectures get the smallest.
SMEM_LIMIT_KIB = {80: 163, 87: 163, 90: 227, 100: 227, 103: 227, 86: 99, 89: 99, 120: 99,
                  121: 99}
_SMEM_FALLBACK_KIB = 99


# Compute capabilities a plan may name (``tessera.plan(arch=...)``): sm_80 and newer, as
# major * 10 + minor (GPUs newer than SMEM_LIMIT_KIB's get its smallest shared-memory limit).
MIN_ARCH, MAX_ARCH = 80, 199


def check_arch(arch: object) -> None:
    """``arch`` must be None (the mask's device, or a portable host plan) or a compute
    capability of sm_80 or newer as an int: 80, 86, 89, 90, 100, ..."""
    if arch is None:
        return
    if isinstance(arch, bool) or not isinstance(arch, (int, np.integer)) or \
            not MIN_ARCH <= int(arch) <= MAX_ARCH:
        raise ValueError(f"arch must be None or a compute capability int from {MIN_ARCH} (sm_80) "
                         f"up, such as {sorted(SMEM_LIMIT_KIB)} (90 for sm_90), got {arch!r}")


def smem_limit_bytes(arch: int | None) -> int:
    """Dynamic shared memory per CTA on compute capability ``arch`` (None: the smallest, 99 KiB)."""
    return SMEM_LIMIT_KIB.get(arch, _SMEM_FALLBACK_KIB) * 1024  # type: ignore[arg-type]


# Per device id: its name, compute capability and multiprocessor count.
_gpu_names: dict[int, str | None] = {}
_device_archs: dict[int, int] = {}
_device_sms: dict[int, int] = {}


_gpus: int | None = None


def gpu_count() -> int:
    """CUDA devices visible to this process (0 without CuPy, a driver or a GPU); asked of the
    driver once (every request checks it)."""
    global _gpus
    if _gpus is None:
        cp = _array.cupy_or_none()
        try:
            _gpus = 0 if cp is None else int(cp.cuda.runtime.getDeviceCount())
        except Exception:  # no driver: CuPy's cudaErrorInsufficientDriver and kin
            _gpus = 0
    return _gpus


# What runs without a GPU, for the messages that say one is missing.
_ON_THE_CPU = ("on the CPU, masks and plans are made as usual, tessera.runtime.emulate.run runs a "
               "plan's task queue and tessera.reference.attention is the float64 truth "
               "(python -m tessera demo --size small)")


def require_gpu(what: str = "the GPU path") -> int:
    """The CUDA GPUs this process can use, or a RuntimeError saying in one line what is missing
    -- CuPy, a usable driver, a GPU -- and what runs without one, where CuPy's first call would
    fail with a bare CUDA error code."""
    cp = _array.cupy_or_none()
    if cp is None:
        raise RuntimeError(f"{what} needs CuPy and a CUDA GPU: {install_hint('cuda13')} (or "
                           f"cuda12); {_ON_THE_CPU}")
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # cudaErrorInsufficientDriver, cudaErrorNoDevice and kin
        raise RuntimeError(f"{what} needs a CUDA GPU, and this machine has no usable one "
                           f"({type(exc).__name__}: {exc}); {_ON_THE_CPU}") from exc
    if count == 0:
        raise RuntimeError(f"{what} needs a CUDA GPU, and CuPy sees none; {_ON_THE_CPU}")
    return count


def _current_device_id() -> int | None:
    cp = _array.cupy_or_none()
    if cp is None:
        return None
    try:
        return int(cp.cuda.runtime.getDevice())
    except Exception:
        return None


def _per_device(cache: dict[int, Any], read: Callable[[Any, int], Any], missing: Any) -> Any:
    """``read(cupy, device)`` for the current device, cached per device; ``missing`` without a
    GPU or when reading raises (not cached: the next call tries again)."""
    dev = _current_device_id()
    if dev is None:
        return missing
    if dev not in cache:
        try:
            cache[dev] = read(_array.cupy_or_none(), dev)
        except Exception:
            return missing
    return cache[dev]


def current_gpu_name() -> str | None:
    """The current CUDA device's name (e.g. ``"NVIDIA H200"``), or None without a GPU."""
    def read(cp: Any, dev: int) -> str | None:
        try:
            name = cp.cuda.runtime.getDeviceProperties(dev)["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            return None  # remembered: the name is only shown and recorded

    return _per_device(_gpu_names, read, None)


def device_arch() -> int | None:
    """Compute capability of the current device (cached per device), None without one."""
    return _per_device(_device_archs,
                       lambda cp, dev: int(cp.cuda.Device(dev).compute_capability), None)


def device_sm_count() -> int:
    """Multiprocessors of the current device (cached per device), 0 without one."""
    return _per_device(_device_sms, lambda cp, dev: int(
        cp.cuda.Device(dev).attributes["MultiProcessorCount"]), 0)


def device_cc() -> int:
    """Compute capability of the current CUDA device as an int (e.g. 90)."""
    cp = _array.cupy_or_none()
    if cp is None:
        raise RuntimeError("CuPy is not installed: install Tessera with the CUDA extras "
                           f"({install_hint('cuda13')}, or cuda12)")
    return int(cp.cuda.Device().compute_capability)


@functools.lru_cache(maxsize=1)
def driver_library() -> ctypes.CDLL | None:
    """libcuda through ctypes, for the driver calls CuPy does not expose (None without a
    driver)."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def _stream_get_id() -> Any:
    lib = driver_library()
    fn = getattr(lib, "cuStreamGetId", None) if lib is not None else None
    if fn is not None:  # CUDA 12.0 and newer drivers
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]
        fn.restype = ctypes.c_int
    return fn


def stream_id(handle: int) -> int | None:
    """The driver's id of the stream at ``handle`` in the current context: unique for the
    context's lifetime, so a stream made at a destroyed stream's address gets a new one, and
    the per-thread default stream's differs per thread. None where the driver cannot say
    (older than CUDA 12, or no context yet)."""
    fn = _stream_get_id()
    if fn is None:
        return None
    out = ctypes.c_ulonglong()
    if fn(ctypes.c_void_p(handle), ctypes.byref(out)) != 0:
        return None
    return int(out.value)
