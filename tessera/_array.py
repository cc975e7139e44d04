"""Array-module plumbing: numpy or CuPy (``xp``), CSR helpers, one-allocation workspaces, and
PyTorch's current stream.

Everything above this module works on "an array of module ``xp``" and never imports CuPy
directly (CuPy is loaded here, lazily), so the library imports and plans on machines without a
GPU or without CuPy.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

_cupy: types.ModuleType | None | bool = False  # False: not looked up yet; None: unavailable


def cupy_or_none() -> types.ModuleType | None:
    """CuPy if it imports, else None (imported lazily: it is an optional dependency)."""
    global _cupy
    if _cupy is False:
        try:
            import cupy  # noqa: PLC0415

            _cupy = cupy
        except Exception:  # ImportError, or a CuPy build that cannot find its CUDA libraries
            _cupy = None
    return _cupy  # type: ignore[return-value]


def is_cupy(a: Any) -> bool:
    """True when ``a`` is a CuPy ndarray."""
    cp = cupy_or_none()
    return cp is not None and isinstance(a, cp.ndarray)


def array_module(*arrays: Any) -> types.ModuleType:
    """numpy, or CuPy when any of ``arrays`` lives on the device."""
    for a in arrays:
        if is_cupy(a):
            return cupy_or_none()  # type: ignore[return-value]
    return np


def private_copy(a: Any) -> Any:
    """A copy of ``a`` its caller cannot change under us. A contiguous CuPy array is copied by
    one device-to-device memcpy on the current stream: CuPy's ``copy`` launches an elementwise
    kernel, ~3x the host time on the request path (a mask object a request)."""
    if is_cupy(a) and a.flags.c_contiguous and a.nbytes:
        with a.device:  # (as CuPy's copy: the copy lives where the array does)
            out = cupy_or_none().empty(a.shape, dtype=a.dtype)
            out.data.copy_from_device_async(a.data, a.nbytes)
        return out
    return a.copy()


def to_numpy(a: Any) -> np.ndarray:
    """A host copy of ``a`` (no copy when it is already numpy)."""
    if is_cupy(a):
        return a.get()
    return np.asarray(a)


def segment_ids(offsets: Any, total: int, xp) -> Any:
    """For CSR-style ``offsets`` (length n+1), the segment of each of the ``total`` elements.

    Equivalent to ``repeat(arange(n), diff(offsets))`` but works the same in numpy and CuPy
    (whose ``repeat`` wants host counts): write, at the first element of each non-empty segment,
    the step from the previous non-empty segment, then take a running sum. No host sync.
    """
    counts = xp.diff(offsets)
    if xp is np:
        return np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    nonempty = xp.nonzero(counts > 0)[0]
    delta = xp.zeros(total, dtype=np.int64)
    if total:
        steps = xp.diff(nonempty, prepend=xp.zeros(1, dtype=nonempty.dtype))
        delta[offsets[:-1][nonempty]] = steps
    return xp.cumsum(delta)


def offsets_from_counts(counts: Any, xp) -> Any:
    """CSR offsets (int64, length n+1) from per-segment counts."""
    out = xp.zeros(counts.size + 1, dtype=np.int64)
    xp.cumsum(counts, out=out[1:])
    return out


class Workspace:
    """Arrays carved from one allocation (each allocation costs microseconds on the request
    path): ``regions`` of (name, dtype, count), each 8-byte aligned. ``view(name)`` is a region
    as an array; ``arg(name)`` the kernel argument for it -- its device address (np.uint64) on
    CuPy, which costs no array object, or the view on numpy (the CPU tests' kernel stand-ins)."""

    def __init__(self, xp: Any, regions: tuple[tuple[str, Any, int], ...]) -> None:
        self._layout, nbytes = _workspace_layout(regions)
        self._buf = xp.empty(nbytes // 8, dtype=np.int64)
        self._base = None if xp is np else int(self._buf.data.ptr)

    def view(self, name: str) -> Any:
        off, dtype, count = self._layout[name]
        if dtype == np.int64:  # one slice of the int64 buffer
            return self._buf[off // 8:off // 8 + count]
        return self._buf.view(np.uint8)[off:off + count * dtype.itemsize].view(dtype)

    def arg(self, name: str) -> Any:
        if self._base is None:
            return self.view(name)
        return np.uint64(self._base + self._layout[name][0])


@functools.lru_cache(maxsize=64)  # one layout per mask geometry
def _workspace_layout(regions: tuple[tuple[str, Any, int], ...]) -> tuple[dict, int]:
    """Per region name its (byte offset, dtype, count), and the total bytes."""
    layout: dict = {}
    nbytes = 0
    for name, dtype, count in regions:
        dt = np.dtype(dtype)
        layout[name] = (nbytes, dt, count)
        nbytes += -(-count * dt.itemsize // 8) * 8
    return layout, nbytes


def torch_stream_ptr(device_id: int) -> int:
    """PyTorch's current CUDA stream on ``device_id`` as a raw pointer. Through the raw-stream
    query torch's own compiler uses when it exists: ``torch.cuda.current_stream`` builds a
    Stream object, ~5 us on the request path."""
    import torch  # noqa: PLC0415 - the caller's own framework, already imported

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device_id))
    return int(torch.cuda.current_stream(device_id).cuda_stream)
