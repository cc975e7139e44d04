"""CPU tests of what launch.py decides without a GPU: which runs share per-stream state."""

from __future__ import annotations

import threading

from tessera import launch


def test_streams_are_told_apart_by_the_drivers_id(monkeypatch):
    """One address with two driver ids (a stream made where a destroyed one was) is two
    streams; one id is one stream."""
    ids = {"next": 7}
    monkeypatch.setattr(launch, "stream_id", lambda ptr: ids["next"])
    first = launch._stream_identity(0xABC0)
    ids["next"] = 8
    assert launch._stream_identity(0xABC0) != first
    ids["next"] = 7
    assert launch._stream_identity(0xABC0) == first


def test_without_driver_ids_threads_tell_per_thread_streams_apart(monkeypatch):
    """Where the driver gives no id, the per-thread default stream (one address for every
    thread) is keyed by thread; any other stream by its address alone."""
    monkeypatch.setattr(launch, "stream_id", lambda ptr: None)
    here = launch._stream_identity(launch._PER_THREAD_STREAM)
    there = []
    t = threading.Thread(target=lambda: there.append(
        launch._stream_identity(launch._PER_THREAD_STREAM)))
    t.start()
    t.join()
    assert here != there[0]
    assert launch._stream_identity(0xABC0) == (0xABC0, 0)
