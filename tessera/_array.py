"""Array-module plumbing: one place that knows about numpy, CuPy and DLPack.

Everything above this module works on "an array of module ``xp``" and never imports CuPy
directly, so the library imports and plans on machines without a GPU or without CuPy.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from typing import Any, Iterator

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


def as_array(a: Any, name: str) -> Any:
    """Turn numpy/CuPy arrays, DLPack tensors (PyTorch, JAX) or sequences into numpy or CuPy.

    Device tensors stay on the device (zero-copy through DLPack); host tensors become numpy.
    """
    if isinstance(a, np.ndarray) or is_cupy(a):
        return a
    if type(a).__module__.startswith("torch") and getattr(a, "is_cuda", False):
        return _cupy_view_of_torch(a, name)
    if hasattr(a, "__dlpack__"):
        device_type = None
        if hasattr(a, "__dlpack_device__"):
            device_type = int(a.__dlpack_device__()[0])
        if device_type in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
            cp = cupy_or_none()
            if cp is None:
                raise TypeError(f"{name} is a CUDA tensor but CuPy is not installed")
            return cp.from_dlpack(a)
        return np.from_dlpack(a)
    try:
        return np.asarray(a)
    except Exception as exc:  # pragma: no cover - message path
        raise TypeError(f"{name} must be an array (numpy, CuPy or a DLPack tensor), "
                        f"got {type(a).__name__}") from exc


def _cupy_view_of_torch(a: Any, name: str) -> Any:
    """A CuPy array over a CUDA torch tensor's memory, no copy, without torch's ``__dlpack__``
    (which costs tens of microseconds on the request path) when torch and CuPy work on the same
    stream, so that CuPy's work on the array is ordered after torch's. Otherwise, and for
    bfloat16 (no CuPy dtype), DLPack, whose stream handshake orders them."""
    cp = cupy_or_none()
    if cp is None:
        raise TypeError(f"{name} is a CUDA tensor but CuPy is not installed")
    with cp.cuda.Device(a.device.index):
        dt = _numpy_dtype_on_cupy_stream(a, cp)
        if dt is None:
            return cp.from_dlpack(a)
        if a.numel() == 0:
            return cp.empty(tuple(a.shape), dtype=dt)
        span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride()))  # elements spanned
        mem = cp.cuda.UnownedMemory(a.data_ptr(), span * dt.itemsize, a, a.device.index)
        return cp.ndarray(tuple(a.shape), dtype=dt, memptr=cp.cuda.MemoryPointer(mem, 0),
                          strides=tuple(s * dt.itemsize for s in a.stride()))


def torch_private_copy(a: Any) -> Any:
    """A CuPy copy of a contiguous CUDA torch tensor of a numpy dtype, made by one
    device-to-device copy on CuPy's current stream of its device when that is torch's current
    stream there (so the copy is ordered after whatever torch wrote into it), without a CuPy
    view of the tensor first (~30 us of a request's host time on the H200 machine,
    benchmarks/line_times.py); None when any of that does not hold (the caller then takes the
    general path: a view or DLPack, and private_copy)."""
    cp = cupy_or_none()
    if cp is None or not a.is_contiguous():
        return None
    with cp.cuda.Device(a.device.index):
        dtype = _numpy_dtype_on_cupy_stream(a, cp)
        if dtype is None:
            return None
        out = cp.empty(tuple(a.shape), dtype=dtype)
        if out.nbytes:
            cp.cuda.runtime.memcpyAsync(out.data.ptr, a.data_ptr(), out.nbytes,
                                        cp.cuda.runtime.memcpyDeviceToDevice,
                                        cp.cuda.get_current_stream().ptr)
    return out


def _numpy_dtype_on_cupy_stream(a: Any, cp: Any) -> np.dtype | None:
    """The numpy dtype of a CUDA torch tensor when numpy has one (not bfloat16) and torch's
    current stream on its device is CuPy's (CuPy's work on its memory is then ordered after
    torch's), else None. Called with the tensor's device current (CuPy's current stream is per
    device)."""
    from .interop import torch_stream_ptr  # noqa: PLC0415 - interop imports this module

    try:
        dtype = np.dtype(str(a.dtype).removeprefix("torch."))
    except TypeError:  # bfloat16 and other types numpy lacks
        return None
    if torch_stream_ptr(a.device.index) != cp.cuda.get_current_stream().ptr:
        return None
    return dtype


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


_DEVICE_COPIES: dict = {}


def device_copy(key: tuple, make: Any, xp) -> Any:
    """``make()`` (host arrays put on the device), made once per ``key`` and current device: a
    copy from pageable host memory may wait for the stream, so requests reuse the first one.
    Inside :func:`capture_memory` a missing copy is an error: a host-to-device copy cannot be
    captured into a CUDA graph, and one made there would live in the graph's memory."""
    key = (xp.cuda.Device().id, *key)
    got = _DEVICE_COPIES.get(key)
    if got is None:
        if capturing():
            raise RuntimeError(
                "a CUDA graph is being captured and this mask geometry and attention shape "
                "have not run outside a capture yet: run the same request once before capturing "
                "(a warm-up), so that its constant arrays are on the GPU")
        if len(_DEVICE_COPIES) > 128:
            _DEVICE_COPIES.clear()
        got = _DEVICE_COPIES[key] = make()
    return got


# ---- CUDA-graph capture: memory that lives as long as the graph ---------------------------------
# A captured request's kernels keep the addresses of everything it allocated (plan buffers, the
# mask's copy, task counters) and write them again at every replay, so that memory must neither
# come from cudaMalloc during the capture (PyTorch captures in the mode that forbids it) nor be
# handed to anyone else afterwards. PyTorch callers get it from torch's allocator, i.e. from the
# graph's private memory pool, which torch keeps for the graph's lifetime; everyone else (CuPy's
# own graph capture) from CuPy's pool, kept until release_captured_memory().
_capture = threading.local()
_captured_memory: list = []
_captured_lock = threading.Lock()


def stream_capturing(stream_ptr: int) -> bool:
    """Whether the CUDA stream ``stream_ptr`` (of the current device) is being captured."""
    cp = cupy_or_none()
    return cp is not None and bool(cp.cuda.runtime.streamIsCapturing(stream_ptr))


def capturing() -> bool:
    """Whether this thread is inside :func:`capture_memory` (a request being captured)."""
    return getattr(_capture, "depth", 0) > 0


@contextlib.contextmanager
def capture_memory(framework: str, device_id: int) -> Iterator[None]:
    """CuPy allocations of this thread, while a request is captured into a CUDA graph, from
    memory that outlives the request: the graph's pool for ``framework`` "torch" (allocated on
    torch's current stream, the one captured), else CuPy memory kept until
    :func:`release_captured_memory`. Nested uses keep the outermost allocator."""
    if capturing():
        _capture.depth += 1
        try:
            yield
        finally:
            _capture.depth -= 1
        return
    cp = cupy_or_none()
    if framework == "torch":
        import torch  # noqa: PLC0415 - the caller's own framework, already imported

        def allocate(nbytes: int) -> Any:
            t = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=f"cuda:{device_id}")
            mem = cp.cuda.UnownedMemory(t.data_ptr(), nbytes, t, device_id)
            return cp.cuda.MemoryPointer(mem, 0)
    else:
        pool = cp.get_default_memory_pool()

        def allocate(nbytes: int) -> Any:
            ptr = pool.malloc(nbytes)
            with _captured_lock:
                _captured_memory.append(ptr)
            return ptr
    _capture.depth = 1
    try:
        with cp.cuda.using_allocator(allocate):
            yield
    finally:
        _capture.depth = 0


def capture_memory_if(active: bool, framework: str, device_id: int) -> Any:
    """:func:`capture_memory` while ``active`` (a stream being captured), else a context that
    does nothing and costs nothing (the request path's case)."""
    return capture_memory(framework, device_id) if active else _NO_CONTEXT


def capture_memory_for(a: Any) -> Any:
    """For work on ``a`` (a CUDA torch tensor or a CuPy array) while the stream ordering work on
    it -- torch's or CuPy's current one on its device -- is being captured into a CUDA graph:
    :func:`capture_memory`, with CuPy working on that stream (a torch tensor's work would go to
    CuPy's own, which the graph does not capture); else a context that does nothing."""
    if capturing():
        return _NO_CONTEXT
    cp = cupy_or_none()
    if type(a).__module__.startswith("torch") and bool(getattr(a, "is_cuda", False)):
        from .interop import torch_stream_ptr  # noqa: PLC0415 - interop imports this module

        device = int(a.device.index)
        stream = torch_stream_ptr(device)
        if not stream_capturing(stream):
            return _NO_CONTEXT
        return _on_stream_capturing("torch", device, stream)
    if is_cupy(a):
        device = int(a.device.id)
        with a.device:
            stream = int(cp.cuda.get_current_stream().ptr)
        return capture_memory_if(stream_capturing(stream), "cupy", device)
    return _NO_CONTEXT


@contextlib.contextmanager
def _on_stream_capturing(framework: str, device: int, stream: int) -> Iterator[None]:
    """CuPy's current device and stream set to the captured ``stream``, memory for the graph."""
    cp = cupy_or_none()
    with cp.cuda.Device(device), cupy_external_stream(stream, device), \
            capture_memory(framework, device):
        yield


class _RawStream:
    """A raw stream pointer in the CUDA stream protocol, which ``Stream.from_external`` reads."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def cupy_external_stream(ptr: int, device_id: int) -> Any:
    """A CuPy stream object for another framework's raw CUDA stream ``ptr`` on ``device_id``
    (owning nothing; usable as a context manager)."""
    cp = cupy_or_none()
    if hasattr(cp.cuda.Stream, "from_external"):  # CuPy 14 deprecates ExternalStream for it
        with cp.cuda.Device(device_id):  # the stream belongs to that device
            return cp.cuda.Stream.from_external(_RawStream(ptr))
    return cp.cuda.ExternalStream(ptr, device_id)


_NO_CONTEXT = contextlib.nullcontext()


def release_captured_memory() -> int:
    """Give back the CuPy memory that requests captured outside PyTorch (CuPy's own graph
    capture) kept for their graphs; call it once no such graph will be launched again. Returns
    the bytes released. (PyTorch's graphs hold theirs in their own memory pools.)"""
    with _captured_lock:
        released = sum(int(p.mem.size) for p in _captured_memory)
        _captured_memory.clear()
    return released


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
