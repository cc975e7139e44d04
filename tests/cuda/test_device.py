"""CPU tests of the device properties (tessera.cuda.device), with a fake CuPy."""

from __future__ import annotations

import pytest

from tessera.cuda import device as D
from tests.runtime.regime.regime_helpers import clean_selection  # noqa: F401 (autouse fixture)

REAL_GPU_NAME = D.current_gpu_name  # the fixture below stubs it; one test checks the real one


def test_device_properties_cached_per_device(monkeypatch):
    """Name, architecture and SM count of the current device are read once per device; a failed
    read gives the 'no GPU' answer and is retried (the name's failure is remembered)."""
    import types

    import tessera._array as A

    reads = {"device": 0}

    class Device:
        def __init__(self, dev):
            reads["device"] += 1
            self.compute_capability = "90"
            self.attributes = {"MultiProcessorCount": 132 if dev == 0 else 114}

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=Device, runtime=types.SimpleNamespace(
            getDeviceProperties=lambda dev: {"name": b"NVIDIA H200"})))
    monkeypatch.setattr(A, "cupy_or_none", lambda: fake)
    monkeypatch.setattr(D, "_gpu_names", {})
    monkeypatch.setattr(D, "_device_archs", {})
    monkeypatch.setattr(D, "_device_sms", {})
    dev = {"id": 0}
    monkeypatch.setattr(D, "_current_device_id", lambda: dev["id"])
    assert (REAL_GPU_NAME(), D.device_arch(), D.device_sm_count()) == ("NVIDIA H200", 90, 132)
    assert D.device_arch() == 90 and D.device_sm_count() == 132 and reads["device"] == 2  # cached
    dev["id"] = 1
    assert D.device_sm_count() == 114
    dev["id"] = None
    assert (REAL_GPU_NAME(), D.device_arch(), D.device_sm_count()) == (None, None, 0)
    dev["id"] = 2
    monkeypatch.setattr(fake.cuda, "Device", lambda d: 1 / 0)
    assert D.device_arch() is None and D.device_sm_count() == 0 and 2 not in D._device_archs


def test_stream_id_asks_the_driver_and_says_none_when_it_cannot(monkeypatch):
    """stream_id passes the handle to cuStreamGetId and returns its id; a failing call or a
    driver without the function gives None (the caller then falls back to the address)."""
    import ctypes

    seen = []

    def get_id(handle, out):
        seen.append(handle.value)
        ctypes.cast(out, ctypes.POINTER(ctypes.c_ulonglong))[0] = 41 + (handle.value or 0)
        return 0

    monkeypatch.setattr(D, "_stream_get_id", lambda: get_id)
    assert D.stream_id(0x1234) == 41 + 0x1234 and seen == [0x1234]
    monkeypatch.setattr(D, "_stream_get_id", lambda: lambda handle, out: 400)  # an error code
    assert D.stream_id(0x1234) is None
    monkeypatch.setattr(D, "_stream_get_id", lambda: None)
    assert D.stream_id(0x1234) is None


def test_require_gpu_says_what_is_missing_in_its_own_words(monkeypatch):
    """Without CuPy, without a usable driver, without a GPU: one line naming what is missing,
    the package to install and what runs on the CPU -- never a bare CUDA error code."""
    import types

    from tessera import require_gpu
    from tessera.cuda import device as dev

    monkeypatch.setattr(dev._array, "cupy_or_none", lambda: None)
    with pytest.raises(RuntimeError, match=r"the demo needs CuPy and a CUDA GPU: pip install "
                                           r"'tessera-attention\[cuda13\]' \(or cuda12\); on the "
                                           r"CPU, .*tessera.reference.attention"):
        require_gpu("the demo")

    def no_driver():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=no_driver)))
    monkeypatch.setattr(dev._array, "cupy_or_none", lambda: fake)
    with pytest.raises(RuntimeError, match=r"the GPU path needs a CUDA GPU, and this machine has "
                                           r"no usable one \(RuntimeError: cudaErrorInsufficient"):
        require_gpu()
    fake.cuda.runtime.getDeviceCount = lambda: 0
    with pytest.raises(RuntimeError, match="CuPy sees none"):
        require_gpu()
    fake.cuda.runtime.getDeviceCount = lambda: 2
    assert require_gpu() == 2
