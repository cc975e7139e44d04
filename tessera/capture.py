"""CUDA-graph capture: memory that lives as long as the graph, and the streams being captured.

A captured request's kernels keep the addresses of everything it allocated (plan buffers, the
mask's copy, task counters) and write them again at every replay, so that memory must neither
come from cudaMalloc during the capture (PyTorch captures in the mode that forbids it) nor be
handed to anyone else afterwards. PyTorch callers get it from torch's allocator, i.e. from the
graph's private memory pool, which torch keeps for the graph's lifetime; everyone else (CuPy's
own graph capture) from CuPy's pool, kept until :func:`release_captured_memory`. Constant
arrays a plan copies from the host (:func:`device_copy`) must exist before a capture: a
host-to-device copy cannot be captured.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from ._array import cupy_or_none

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
            scope = _current_scope()
            with _captured_lock:
                _captured_memory.append(ptr)
                if scope is not None:
                    scope._memory.append(ptr)
            return ptr
    _capture.depth = 1
    _capture.framework = framework
    try:
        with cp.cuda.using_allocator(allocate):
            yield
    finally:
        _capture.depth = 0


def capture_memory_if(active: bool, framework: str, device_id: int) -> Any:
    """:func:`capture_memory` while ``active`` (a stream being captured), else a context that
    does nothing and costs nothing (the request path's case)."""
    return capture_memory(framework, device_id) if active else _NO_CONTEXT


_NO_CONTEXT = contextlib.nullcontext()


def release_captured_memory() -> int:
    """Give back all the CuPy memory that requests captured outside PyTorch (CuPy's own graph
    capture) kept for their graphs; call it once no such graph will be launched again (one
    graph's alone: :class:`CapturedMemory`). Returns the bytes released. (PyTorch's graphs hold
    theirs in their own memory pools.)"""
    with _captured_lock:
        released = sum(int(p.mem.size) for p in _captured_memory)
        _captured_memory.clear()
        _pinned["cupy"].clear()
        for scope in list(_scopes):
            scope._memory.clear()
            scope._pins.clear()
    return released


class CapturedMemory:
    """The memory one CuPy graph's captured requests keep, to give back when that graph is done
    while others stay (``release_captured_memory`` gives back everything)::

        with tessera.CapturedMemory() as kept:     # around the capture
            stream.begin_capture(); out = tessera.attention(q, k, v, mask)
            graph = stream.end_capture()
        ...                                        # replays
        kept.release()                             # this graph is not launched again
    """

    def __init__(self) -> None:
        self._memory: list = []
        self._pins: list = []

    def __enter__(self) -> "CapturedMemory":
        _scope_stack().append(self)
        with _captured_lock:
            _scopes.add(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _scope_stack().remove(self)

    @property
    def nbytes(self) -> int:
        """Bytes kept for this scope's captures."""
        with _captured_lock:
            return sum(int(p.mem.size) for p in self._memory)

    def release(self) -> int:
        """Give back this scope's memory (and its hold on constant arrays); returns the bytes."""
        with _captured_lock:
            mine = {id(p) for p in self._memory}
            released = sum(int(p.mem.size) for p in self._memory)
            _captured_memory[:] = [p for p in _captured_memory if id(p) not in mine]
            for pin in self._pins:  # one hold each: another graph may hold the same array
                for i, other in enumerate(_pinned["cupy"]):
                    if other is pin:
                        del _pinned["cupy"][i]
                        break
            self._memory.clear()
            self._pins.clear()
            _scopes.discard(self)
        return released


_scopes: set = set()  # scopes entered and not yet released


def _scope_stack() -> list:
    if not hasattr(_capture, "scopes"):
        _capture.scopes = []
    return _capture.scopes


def _current_scope() -> "CapturedMemory | None":
    stack = _scope_stack()
    return stack[-1] if stack else None


_DEVICE_COPIES: dict = {}
# Constant arrays a captured graph reads by address, kept alive for the graph whatever the
# cache above drops: CuPy captures' until release_captured_memory, PyTorch captures' for the
# process (Tessera cannot see when a torch graph is freed; they are a few small arrays per
# captured geometry).
_pinned: dict[str, list] = {"cupy": [], "torch": []}


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
    elif capturing():
        framework = "torch" if getattr(_capture, "framework", "cupy") == "torch" else "cupy"
        scope = _current_scope() if framework == "cupy" else None
        with _captured_lock:
            if scope is not None:  # one hold per graph scope, given back with it
                if not any(p is got for p in scope._pins):
                    scope._pins.append(got)
                    _pinned[framework].append(got)
            elif not any(p is got for p in _pinned[framework]):
                _pinned[framework].append(got)
    return got
