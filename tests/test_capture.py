"""CPU tests of tessera/capture.py: memory kept for CUDA graphs, and its contexts outside a
capture (no GPU needed)."""

from __future__ import annotations

import types

import pytest

from tessera import capture


def test_outside_a_capture_nothing_is_captured():
    assert not capture.capturing()
    with capture.capture_memory_if(False, "cupy", 0):
        assert not capture.capturing()


def _ptr(n):
    return types.SimpleNamespace(mem=types.SimpleNamespace(size=n))


def test_a_scope_gives_back_its_own_memory_only(monkeypatch):
    """CapturedMemory releases what its captures kept and leaves another scope's; a release of
    everything empties both."""
    monkeypatch.setattr(capture, "_captured_memory", [])
    monkeypatch.setattr(capture, "_scopes", set())
    with capture.CapturedMemory() as first:
        a = _ptr(100)
        capture._captured_memory.append(a)
        first._memory.append(a)
    with capture.CapturedMemory() as second:
        b = _ptr(40)
        capture._captured_memory.append(b)
        second._memory.append(b)
    assert (first.nbytes, second.nbytes) == (100, 40)
    assert first.release() == 100 and capture._captured_memory == [b]
    assert capture.release_captured_memory() == 40 and second.nbytes == 0


def test_a_copy_missing_inside_a_capture_says_to_warm_up(monkeypatch):
    """A constant array not yet on the GPU when a capture needs it: the message says to run the
    request once first (a host-to-device copy cannot be captured)."""
    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(id=0)))
    monkeypatch.setattr(capture, "_DEVICE_COPIES", {})
    monkeypatch.setattr(capture._capture, "depth", 1, raising=False)
    with pytest.raises(RuntimeError, match="run the same request once before capturing"):
        capture.device_copy(("bounds",), lambda: pytest.fail("copied inside a capture"), xp)
    monkeypatch.setattr(capture._capture, "depth", 0)
    made = capture.device_copy(("bounds",), lambda: "on the device", xp)
    assert made == "on the device"
    assert capture.device_copy(("bounds",), lambda: pytest.fail("copied twice"), xp) is made
