"""CPU tests of what launch.py decides without a GPU: which runs share per-stream state."""

from __future__ import annotations

import threading

from tessera import launch


def test_streams_are_told_apart_by_the_drivers_id(monkeypatch):
    """One address with two driver ids (a stream made where a destroyed one was) is two
    streams; one id is one stream."""
    ids = {"next": 7}
    monkeypatch.setattr(launch, "_stream_ids", {})
    monkeypatch.setattr(launch, "gpu_count", lambda: 1)
    monkeypatch.setattr(launch, "stream_capturing", lambda ptr: False)
    monkeypatch.setattr(launch, "stream_id", lambda ptr: ids["next"])
    first = launch._stream_identity(0xABC0)
    ids["next"] = 8
    assert launch._stream_identity(0xABC0) != first
    ids["next"] = 7
    assert launch._stream_identity(0xABC0) == first
    asked = []
    monkeypatch.setattr(launch, "stream_id", lambda ptr: asked.append(ptr) or 9)
    assert launch._stream_identity(0) == (0, 0) and not asked  # the legacy stream: never asked


def test_threads_tell_per_thread_streams_apart(monkeypatch):
    """The per-thread default stream (one address for every thread) is keyed by thread; where
    the driver gives no id, any other stream by its address alone."""
    monkeypatch.setattr(launch, "stream_id", lambda ptr: None)
    monkeypatch.setattr(launch, "gpu_count", lambda: 1)
    monkeypatch.setattr(launch, "stream_capturing", lambda ptr: False)
    here = launch._stream_identity(launch._PER_THREAD_STREAM)
    there = []
    t = threading.Thread(target=lambda: there.append(
        launch._stream_identity(launch._PER_THREAD_STREAM)))
    t.start()
    t.join()
    assert here != there[0]
    assert launch._stream_identity(0xABC0) == (0xABC0, 0)


def test_a_stream_being_captured_keeps_the_id_last_seen(monkeypatch):
    """While a CUDA graph is captured the driver is not asked (the query would invalidate the
    capture): the stream's id is the one its last eager run saw."""
    monkeypatch.setattr(launch, "_stream_ids", {})
    monkeypatch.setattr(launch, "gpu_count", lambda: 1)
    monkeypatch.setattr(launch, "stream_capturing", lambda ptr: False)
    monkeypatch.setattr(launch, "stream_id", lambda ptr: 31)
    eager = launch._stream_identity(0xD000)
    monkeypatch.setattr(launch, "stream_capturing", lambda ptr: True)
    monkeypatch.setattr(launch, "stream_id", lambda ptr: 1 / 0)
    assert launch._stream_identity(0xD000) == eager == (0xD000, 31)
