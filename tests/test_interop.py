"""CPU tests of tessera/interop.py: what it says of arrays it cannot run on, and the host-side
conversions the masks, the reference and the emulator use."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import interop


class _HostProducer:
    """A DLPack producer of host memory (as a CPU torch tensor or a JAX CPU array would be)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_frameworks_are_told_by_module():
    assert interop.framework_of(np.zeros(1)) == "dlpack"
    assert interop.framework_of(_HostProducer(np.zeros(1))) == "dlpack"


def test_device_descriptions_refuse_host_and_foreign_objects_by_name():
    with pytest.raises(ValueError, match=r"k is a host \(numpy\) array"):
        interop.from_any(np.zeros((2, 2), np.float16), "k")
    with pytest.raises(TypeError, match="v must be a CuPy array or a DLPack tensor, got list"):
        interop.from_any([1, 2], "v")
    with pytest.raises(ValueError, match=r"q must be on a CUDA device \(DLPack device type 1\)"):
        interop.from_any(_HostProducer(np.zeros((2, 2), np.float16)), "q")


def test_as_array_turns_host_tensors_and_sequences_into_numpy():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert interop.as_array(a, "x") is a
    got = interop.as_array(_HostProducer(a), "x")
    assert isinstance(got, np.ndarray) and np.array_equal(got, a)
    assert np.array_equal(interop.as_array([[1, 2], [3, 4]], "x"), [[1, 2], [3, 4]])


def test_row_major_strides():
    assert interop._row_major_strides((2, 3, 4)) == (12, 4, 1)
    assert interop._row_major_strides((5,)) == (1,)
    assert interop._row_major_strides(()) == ()


def test_a_capsule_describes_its_tensor_without_a_copy():
    """A DLPack capsule read through ctypes: pointer, shape, element strides and dtype as the
    producer holds them (here numpy's host memory, refused only for its device)."""
    a = np.zeros((3, 4), np.float16)[:, ::2]
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        interop._from_capsule(a, a.__dlpack__(), "dlpack", "q")
