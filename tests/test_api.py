"""CPU: the launch bookkeeping of tessera.api that needs no GPU (fakes stand in for CuPy)."""

from __future__ import annotations

import numpy as np

from tessera import api


class _Stream:
    def __init__(self, ptr: int) -> None:
        self.ptr, self.waited = ptr, []

    def wait_event(self, event) -> None:
        self.waited.append(event)


class _Plan:
    def __init__(self, ready=None) -> None:
        self._cache = {} if ready is None else {"ready": ready}


class _CuPy:
    """Just what _task_counter uses: zeroed arrays (and a memset, which it must not call),
    recorded."""

    def __init__(self) -> None:
        self.memsets, self.allocations = [], 0
        self.cuda = type("cuda", (), {"runtime": type("rt", (), {
            "memsetAsync": staticmethod(lambda p, v, n, s: self.memsets.append((p, v, n, s)))})})

    def zeros(self, n, dtype):
        self.allocations += 1
        return _Array(1000 + self.allocations, n * np.dtype(dtype).itemsize)


class _Array:
    def __init__(self, ptr: int, nbytes: int) -> None:
        self.data, self.nbytes = type("mem", (), {"ptr": ptr})(), nbytes


def test_plan_is_waited_for_once_per_stream():
    ready = object()
    p, a, b = _Plan(ready), _Stream(1), _Stream(2)
    for _ in range(3):
        api._wait_until_planned(p, a)
    api._wait_until_planned(p, b)
    assert a.waited == [ready] and b.waited == [ready]
    host_built, c = _Plan(), _Stream(3)
    api._wait_until_planned(host_built, c)
    assert c.waited == []


def test_task_counter_one_per_stream_zeroed_once():
    """One zeroed counter per (plan, stream), and no memset per launch: the kernel leaves it
    zero (checked on the GPU by test_attention_gpu's persistent tests)."""
    cp, p = _CuPy(), _Plan()
    a, b = _Stream(11), _Stream(12)
    first = api._task_counter(p, cp, a)
    again = api._task_counter(p, cp, a)
    other = api._task_counter(p, cp, b)
    assert first is again and other is not first and cp.allocations == 2
    assert first.nbytes == 4 and cp.memsets == []


class _TorchLike:
    """What interop reads of a PyTorch tensor (its module says "torch"), without PyTorch."""

    __module__ = "torch"

    def __init__(self, device: str, dtype: str = "torch.bfloat16") -> None:
        kind, _, index = device.partition(":")
        self.device = type("device", (), {"type": kind, "index": int(index or 0)})()
        self.dtype, self.shape = dtype, (2, 3, 64, 128)
        self.is_cuda = kind == "cuda"

    def data_ptr(self) -> int:
        return 4096

    def stride(self) -> tuple[int, ...]:
        return (3 * 64 * 128, 128, 3 * 128, 1)  # a "blhd" tensor viewed as bhld


def test_torch_tensors_described_from_their_own_attributes():
    """A CUDA torch tensor is described from data_ptr/shape/stride (no __dlpack__, whose event
    wait breaks CUDA-graph capture); a host tensor or an unsupported dtype is refused by name."""
    import pytest

    from tessera.interop import device_of, framework_of, from_any

    t = _TorchLike("cuda:1")
    assert framework_of(t) == "torch" and device_of(t) == 1
    d = from_any(t, "q")
    assert (d.ptr, d.shape, d.strides, d.dtype, d.device_id, d.framework) == (
        4096, (2, 3, 64, 128), (3 * 64 * 128, 128, 3 * 128, 1), "bfloat16", 1, "torch")
    assert d.owner is t  # kept alive while the pointer is in use
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        from_any(_TorchLike("cpu"), "q")
    with pytest.raises(TypeError, match="k: unsupported dtype"):
        from_any(_TorchLike("cuda:0", "torch.complex64"), "k")


def test_scale_checked_before_anything_else():
    """A zero, negative, NaN or infinite scale (which the kernels' -inf masking would turn into
    NaN or zero rows) or a non-number is refused by name, before the arrays are looked at."""
    import pytest

    import tessera

    m = tessera.BlockMask.from_dense(np.ones((1, 2, 2), bool), block_size=64, seq_len_q=128,
                                     seq_len_kv=128)
    for bad in (0.0, -0.125, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be positive and finite"):
            tessera.attention(None, None, None, m, scale=bad)
    with pytest.raises(TypeError, match="scale must be a number or None, got str"):
        tessera.attention(None, None, None, m, scale="0.1")
    with pytest.raises(ValueError, match="scale must be positive"):
        api.run_plan(None, None, None, None, scale=-1)
    for good in (None, 0.125, np.float32(0.1), 1):
        api._check_scale(good)
