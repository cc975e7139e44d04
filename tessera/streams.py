"""Order between CUDA streams: where Tessera's device arrays were written, and readers elsewhere.

A mask's private copy and a plan's queue are written on one stream -- the one current when they
are made -- and may be read on another: a mask made on a PyTorch side stream and planned on the
caller's stream, a plan made on CuPy's stream and run on torch's. Nothing orders two streams
unless someone does (PyTorch's side streams and CuPy's ``non_blocking`` streams do not even
wait for the legacy default stream), so:

- :class:`StreamMark` remembers the writer's stream and an event recorded after the writes; a
  reader on another stream waits for that event on the device (no host synchronization), once
  per stream.
- :func:`hold_while_read` keeps an object alive until the reader's stream has passed the point
  of the call: CuPy's memory pool hands a freed block to the next allocation *on the stream
  that allocated it*, with no ordering against the other streams still reading it.

A stream is named by :func:`stream_identity`, not by its address alone: a stream made after
another is destroyed often gets its address while the old one's work is still pending.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any

from ._array import cupy_or_none, is_cupy, torch_stream_ptr
from .capture import capture_memory, capturing, stream_capturing
from .cuda.device import gpu_count, stream_id

__all__ = ["PER_THREAD_STREAM", "StreamMark", "stream_identity", "hold_while_read",
           "held_count", "cupy_external_stream", "cupy_stream", "on_producer_stream"]

# cudaStreamPerThread: one value for every thread's own default stream.
PER_THREAD_STREAM = 2
# cudaEventWaitExternal: a captured stream's wait on an event recorded outside the capture.
_EVENT_WAIT_EXTERNAL = 1

_stream_ids: dict[int, int | None] = {}  # per stream address, the driver's id last seen there


def stream_identity(ptr: int) -> tuple[int, int]:
    """A stream as (address, the driver's stream id). The default streams (handles 0-2) are
    never destroyed and are not asked about: a query of the legacy stream invalidates a CUDA
    graph being captured; the per-thread one has one address for all threads, which the thread
    tells apart. Where the driver gives no id (before CUDA 12), the address stands for the
    stream."""
    if ptr <= PER_THREAD_STREAM:
        return ptr, threading.get_ident() if ptr == PER_THREAD_STREAM else 0
    if not gpu_count():  # no driver to ask (a host-side test's stand-in streams)
        return ptr, 0
    if stream_capturing(ptr):
        # The driver is not asked while the stream is captured into a graph (the query
        # invalidates the capture); a stream being captured is alive, so the id last seen at
        # its address is its own.
        sid = _stream_ids.get(ptr)
    else:
        sid = _stream_ids[ptr] = stream_id(ptr)
        if len(_stream_ids) > 4096:  # addresses of streams long gone
            _stream_ids.clear()
            _stream_ids[ptr] = sid
    return ptr, 0 if sid is None else sid


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


_wrappers: dict[tuple[int, int], Any] = {}


def cupy_stream(ptr: int, device_id: int) -> Any:
    """:func:`cupy_external_stream`, made once per (device, stream address): it owns nothing,
    so a stream made later at the same address is the same stream to it. 0 is CuPy's legacy
    default stream."""
    cp = cupy_or_none()
    if not ptr:
        return cp.cuda.Stream.null
    key = (device_id, ptr)
    stream = _wrappers.get(key)
    if stream is None:
        if len(_wrappers) > 256:
            _wrappers.clear()
        stream = _wrappers[key] = cupy_external_stream(ptr, device_id)
    return stream


class _ProducerStream:
    """CuPy's current device and stream set to a torch tensor's producer stream, CuPy's
    allocations in the graph's memory while that stream is captured."""

    __slots__ = ("_device", "_stream", "_memory")

    def __init__(self, device: int, ptr: int) -> None:
        cp = cupy_or_none()
        self._device = cp.cuda.Device(device)
        self._stream = cupy_stream(ptr, device)
        self._memory = (capture_memory("torch", device)
                        if not capturing() and stream_capturing(ptr) else None)

    def __enter__(self) -> None:
        self._device.__enter__()
        self._stream.__enter__()
        if self._memory is not None:
            self._memory.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._memory is not None:
            self._memory.__exit__(*exc)
        self._stream.__exit__(*exc)
        self._device.__exit__(*exc)


_NO_CONTEXT = contextlib.nullcontext()


def on_producer_stream(a: Any) -> Any:
    """A context for Tessera's work on ``a`` (a mask's private copy of it): on the stream that
    orders its producer's work -- torch's current stream on its device for a CUDA torch tensor
    (CuPy's current one there is made that stream), CuPy's current stream for a CuPy array --
    and, while that stream is captured into a CUDA graph, with CuPy's allocations from memory the
    graph keeps (``capture.capture_memory``). Anything else (host arrays, JAX, whose DLPack
    export orders its work before CuPy's current stream): a context that does nothing."""
    if type(a).__module__.startswith("torch") and bool(getattr(a, "is_cuda", False)):
        device = int(a.device.index)
        return _ProducerStream(device, torch_stream_ptr(device))
    if is_cupy(a) and not capturing():
        cp = cupy_or_none()
        device = int(a.device.id)
        with a.device:
            stream = int(cp.cuda.get_current_stream().ptr)
        if stream_capturing(stream):
            return capture_memory("cupy", device)
    return _NO_CONTEXT


class StreamMark:
    """The point on a stream after which some device arrays are written: the stream's identity
    and an event recorded there. :meth:`order` makes another stream wait for it.

    A mark made while its stream is captured into a CUDA graph holds a captured event, which
    only streams of the same capture may wait for; the arrays then belong to the graph, and a
    stream outside the capture is not ordered (it would fail).
    """

    __slots__ = ("event", "on", "captured", "_ordered", "_lock")

    def __init__(self, event: Any, on: tuple[int, int], captured: bool) -> None:
        self.event = event
        self.on = on
        self.captured = captured
        self._ordered: set[tuple[int, int]] = {on}
        self._lock = threading.Lock()

    @classmethod
    def here(cls) -> "StreamMark":
        """A mark on CuPy's current stream of the current device, after everything enqueued
        there so far."""
        cp = cupy_or_none()
        stream = cp.cuda.get_current_stream()
        ptr = int(stream.ptr)
        event = cp.cuda.Event(block=False, disable_timing=True, interprocess=False)
        event.record(stream)
        return cls(event, stream_identity(ptr), stream_capturing(ptr))

    def again(self) -> None:
        """Move the mark to the end of CuPy's current stream (new writes of the same arrays): the
        same event recorded again. Waits enqueued before wait for what was recorded then."""
        cp = cupy_or_none()
        stream = cp.cuda.get_current_stream()
        ptr = int(stream.ptr)
        self.event.record(stream)
        with self._lock:
            self.on = stream_identity(ptr)
            self.captured = stream_capturing(ptr)
            self._ordered = {self.on}

    def order(self, stream_ptr: int, identity: tuple[int, int] | None = None) -> None:
        """Make the stream ``stream_ptr`` (of the current device; ``identity``: its
        :func:`stream_identity` when the caller has it) wait on the device for the marked
        point, unless it is the marked stream or already waited for it (its later work stays
        ordered after it)."""
        here = identity or stream_identity(stream_ptr)
        if here in self._ordered:
            return
        capturing_reader = stream_capturing(stream_ptr)
        if self.captured and not capturing_reader:
            return  # graph memory, read outside its graph: nothing to wait for
        # A stream being captured may not depend on work outside its capture: it waits through
        # an external event node of the graph instead, which each replay waits on.
        flags = _EVENT_WAIT_EXTERNAL if capturing_reader and not self.captured else 0
        cupy_or_none().cuda.runtime.streamWaitEvent(stream_ptr, self.event.ptr, flags)
        if not flags:  # (a graph's wait orders its replays, not the stream's later work)
            with self._lock:
                self._ordered.add(here)


# Objects read on a stream other than the one their memory belongs to, each with an event on
# the reader's stream after the reads: dropped once the event has completed, the event kept for
# the next hold (creating one costs more than recording it).
_held: collections.deque = collections.deque()
_spare_events: list = []
_held_lock = threading.Lock()


def hold_while_read(stream_ptr: int, obj: Any) -> None:
    """Keep ``obj`` alive until the work enqueued so far on the stream ``stream_ptr`` (of the
    current device) has run. Nothing is held for a stream being captured: a graph's reads run at
    its replays, whose memory the capture keeps (``capture.py``)."""
    if stream_capturing(stream_ptr):
        return  # (nor is an event queried: a query invalidates a capture in the global mode)
    _release_done()
    cp = cupy_or_none()
    device = cp.cuda.runtime.getDevice()
    with _held_lock:
        event = _spare_events.pop() if _spare_events and _spare_events[-1][1] == device \
            else None
    event = event[0] if event else cp.cuda.Event(block=False, disable_timing=True,
                                                 interprocess=False)
    cp.cuda.runtime.eventRecord(event.ptr, stream_ptr)
    with _held_lock:
        _held.append((event, obj, device))


def _release_done() -> None:
    """Drop the held objects whose readers have finished (in the order they were held; one
    still running keeps the later ones a little longer)."""
    with _held_lock:
        while _held and _held[0][0].done:
            event, _, device = _held.popleft()
            if len(_spare_events) < 64:
                _spare_events.append((event, device))


def held_count() -> int:
    """Objects held for readers still running (for tests)."""
    _release_done()
    with _held_lock:
        return len(_held)
