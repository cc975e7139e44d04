"""Tensor maps (tessera/cuda/tma.py) on a GPU: the real driver encodes a device operand."""



import numpy as np
import pytest

from tessera.cuda import tma


@pytest.mark.gpu
def test_driver_encodes_a_device_operand():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception:
        pytest.skip("needs a CUDA GPU and CuPy")
    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("tensor maps need sm_90 or newer")
    x = cp.zeros((1, 2, 300, 128), dtype=cp.float16)
    m = tma.tile_map(x.shape, tuple(s // 2 for s in x.strides), bf16=False, rows=128)
    blob = tma.encode(m, int(x.data.ptr))
    assert len(blob) == 128 and any(blob)
    assert np.frombuffer(blob, dtype=np.uint64).size == 16
