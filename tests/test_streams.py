"""CPU tests of streams.py without a GPU: which streams are one stream, held objects."""

from __future__ import annotations

import threading

from tessera import streams


def test_streams_are_told_apart_by_the_drivers_id(monkeypatch):
    """One address with two driver ids (a stream made where a destroyed one was) is two
    streams; one id is one stream."""
    ids = {"next": 7}
    monkeypatch.setattr(streams, "_stream_ids", {})
    monkeypatch.setattr(streams, "gpu_count", lambda: 1)
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: False)
    monkeypatch.setattr(streams, "stream_id", lambda ptr: ids["next"])
    first = streams.stream_identity(0xABC0)
    ids["next"] = 8
    assert streams.stream_identity(0xABC0) != first
    ids["next"] = 7
    assert streams.stream_identity(0xABC0) == first
    asked = []
    monkeypatch.setattr(streams, "stream_id", lambda ptr: asked.append(ptr) or 9)
    assert streams.stream_identity(0) == (0, 0) and not asked  # the legacy stream: never asked


def test_threads_tell_per_thread_streams_apart(monkeypatch):
    """The per-thread default stream (one address for every thread) is keyed by thread; where
    the driver gives no id, any other stream by its address alone."""
    monkeypatch.setattr(streams, "stream_id", lambda ptr: None)
    monkeypatch.setattr(streams, "gpu_count", lambda: 1)
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: False)
    here = streams.stream_identity(streams.PER_THREAD_STREAM)
    there = []
    t = threading.Thread(target=lambda: there.append(
        streams.stream_identity(streams.PER_THREAD_STREAM)))
    t.start()
    t.join()
    assert here != there[0]
    assert streams.stream_identity(0xABC0) == (0xABC0, 0)


def test_a_stream_being_captured_keeps_the_id_last_seen(monkeypatch):
    """While a CUDA graph is captured the driver is not asked (the query would invalidate the
    capture): the stream's id is the one its last eager run saw."""
    monkeypatch.setattr(streams, "_stream_ids", {})
    monkeypatch.setattr(streams, "gpu_count", lambda: 1)
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: False)
    monkeypatch.setattr(streams, "stream_id", lambda ptr: 31)
    eager = streams.stream_identity(0xD000)
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: True)
    monkeypatch.setattr(streams, "stream_id", lambda ptr: 1 / 0)
    assert streams.stream_identity(0xD000) == eager == (0xD000, 31)


class FakeCuPy:
    """Just what streams.py asks of CuPy: events recorded and streams waiting, as calls."""

    def __init__(self) -> None:
        self.waits, self.records, self.done = [], [], set()
        fake = self

        class Event:
            count = 0

            def __init__(self, **_) -> None:
                Event.count += 1
                self.ptr = 0xE000 + Event.count

            def record(self, stream=None) -> None:
                fake.records.append((self.ptr, getattr(stream, "ptr", 0)))

            @property
            def done(self) -> bool:
                return self.ptr in fake.done

        class Runtime:
            @staticmethod
            def streamWaitEvent(stream, event, flags):
                fake.waits.append((stream, event))

            @staticmethod
            def eventRecord(event, stream):
                fake.records.append((event, stream))
                fake.done.discard(event)

            @staticmethod
            def getDevice():
                return 0

        self.current = type("stream", (), {"ptr": 0x5000})()
        self.cuda = type("cuda", (), {"Event": Event, "runtime": Runtime,
                                      "get_current_stream": staticmethod(lambda: self.current)})


def fake_streams(monkeypatch) -> FakeCuPy:
    """streams.py on a FakeCuPy, with stand-in streams that are never captured and that the
    driver names by their address."""
    fake = FakeCuPy()
    monkeypatch.setattr(streams, "cupy_or_none", lambda: fake)
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: False)
    monkeypatch.setattr(streams, "gpu_count", lambda: 1)
    monkeypatch.setattr(streams, "stream_id", lambda ptr: ptr)
    monkeypatch.setattr(streams, "_held", streams.collections.deque())
    monkeypatch.setattr(streams, "_spare_events", [])
    return fake


def test_a_mark_orders_each_other_stream_once(monkeypatch):
    """A reader on the writer's stream waits for nothing; each other stream waits once for the
    event, and again after the mark moves (new writes)."""
    fake = fake_streams(monkeypatch)
    mark = streams.StreamMark.here()  # on 0x5000
    event = mark.event.ptr
    mark.order(0x5000)
    assert fake.waits == []
    for _ in range(3):
        mark.order(0x6000)
    mark.order(0)
    assert fake.waits == [(0x6000, event), (0, event)]
    fake.current = type("stream", (), {"ptr": 0x6000})()
    mark.again()  # written again, on 0x6000
    mark.order(0x6000)
    mark.order(0x5000)
    assert fake.waits[2:] == [(0x5000, event)] and mark.on == (0x6000, 0x6000)


def test_a_captured_mark_orders_no_stream_outside_the_capture(monkeypatch):
    """A mark made while its stream is captured (graph memory): streams outside the capture do
    not wait for its event (the driver refuses such a wait); captured ones do."""
    fake = fake_streams(monkeypatch)
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: ptr == 0x5000)
    mark = streams.StreamMark.here()
    assert mark.captured
    mark.order(0x6000)
    assert fake.waits == []
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: ptr in (0x5000, 0x7000))
    mark.order(0x7000)
    assert fake.waits == [(0x7000, mark.event.ptr)]


def test_a_captured_reader_waits_through_an_external_event_node(monkeypatch):
    """A stream being captured may not depend on work outside its capture (the driver refuses
    it): it waits on a mark made outside the capture with cudaEventWaitExternal, an event node
    of the graph that every replay waits on."""
    fake = fake_streams(monkeypatch)
    waits = []
    fake.cuda.runtime.streamWaitEvent = staticmethod(
        lambda stream, event, flags: waits.append((stream, flags)))
    mark = streams.StreamMark.here()  # on 0x5000, not captured
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: ptr == 0x7000)
    mark.order(0x7000)
    mark.order(0x6000)
    assert waits == [(0x7000, 1), (0x6000, 0)]
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: False)
    mark.order(0x7000)  # the capture ended: its eager work still waits, once
    mark.order(0x7000)
    assert waits[2:] == [(0x7000, 0)]


def test_held_objects_live_until_their_readers_are_done(monkeypatch):
    """hold_while_read keeps an object until the event recorded on the reader's stream is done,
    in order, and reuses the events of released holds; a stream being captured holds nothing."""
    fake = fake_streams(monkeypatch)
    a, b = object(), object()
    streams.hold_while_read(0x6000, a)
    streams.hold_while_read(0x7000, b)
    assert streams.held_count() == 2
    first, second = (e for e, _ in fake.records)
    fake.done.add(second)
    assert streams.held_count() == 2  # the first reader still runs: in order
    fake.done.add(first)
    assert streams.held_count() == 0
    streams.hold_while_read(0x6000, a)
    assert fake.records[-1] == (second, 0x6000)  # an event of a released hold, recorded again
    monkeypatch.setattr(streams, "stream_capturing", lambda ptr: True)
    streams.hold_while_read(0x6000, b)
    assert streams.held_count() == 1
