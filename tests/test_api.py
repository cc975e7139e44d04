"""CPU: the request and launch bookkeeping (tessera.api, tessera.launch) that needs no GPU
(fakes stand in for CuPy)."""

from __future__ import annotations

import numpy as np

from tessera import api, capture, launch, operands, streams
from tessera.runtime.cache import PlanCache
from tests.test_streams import fake_streams


class _Stream:
    def __init__(self, ptr: int) -> None:
        self.ptr, self.waited = ptr, []

    def wait_event(self, event) -> None:
        self.waited.append(event)


class _Plan:
    def __init__(self, ready=None) -> None:
        self.launch_state = launch.LaunchState(ready=ready)


class _CuPy:
    """Just what the per-stream launch state uses: zeroed and empty arrays (and a memset, which
    it must not call), recorded, on a current device ``device``."""

    float32 = np.float32

    def __init__(self, device: int = 0) -> None:
        self.memsets, self.allocations, self.device = [], 0, device
        current = type("dev", (), {"id": device})()
        self.cuda = type("cuda", (), {"runtime": type("rt", (), {
            "memsetAsync": staticmethod(lambda p, v, n, s: self.memsets.append((p, v, n, s)))}),
            "Device": staticmethod(lambda: current)})

    def zeros(self, n, dtype):
        self.allocations += 1
        return _Array(1000 + self.allocations, n * np.dtype(dtype).itemsize)

    empty = zeros


class _Array:
    def __init__(self, ptr: int, nbytes: int) -> None:
        self.data, self.nbytes = type("mem", (), {"ptr": ptr})(), nbytes


def test_plan_is_waited_for_once_per_stream(monkeypatch):
    """Runs on other streams than the planner's wait for it once each, and hold the plan while
    they run (its buffers belong to the planner's stream's memory); a host-built plan has
    nothing to wait for."""
    fake = fake_streams(monkeypatch)
    p = _Plan(streams.StreamMark.here())  # planned on 0x5000
    ready = p.launch_state.ready.event.ptr
    a, b, own = _Stream(0x6001), _Stream(0x6002), _Stream(0x5000)
    for _ in range(3):
        launch._wait_until_planned(p, a)
    launch._wait_until_planned(p, b)
    launch._wait_until_planned(p, own)
    assert fake.waits == [(0x6001, ready), (0x6002, ready)]
    assert streams.held_count() == 4  # each run on a or b, none on the planner's stream
    host_built, c = _Plan(), _Stream(3)
    launch._wait_until_planned(host_built, c)
    assert len(fake.waits) == 2


def test_task_counter_one_per_stream_zeroed_once():
    """One zeroed counter per (plan, stream), and no memset per launch: the kernel leaves it
    zero (checked on the GPU by test_attention_gpu's persistent tests)."""
    cp, p = _CuPy(), _Plan()
    a, b = _Stream(11), _Stream(12)
    first = launch._task_counter(p, cp, a)
    again = launch._task_counter(p, cp, a)
    other = launch._task_counter(p, cp, b)
    assert first is again and other is not first and cp.allocations == 2
    assert first.nbytes == 4 and cp.memsets == []


def test_split_workspace_one_per_stream_and_device():
    """The split-KV partials are per (device, stream), like the task counter: two streams
    running one splitting plan at once would otherwise overwrite each other's partials; a plan
    without split tasks passes null pointers and allocates nothing."""
    import types

    p = _Plan()
    p.workspace_elements = (4 * 64 * 128, 4 * 64)  # four slots
    cp, a, b = _CuPy(), _Stream(21), _Stream(22)
    wa, wb = launch._workspace(p, cp, a), launch._workspace(p, cp, b)
    assert launch._workspace(p, cp, a) is wa and wb is not wa
    assert wa.part_o.nbytes == 4 * 64 * 128 * 4 and wa.part_lse.nbytes == 4 * 64 * 4
    other_gpu = launch._workspace(p, _CuPy(device=1), _Stream(21))
    assert other_gpu is not wa and cp.allocations == 4
    c0, c1 = launch._task_counter(p, cp, _Stream(0)), launch._task_counter(p, _CuPy(1), _Stream(0))
    assert c0 is not c1  # the legacy default stream is 0 on every device
    unsplit = types.SimpleNamespace(workspace_elements=(0, 0),
                                    launch_state=launch.LaunchState())
    w = launch._workspace(unsplit, cp, a)
    assert int(w.part_o) == int(w.part_lse) == 0 and not unsplit.launch_state.workspaces


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
        launch.run_plan(None, None, None, None, scale=-1)
    for good in (None, 0.125, np.float32(0.1), 1):
        operands.check_scale(good)


def test_requests_of_one_geometry_replan_a_kept_plan(monkeypatch):
    """tessera.attention's plans (api._request_plan, api.request_plans; planner kernels replaced
    by their numpy stand-ins, the mask taken for a device one): a later request of the same geometry, shapes
    and stream replans the kept plan, which then equals a new plan of its mask; another stream,
    geometry or regime takes a plan of its own, and so does a request of the same key while
    one is in flight (another thread's); a stream being captured into a CUDA graph (which
    takes a sync-free plan, and refuses a given regime that may split), a plan that may split
    tasks, or a regime that read the selection is never kept; the least recently used plan
    goes beyond request_plans_kept."""
    import pytest
    from tests.runtime.runtime_helpers import PLANNER_STAND_INS, assert_same_plan

    import tessera
    from tessera import BlockMask, Regime
    from tessera.cuda import loader
    from tessera.interop import DeviceTensor
    from tessera.runtime import mapping

    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    monkeypatch.setattr(BlockMask, "on_device", property(lambda self: True))
    monkeypatch.setattr(tessera.cuda.device, "device_cc", lambda: 90)
    capturing = set()
    monkeypatch.setattr(api, "request_plans", PlanCache())
    rng = np.random.default_rng(8)

    def ops(stream: int, hq: int = 4, lq: int = 640) -> operands.Operands:
        t = DeviceTensor(256, (1, hq, lq, 64), (hq * lq * 64, lq * 64, 64, 1), "bfloat16", 0,
                         "cupy", None)
        kv = DeviceTensor(256, (1, 2, lq, 64), t.strides, "bfloat16", 0, "cupy", None)
        return operands.Operands(t, kv, kv, t.shape, kv.shape, t.strides, kv.strides, kv.strides,
                             stream)

    def mask(p: float, n: int = 10) -> BlockMask:
        return BlockMask.from_dense(rng.random((2, n, n)) < p, block_size=64)

    def request(m: BlockMask, stream: int, regime: Regime, lq: int = 640):
        with api._request_plan(m, ops(stream, lq=lq), "bhld", regime,
                               stream in capturing) as p:
            return p

    never_splits = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                          combine_threshold=0.0, split_ratio=1e9)
    first = request(mask(0.3), 7, never_splits)
    for p in (0.6, 0.1):
        m = mask(p)
        again = request(m, 7, never_splits)
        assert again is first and again.mask is m
        assert_same_plan(again, tessera.plan(m, num_q_heads=4, num_kv_heads=2, head_dim=64,
                                             batch=1, regime=never_splits))
    with api._request_plan(mask(0.3), ops(7), "bhld", never_splits, False) as in_flight:
        assert in_flight is first and not len(api.request_plans)  # taken out while in use
        assert request(mask(0.3), 7, never_splits) is not first  # a concurrent request's own
    kept = api.request_plans.plans()
    assert len(kept) == 1 and kept[0] is first  # the last request to finish keeps its plan
    assert request(mask(0.3), 8, never_splits) is not first
    assert request(mask(0.3, n=9), 7, never_splits, lq=576) is not first
    packed = never_splits.with_(pack_keys=True)
    assert request(mask(0.3), 7, packed) is not first
    assert len(api.request_plans) == 4
    capturing.add(7)
    captured = request(mask(0.3), 7, never_splits)
    assert captured is not first and captured.sync_free  # a sync-free plan of its own
    with pytest.raises(ValueError, match="regime .* may split tasks"):  # given: not changed
        request(mask(0.3), 7, never_splits.with_(split_ratio=2.0))
    capturing.clear()
    # A selected regime is made never to split (40 tasks against unknown slots may split).
    selected = request(mask(0.3), 12, None)
    assert selected.sync_free and selected.regime.split_ratio >= 1e6
    api.request_plans.take(next(k for k in api.request_plans.keys() if k.stream == 12))
    assert len(api.request_plans) == 4
    splits = never_splits.with_(split_ratio=2.0)  # 40 tasks against unknown slots: may split
    assert not request(mask(0.3), 7, splits).replannable and len(api.request_plans) == 4
    real_plan = api.plan

    def read_the_selection(*args, **kwargs):
        new = real_plan(*args, **kwargs)
        new.regime_by_geometry = False  # as when a table lookup measured the mask
        return new

    monkeypatch.setattr(api, "plan", read_the_selection)
    assert request(mask(0.3), 9, never_splits).replannable
    assert len(api.request_plans) == 4  # read the selection: not kept
    monkeypatch.setattr(api, "plan", real_plan)
    monkeypatch.setattr(tessera.config, "request_plans_kept", 2)
    request(mask(0.3), 10, never_splits)
    assert len(api.request_plans) == 2
    assert request(mask(0.3), 7, never_splits) is not first  # evicted
    assert api.kept_plans() == 2
    monkeypatch.setattr(tessera.config, "request_plans_kept", 0)  # keeping turned off:
    request(mask(0.3), 7, never_splits)  # the next request lets the kept plans go
    assert api.kept_plans() == 0 and not len(api.request_plans)
    with pytest.raises(ValueError):  # the replan's own check, should a key ever collide
        first.replan(mask(0.3, n=9))


def test_requests_read_a_mask_reading_selection_every_refresh(monkeypatch):
    """A geometry whose regime selection reads the mask (ragged blocks: align_pays, pack_pays)
    reads it on the first request and then on every request_selection_refresh-th one; the
    requests between take the last answer without reading, and replan the plan kept for that
    regime; an answer that changes takes a plan of its own (made without reading again), and
    the plan kept for the earlier answer serves it again when it comes back."""
    from tests.runtime.runtime_helpers import PLANNER_STAND_INS, assert_same_plan

    import tessera
    from tessera import BlockMask, Regime
    from tessera.cuda import loader
    from tessera.interop import DeviceTensor
    from tessera.runtime import mapping
    from tessera.runtime.regime import choice as choice_module

    monkeypatch.setattr(loader, "load_kernel", lambda v: PLANNER_STAND_INS[v.kernel])
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    monkeypatch.setattr(BlockMask, "on_device", property(lambda self: True))
    monkeypatch.setattr(tessera.cuda.device, "device_cc", lambda: 90)
    monkeypatch.setattr(api, "request_plans", PlanCache())
    monkeypatch.setattr(tessera.config, "request_selection_refresh", 4)
    plain = Regime(family="sm90", block_m=128, num_warps=12, block_n=128, stages=3,
                   combine_threshold=0.0, split_ratio=1e9)
    packed = plain.with_(pack_keys=True)
    answer = {"now": packed, "last": None}
    reads = []

    def selected(mask, *, read_mask=True, **_):  # a selection that reads the mask
        if read_mask:
            reads.append(mask)
            answer["last"] = answer["now"]
        return answer["last"] or plain, False

    monkeypatch.setattr(api, "selected_regime", selected)
    monkeypatch.setattr(choice_module, "selected_regime", selected)
    rng = np.random.default_rng(3)
    t = DeviceTensor(256, (1, 4, 640, 64), (4 * 640 * 64, 640 * 64, 64, 1), "bfloat16", 0,
                     "cupy", None)
    kv = DeviceTensor(256, (1, 2, 640, 64), t.strides, "bfloat16", 0, "cupy", None)
    ops = operands.Operands(t, kv, kv, t.shape, kv.shape, t.strides, kv.strides, kv.strides, 7)
    bounds = np.r_[0, np.cumsum(rng.integers(32, 96, size=9)), 640]

    def request(m: BlockMask):
        with api._request_plan(m, ops, "bhld", None, False) as p:
            return p

    def mask() -> BlockMask:
        return BlockMask.from_dense(rng.random((2, 10, 10)) < 0.3, q_bounds=bounds,
                                    kv_bounds=bounds)

    first = request(mask())
    assert len(reads) == 1 and first.regime == packed and first.replannable
    for i in range(3):  # the next three take the last answer: no read, the kept plan
        m = mask()
        assert request(m) is first and len(reads) == 1
        assert_same_plan(first, tessera.plan(m, num_q_heads=4, num_kv_heads=2, head_dim=64,
                                             batch=1, regime=packed))
    answer["now"] = plain  # the fourth reads, and its answer changed
    other = request(mask())
    assert len(reads) == 2 and other is not first and other.regime == plain
    assert request(mask()) is other and len(reads) == 2
    assert len(api.request_plans) == 2  # one per answer
    request(mask()), request(mask())
    answer["now"] = packed
    assert request(mask()) is first and len(reads) == 3  # read again: the packed plan back
    monkeypatch.setattr(tessera.config, "request_selection_refresh", 1)
    request(mask()), request(mask())
    assert len(reads) == 5  # 1: every request reads


def test_kernel_arguments_made_once_per_plan_and_scale():
    """The plan's own kernel arguments are made once per (plan, scale) -- a new scale makes new
    ones, as the kernels fold it into the exponent -- and int64 argument tuples once per
    values."""
    import types

    queue = types.SimpleNamespace(tile_rows=64, num_tasks=12, count=None)
    shape = launch.AttentionShape(1, 8, 2, 64, "bfloat16", "bhld")
    p = types.SimpleNamespace(launch_queue=queue, shape=shape, launch_state=launch.LaunchState())
    a = launch._plan_args(p, 0.125)
    assert launch._plan_args(p, 0.125) is a
    assert [type(x) for x in a] == [np.int32, np.int32, np.float32, np.int32, np.uint64]
    assert (int(a[0]), int(a[1]), int(a[3]), int(a[4])) == (64, 4, 12, 0)
    assert float(a[2]) == np.float32(0.125 * launch._LOG2E)
    b = launch._plan_args(p, 0.25)
    assert b is not a and float(b[2]) == np.float32(0.25 * launch._LOG2E)
    s = launch._int64s((3, 5, 7))
    assert launch._int64s((3, 5, 7)) is s and [int(x) for x in s] == [3, 5, 7]
    assert all(type(x) is np.int64 for x in s)


def test_a_plans_kernel_is_resolved_once_per_device_and_form(monkeypatch):
    """launch._kernel loads a plan's kernel once per (device, head dim, dtype, TMA form), with
    its shared memory and persistent grid, and refuses a variant the device's shared memory
    cannot hold before loading anything; the TMA maps' box rows are asked of the regime once."""
    import types

    import pytest

    from tessera.runtime.regime import Regime

    loads = []
    monkeypatch.setattr(launch, "load_kernel", lambda v: loads.append(v) or ("fn", v))
    monkeypatch.setattr(launch, "_resident_ctas", lambda v, dev: 132 * v.min_blocks)
    monkeypatch.setattr(launch, "smem_limit_bytes", lambda cc: 232448)
    reg = Regime(family="sm90", block_m=192, num_warps=16, block_n=128, stages=3,
                 combine_threshold=0.0)
    p = types.SimpleNamespace(regime=reg, launch_state=launch.LaunchState())
    k = launch._kernel(p, 64, True, True, 90, 0)
    assert launch._kernel(p, 64, True, True, 90, 0) is k and len(loads) == 1
    assert k.fwd == reg.variant(64, True, tma=True) and k.fn == ("fn", k.fwd)
    assert k.resident == 132 and k.smem == launch.smem_bytes(k.fwd)
    plain = launch._kernel(p, 64, True, False, 90, 0)  # the cp.async form: 64-key steps
    assert plain.fwd.macro("BN") == 64 and len(loads) == 2
    launch._kernel(p, 64, True, True, 90, 1)  # another device loads its own
    assert len(loads) == 3
    assert launch._tma_box_rows(p, 64, True) == 128 == launch._tma_box_rows(p, 64, True)
    monkeypatch.setattr(launch, "smem_limit_bytes", lambda cc: 48 * 1024)
    with pytest.raises(ValueError, match="bytes of shared memory at head dim 64"):
        launch._kernel(types.SimpleNamespace(regime=reg, launch_state=launch.LaunchState()),
                       64, True, True, 90, 0)
    assert len(loads) == 3


def test_capture_memory_and_device_copies():
    """While a request is captured (capture.capture_memory), a constant array not yet on the
    device is refused with the warm-up advice -- copying it then would be a host-to-device copy
    inside the graph, living in the graph's memory -- and one made before is reused; nested
    captures keep the outer allocator, and leaving the outermost ends the capture."""
    import types

    import pytest

    from tessera import _array

    if _array.cupy_or_none() is None:
        pytest.skip("needs CuPy (the allocator hook)")
    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        id=0)))
    made = []
    key = ("capture-test", id(made))
    with capture.capture_memory("cupy", 0):
        assert capture.capturing()
        with pytest.raises(RuntimeError, match="warm-up"):
            capture.device_copy(key, lambda: made.append(1) or "copy", xp)
        with capture.capture_memory("torch", 0):  # nested: still the outer capture
            assert capture.capturing()
        assert capture.capturing() and not made
    assert not capture.capturing()
    assert capture.device_copy(key, lambda: made.append(1) or "copy", xp) == "copy"
    with capture.capture_memory("cupy", 0):
        assert capture.device_copy(key, lambda: made.append(1) or "other", xp) == "copy"
    assert made == [1]
    # What release_captured_memory gives back: the sizes of the allocations captures kept.
    kept = [types.SimpleNamespace(mem=types.SimpleNamespace(size=n)) for n in (512, 1536)]
    capture._captured_memory.extend(kept)
    assert capture.release_captured_memory() == 2048 and not capture._captured_memory
    assert capture.release_captured_memory() == 0


def test_constants_a_capture_reads_outlive_the_cache():
    """A constant array a captured graph reads by address stays alive when the cache of device
    copies is emptied (past 128 geometries) until release_captured_memory -- a replay read
    freed memory before."""
    import gc
    import types
    import weakref

    import pytest

    from tessera import _array

    if _array.cupy_or_none() is None:
        pytest.skip("needs CuPy (the allocator hook)")

    class Constant:
        pass

    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        id=0)))
    key = ("pinned-test", id(Constant))
    made = capture.device_copy(key, Constant, xp)  # the warm-up makes it
    alive = weakref.ref(made)
    with capture.capture_memory("cupy", 0):
        assert capture.device_copy(key, Constant, xp) is made  # the capture reads it
    del made
    for i in range(140):  # other geometries empty the cache
        capture.device_copy(("other", i), Constant, xp)
    gc.collect()
    assert alive() is not None, "a captured graph's constant was freed"
    capture.release_captured_memory()
    gc.collect()
    assert alive() is None


def test_per_thread_default_streams_and_capture_streams_are_per_thread(monkeypatch):
    """cudaStreamPerThread has one address (2) for every thread's own stream: a plan's task
    counter, partials and planned-event wait are per thread there (two threads' runs would
    share them otherwise), and each thread replans into graphs on a capture stream of its own;
    the legacy default stream (0), shared by all threads, keeps one state."""
    import threading
    import types

    from tessera.runtime import device_planner

    fake = fake_streams(monkeypatch)
    p = _Plan(streams.StreamMark.here())
    p.workspace_elements = (64 * 64, 64)
    per_thread, legacy = _Stream(2), _Stream(0)
    made = {}
    capture_streams = []
    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(id=0),
        Stream=lambda non_blocking: capture_streams.append(object()) or capture_streams[-1]))

    both = threading.Barrier(2)  # the two threads alive together (idents are reused)

    def work(name):
        both.wait()
        cp = _CuPy()
        made[name] = (launch._task_counter(p, cp, per_thread),
                      launch._workspace(p, cp, per_thread),
                      launch._task_counter(p, cp, legacy),
                      device_planner._capture_stream(xp), device_planner._capture_stream(xp))
        launch._wait_until_planned(p, per_thread)
        both.wait()

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a, b = made["a"], made["b"]
    assert a[0] is not b[0] and a[1] is not b[1]  # per-thread stream: state per thread
    assert a[2] is b[2]  # legacy default stream: one state
    assert a[3] is a[4] and a[3] is not b[3]  # one capture stream per thread
    ready = p.launch_state.ready.event.ptr
    assert fake.waits == [(2, ready), (2, ready)]  # each thread's stream waited once


def test_one_graphs_captured_memory_released_alone():
    """tessera.CapturedMemory: the memory and constant holds of the captures inside it, given
    back alone while another graph's stay; release_captured_memory still gives back all."""
    import types
    import weakref

    import pytest

    from tessera import _array

    if _array.cupy_or_none() is None:
        pytest.skip("needs CuPy (the allocator hook)")

    def ptr(n):
        return types.SimpleNamespace(mem=types.SimpleNamespace(size=n))

    class Constant:
        pass

    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        id=0)))
    shared = capture.device_copy(("scope-test", id(Constant)), Constant, xp)
    alive = weakref.ref(shared)
    capture.release_captured_memory()
    a, b = capture.CapturedMemory(), capture.CapturedMemory()
    for scope, sizes in ((a, (100, 200)), (b, (1000,))):
        with scope, capture.capture_memory("cupy", 0):
            for n in sizes:  # what the allocator hook records for each allocation
                p = ptr(n)
                with capture._captured_lock:
                    capture._captured_memory.append(p)
                    scope._memory.append(p)
            capture.device_copy(("scope-test", id(Constant)), Constant, xp)  # both hold it
    del shared
    capture._DEVICE_COPIES.clear()
    assert a.nbytes == 300 and b.nbytes == 1000
    assert a.release() == 300 and a.nbytes == 0
    assert alive() is not None  # b's graph still reads it
    assert sum(int(p.mem.size) for p in capture._captured_memory) == 1000
    assert b.release() == 1000 and alive() is None
    assert capture.release_captured_memory() == 0
