"""The front door: ``tessera.attention`` (plan and run, a new mask every call) and ``run_plan``
(the GPU execution behind ``Plan.run``).

Every check on the inputs happens here, before anything is launched, and raises a ValueError or
TypeError that names the argument.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._array import (capture_memory_if, capturing, cupy_external_stream, cupy_or_none,
                     stream_capturing)
from .cuda import loader, tma
from .interop import (DeviceTensor, current_stream_ptr, device_of, empty_like_caller,
                      framework_of, from_any)
from .mask import BlockMask
from .runtime import regime as regimes
from .runtime.plan import SUPPORTED_DTYPES, Plan, plan

__all__ = ["attention", "run_plan", "SUPPORTED_HEAD_DIMS"]

SUPPORTED_HEAD_DIMS = (64, 96, 128)
# Testing hook: fill every output with NaN before the kernels run, so a test can prove that each
# element was written. Off in normal use (it costs a memset per call).
poison_outputs = False
# Most CTAs a persistent kernel is launched with (None: as many as the GPU holds at once; 0: one
# per task, i.e. not persistent). Tests set it low so that a small mask's tasks queue up behind
# few CTAs, each running several; benchmarks set 0 to measure what persistence buys.
persistent_grid_cap: int | None = None
_LOG2E = 1.4426950408889634


@dataclass
class _Operands:
    q: DeviceTensor
    k: DeviceTensor
    v: DeviceTensor
    shape_q: tuple[int, int, int, int]  # B, Hq, Lq, D (whatever the layout)
    shape_kv: tuple[int, int, int, int]  # B, Hkv, Lkv, D
    strides_q: tuple[int, int, int, int]  # element strides of b, h, l, d
    strides_k: tuple[int, int, int, int]
    strides_v: tuple[int, int, int, int]
    stream_ptr: int  # the caller's current stream (0: the legacy default stream)


def _bhld(t: DeviceTensor, layout: str, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if len(t.shape) != 4:
        raise ValueError(f"{name} must be 4-D ({layout}), got shape {t.shape}")
    if layout == "bhld":
        return t.shape, t.strides
    perm = (0, 2, 1, 3)
    return tuple(t.shape[i] for i in perm), tuple(t.strides[i] for i in perm)


def _describe(q: Any, k: Any, v: Any, layout: str) -> _Operands:
    """Describe and validate q, k, v (device, dtype, shapes, strides) without touching data."""
    if layout not in ("bhld", "blhd"):
        raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
    if cupy_or_none() is None:
        raise RuntimeError("the GPU path needs CuPy: pip install 'tessera[cuda13]' (or cuda12)")
    # The caller's stream first: a DLPack producer orders its pending work before it.
    fw = framework_of(q)
    on_host = fw == "torch" and not getattr(q, "is_cuda", True)  # from_any says so below
    stream = 0 if on_host else current_stream_ptr(fw, device_of(q))
    qd = from_any(q, "q", stream)
    kd = from_any(k, "k", stream)
    vd = from_any(v, "v", stream)
    for name, t in (("q", qd), ("k", kd), ("v", vd)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
        if t.device_id != qd.device_id:
            raise ValueError(f"{name} is on device {t.device_id} but q is on {qd.device_id}")
    if not qd.dtype == kd.dtype == vd.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {qd.dtype}, {kd.dtype}, {vd.dtype}")
    sq, tq = _bhld(qd, layout, "q")
    sk, tk = _bhld(kd, layout, "k")
    sv, tv = _bhld(vd, layout, "v")
    b, hq, lq, d = sq
    if sk[0] != b or sv[0] != b:
        raise ValueError(f"batch of k {sk[0]} / v {sv[0]} must equal batch of q {b}")
    if sk[:3] != sv[:3]:
        raise ValueError(f"k {sk} and v {sv} must agree in batch, heads and length")
    if sk[3] != d or sv[3] != d:
        raise ValueError(f"head dims must agree: q {d}, k {sk[3]}, v {sv[3]}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {d} is not supported (supported: {SUPPORTED_HEAD_DIMS})")
    if sk[1] == 0 or hq % sk[1]:
        raise ValueError(f"q heads {hq} must be a multiple of k/v heads {sk[1]}")
    for name, t, st in (("q", qd, tq), ("k", kd, tk), ("v", vd, tv)):
        if st[3] != 1:
            raise ValueError(f"{name} must be contiguous in the head dim (stride 1), got {st[3]}")
        if any(s % 8 for s in st[:3]) or t.ptr % 16:
            raise ValueError(f"{name} strides {st} (elements) and address must be 16-byte "
                             "aligned (multiples of 8 elements)")
        if min(st[:3]) < 0:
            raise ValueError(f"{name} has negative strides {st}")
    return _Operands(qd, kd, vd, sq, sk, tq, tk, tv, stream)


def attention(q: Any, k: Any, v: Any, block_mask: BlockMask, *, scale: float | None = None,
              return_lse: bool = False, layout: str = "bhld", regime: Any = None):
    """Block-sparse attention of ``q`` over ``k``/``v`` exactly on ``block_mask``.

    ``q`` is ``[B, Hq, Lq, D]`` (``layout="bhld"``) or ``[B, Lq, Hq, D]`` (``"blhd"``), k/v the
    same with Hkv heads (Hq a multiple of Hkv) and Lkv tokens; CuPy arrays or any CUDA DLPack
    tensor (PyTorch, JAX), bf16 or fp16, D in 64/96/128. Plans (on the device when the mask is
    there) and runs in one call; returns the output in the caller's type and layout, plus the
    natural-log LSE ``[B, Hq, Lq]`` (float32) with ``return_lse``. A later request of the same
    mask geometry, shapes and stream replans a kept plan (:data:`request_plans_kept`). Unless
    ``regime`` is given, a request never splits heavy tasks (``plan(split_tasks=False)``: the
    split costs milliseconds of host planning, more than it saves), so a device mask is planned
    without waiting for the GPU. Inside a CUDA-graph capture the whole request is captured
    (after one warm-up request outside it; ``plan(sync_free=True)``).
    """
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a tessera.BlockMask, got {type(block_mask).__name__}")
    _check_scale(scale)
    ops = _describe(q, k, v, layout)
    b, hq, lq, d = ops.shape_q
    _, hkv, lkv, _ = ops.shape_kv
    _check_mask(block_mask, b, hq, hkv, lq, lkv)
    if block_mask.on_device and block_mask.device_id != ops.q.device_id:
        raise ValueError(f"block_mask is on device {block_mask.device_id} but q is on "
                         f"{ops.q.device_id}")
    # Plan on q's device and the caller's stream: the device planner's arrays must be ready
    # before the kernels read them, and a framework's side stream does not wait for CuPy's
    # default one.
    with cupy_or_none().cuda.Device(ops.q.device_id):
        capturing = stream_capturing(ops.stream_ptr)
        if capturing and not block_mask.on_device:
            raise ValueError("block_mask must be on the GPU while the stream is being captured "
                             "into a CUDA graph (a host mask's plan is copied to the GPU, "
                             "which a graph cannot capture): build it from a device tensor")
        with _caller_stream(ops), \
                capture_memory_if(capturing, ops.q.framework, ops.q.device_id), \
                _request_plan(block_mask, ops, layout, regime, capturing) as p:
            return _launch_here(p, ops, scale, return_lse, None)  # (q's device is current)


# Plans tessera.attention keeps for the next request of the same geometry, shapes and stream
# (least recently used first); 0 plans every request anew.
request_plans_kept = 8
_request_plans: OrderedDict[tuple, Plan] = OrderedDict()
_request_lock = threading.Lock()


@contextlib.contextmanager
def _request_plan(mask: BlockMask, ops: _Operands, layout: str, regime: Any, capturing: bool):
    """The plan of a request, for the duration of its launch: a kept plan of the same geometry
    replanned for ``mask`` (Plan.replan: the planner's kernels and nothing else -- no
    allocation, no regime selection), else a new one, kept afterwards when a later mask of its
    geometry can reuse it.

    Reuse is safe because a kept plan serves one request at a time, on one stream: a request's
    replan is enqueued after the previous request's kernels, which were the last to read its
    buffers, and a plan is taken out of the kept ones while its request plans and launches (a
    concurrent request of the same key, from another thread, makes a plan of its own). A
    request ``capturing`` into a CUDA graph takes a new sync-free plan (plan(sync_free=True)),
    so that the graph never shares buffers with later requests."""
    b, hq, lq, d = ops.shape_q
    hkv = ops.shape_kv[1]
    key = kept = None
    if request_plans_kept and mask.on_device and not capturing:
        # Everything a new plan would read besides the selection (the regime selection's
        # inputs: the device, its table, the shapes, the geometry).
        key = (ops.q.device_id, ops.stream_ptr, regime, regimes.selection_generation(),
               os.environ.get(regimes.ENV_TABLE), b, hq, hkv, d, ops.q.dtype, layout,
               mask.batch_heads, mask.q_bounds.tobytes(), mask.kv_bounds.tobytes())
        with _request_lock:
            kept = _request_plans.pop(key, None)
    if kept is not None:
        p = kept.replan(mask)
    else:
        p = plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, batch=b,
                 dtype=ops.q.dtype, layout=layout, regime=regime, arch=_device_cc(),
                 sync_free=capturing, split_tasks=False)
        if not (p.replannable and p.regime_by_geometry):
            key = None
    try:
        yield p
    finally:
        if key is not None:
            with _request_lock:
                _request_plans[key] = p
                _request_plans.move_to_end(key)
                while len(_request_plans) > request_plans_kept:
                    _request_plans.popitem(last=False)


def _caller_stream(ops: _Operands):
    """The caller's current stream as a CuPy stream (usable as a context manager); the wrapper
    of a (device, stream) is made once (it owns nothing: a stream made later at the same
    address is the same stream to it)."""
    cp = cupy_or_none()
    ptr = ops.stream_ptr
    if not ptr:
        return cp.cuda.Stream.null
    key = (ops.q.device_id, ptr)
    stream = _streams.get(key)
    if stream is None:
        if len(_streams) > 256:
            _streams.clear()
        stream = _streams[key] = cupy_external_stream(ptr, ops.q.device_id)
    return stream


_streams: dict[tuple[int, int], Any] = {}


def _device_cc() -> int:
    return loader.device_cc()


def _check_scale(scale: Any) -> None:
    """``scale`` must be None (1/sqrt(D)) or a positive finite number: the kernels mask a score
    as -inf before scaling it inside exp2, which a zero, negative or NaN scale would turn into
    NaN or into rows of zeros."""
    if scale is None:
        return
    try:
        if isinstance(scale, (str, bytes)):  # float() would parse them
            raise TypeError
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale must be a number or None, got {type(scale).__name__}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"scale must be positive and finite, got {value}")


def _check_mask(mask: BlockMask, b: int, hq: int, hkv: int, lq: int, lkv: int) -> None:
    if (mask.seq_len_q, mask.seq_len_kv) != (lq, lkv):
        raise ValueError(f"block_mask covers ({mask.seq_len_q}, {mask.seq_len_kv}) tokens but "
                         f"q/k have ({lq}, {lkv})")
    mask.head_index(hq, hkv)  # raises ValueError when the mask's heads fit neither
    mask.batch_index(b)


def run_plan(p: Plan, q: Any, k: Any, v: Any, *, scale: float | None = None,
             return_lse: bool = False, out: Any = None, lse: Any = None):
    """Run a plan on the GPU (``Plan.run``); q/k/v must match the shapes it was planned for.

    ``out`` (same dtype and layout as q, last dim contiguous) and ``lse`` (float32
    ``[B, Hq, Lq]``, contiguous) are written in place when given, so a run allocates nothing
    after the plan's first run on the stream; they are returned as given. A run may be
    captured into a CUDA graph (what it allocates then is the graph's); a host-planned plan
    must have run on the GPU once before.
    """
    _check_scale(scale)
    ops = _describe(q, k, v, p.layout)
    b, hq, lq, d = ops.shape_q
    _, hkv, lkv, _ = ops.shape_kv
    if (b, hq, hkv, d) != (p.batch, p.num_q_heads, p.num_kv_heads, p.head_dim):
        raise ValueError(f"q/k shapes (B={b}, Hq={hq}, Hkv={hkv}, D={d}) differ from the plan's "
                         f"(B={p.batch}, Hq={p.num_q_heads}, Hkv={p.num_kv_heads}, "
                         f"D={p.head_dim})")
    if ops.q.dtype != p.dtype:
        raise TypeError(f"q dtype {ops.q.dtype} differs from the plan's {p.dtype}")
    _check_mask(p.mask, b, hq, hkv, lq, lkv)
    if p.mask.on_device and p.mask.device_id != ops.q.device_id:
        raise ValueError(f"the plan lives on device {p.mask.device_id} but q is on "
                         f"{ops.q.device_id}")
    given = _given_outputs(ops, p.layout, out, lse)
    # A run captured into a CUDA graph allocates (a task counter for a new stream, outputs
    # not given) from memory the graph keeps, as a captured request does.
    with capture_memory_if(stream_capturing(ops.stream_ptr), ops.q.framework, ops.q.device_id):
        return _launch(p, ops, scale, return_lse or lse is not None, given)


def _given_outputs(ops: _Operands, layout: str, out: Any, lse: Any) -> dict:
    """Validate caller-provided outputs; {} when none."""
    given = {}
    b, hq, lq, d = ops.shape_q
    if out is not None:
        od = from_any(out, "out", ops.stream_ptr)
        want = (b, hq, lq, d) if layout == "bhld" else (b, lq, hq, d)
        if od.shape != want:
            raise ValueError(f"out must have shape {want} ({layout}), got {od.shape}")
        if od.dtype != ops.q.dtype:
            raise TypeError(f"out must be {ops.q.dtype} like q, got {od.dtype}")
        if od.strides[3] != 1 or any(s_ % 2 for s_ in od.strides[:3]) or od.ptr % 4:
            raise ValueError(f"out must be contiguous in the head dim with even strides, got "
                             f"strides {od.strides}")
        if od.device_id != ops.q.device_id:
            raise ValueError(f"out is on device {od.device_id} but q is on {ops.q.device_id}")
        given["out"] = (od, out)
    if lse is not None:
        ld = from_any(lse, "lse", ops.stream_ptr)
        if ld.shape != (b, hq, lq) or ld.dtype != "float32" or ld.strides != (hq * lq, lq, 1):
            raise ValueError(f"lse must be a contiguous float32 array of shape {(b, hq, lq)}, "
                             f"got {ld.dtype} {ld.shape} strides {ld.strides}")
        given["lse"] = (ld, lse)
    return given


def _device_queue(p: Plan, cp) -> dict:
    """The plan's launch queue and workspace on the current device (copied/allocated once per
    plan and device: a host-built plan may run on several GPUs)."""
    c = p._cache.setdefault(("queue", cp.cuda.Device().id), {})
    if "tasks" not in c:
        if capturing() and not p.mask.on_device:  # a host-to-device copy cannot be captured
            raise RuntimeError("a CUDA graph is being captured and this host-planned plan has "
                               "not run on this GPU yet: run it once before capturing")
        q = p.launch_queue
        c["tasks"] = cp.ascontiguousarray(cp.asarray(q.tasks, dtype=cp.int32))
        c["spans"] = cp.ascontiguousarray(cp.asarray(q.spans, dtype=cp.int32))
        c["combine"] = cp.ascontiguousarray(cp.asarray(q.combine, dtype=cp.int32))
        # The split-KV workspace; a plan without split tasks (most) passes null pointers.
        n_o, n_l = p.workspace_elements
        c["part_o"] = cp.empty(n_o, dtype=cp.float32) if n_o else np.uint64(0)
        c["part_lse"] = cp.empty(n_l, dtype=cp.float32) if n_l else np.uint64(0)
    return c


def _wait_until_planned(p: Plan, stream: Any) -> None:
    """Order ``stream`` after the device planner's work for ``p`` (no host synchronization).
    Once per stream: its later work stays ordered after it, so repeated runs -- and a CUDA
    graph captured on a stream the plan already ran on -- make no event calls."""
    ready = p._cache.get("ready")
    if ready is None:  # a host-built plan
        return
    waited = p._cache.setdefault("ready_on", set())
    if stream.ptr not in waited:
        stream.wait_event(ready)
        waited.add(stream.ptr)


def _task_counter(p: Plan, cp: Any, stream: Any) -> Any:
    """The counter a persistent kernel takes ``p``'s tasks from: zeroed once when made, and left
    zero by every launch (the kernel's last ticket resets it, bsa_sm90.cu), so a reused plan's
    run enqueues no memset (a new plan's first run still makes one). One per (plan, stream):
    runs on one stream execute in order and may share it, runs on different streams never do,
    and a run allocates nothing after its first on a stream (CUDA-graph capture then records
    the launch alone, and each replay leaves the counter zero for the next)."""
    key = ("task_counter", stream.ptr)
    counter = p._cache.get(key)
    if counter is None:
        counter = p._cache[key] = cp.zeros(1, dtype=np.int32)
    return counter


# TMA copies in the producer variant (bsa_sm90.cu TESSERA_TMA) wherever the operands allow;
# False keeps every launch on cp.async (an A/B switch for benchmarks and tests).
use_tma = True
_NO_MAPS = np.zeros((), dtype=tma.MAPS_DTYPE)[()]  # the kernels' TmaMaps of a cp.async launch


def _tma_maps(p: Plan, ops: _Operands, bf16: bool):
    """The tensor maps of q, k and v for a TMA launch of ``p``, or None when TMA cannot read
    them (strides, alignment, no driver support): the launch then copies by cp.async."""
    return _encoded_maps((ops.q.ptr, ops.shape_q, tuple(ops.strides_q)),
                         (ops.k.ptr, ops.shape_kv, tuple(ops.strides_k)),
                         (ops.v.ptr, ops.shape_kv, tuple(ops.strides_v)), bf16,
                         p.launch_queue.tile_rows, p.launch_queue.heads_per_task,
                         p.regime.variant(ops.shape_q[3], bf16, tma=True).kv_box_rows)


@functools.lru_cache(maxsize=64)  # a model's layers reuse their buffers: encode once each
def _encoded_maps(q: tuple, k: tuple, v: tuple, bf16: bool, tile_rows: int, heads: int,
                  kv_rows: int):
    try:
        return tma.launch_maps(q, k, v, bf16=bf16, tile_rows=tile_rows, heads_per_task=heads,
                               block_n=kv_rows)
    except tma.TensorMapError:
        return None


@functools.lru_cache(maxsize=1024)  # a model's few strides, on every launch
def _int64s(values: tuple[int, ...]) -> tuple[np.int64, ...]:
    """Kernel arguments of int64 values (numpy scalars: ~0.3 us each to make)."""
    return tuple(np.int64(x) for x in values)


def _plan_args(p: Plan, scale: float) -> tuple:
    """The attention kernels' last arguments, the plan's own and the scale's (made once per
    plan and scale)."""
    key = ("plan_args", scale)
    got = p._cache.get(key)
    if got is None:
        launch = p.launch_queue
        got = p._cache[key] = (
            np.int32(launch.tile_rows), np.int32(p.num_q_heads // p.num_kv_heads),
            np.float32(scale * _LOG2E), np.int32(launch.num_tasks),
            np.uint64(0 if launch.count is None else launch.count.data.ptr))
    return got


@functools.lru_cache(maxsize=256)
def _resident_ctas(fwd: Any, device_id: int) -> int:
    """CTAs of ``fwd`` the GPU ``device_id`` (the current one) holds at once: a persistent
    kernel's largest grid."""
    return max(1, loader.blocks_per_sm(fwd) * regimes.device_sm_count())


def _launch(p: Plan, ops: _Operands, scale: float | None, return_lse: bool,
            given: dict | None = None):
    """Launch ``p``'s kernels on q's device and the caller's stream; the caller's outputs."""
    # q's device current throughout: its architecture, the kernels loaded there, its SMs.
    with cupy_or_none().cuda.Device(ops.q.device_id):
        return _launch_here(p, ops, scale, return_lse, given)


def _launch_here(p: Plan, ops: _Operands, scale: float | None, return_lse: bool,
                 given: dict | None):
    Variant, load_kernel, smem_bytes = loader.Variant, loader.load_kernel, loader.smem_bytes
    cp = cupy_or_none()
    b, hq, lq, d = ops.shape_q
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bf16 = ops.q.dtype == "bfloat16"
    r = p.regime
    cc = _device_cc()
    if not r.runs_on(cc):
        raise ValueError(f"regime {r.name} runs on sm_90 GPUs only; this device is sm_{cc}")
    maps = _tma_maps(p, ops, bf16) if use_tma and r.tma_capable else None
    fwd = r.variant(ops.shape_q[3], bf16, tma=maps is not None)
    if maps is None:
        maps = _NO_MAPS
    limit = regimes.smem_limit_bytes(cc)
    if smem_bytes(fwd) > limit:  # the launch would fail with a bare driver error
        raise ValueError(f"regime {r.name} needs {smem_bytes(fwd)} bytes of shared memory at head "
                         f"dim {d}; sm_{cc} allows {limit} per block")
    stream = _caller_stream(ops)
    with stream:  # CuPy work below goes on that stream too
        _wait_until_planned(p, stream)
        queue = _device_queue(p, cp)
        given = given or {}
        out_shape = (b, hq, lq, d) if p.layout == "bhld" else (b, lq, hq, d)
        if "out" in given:
            out_desc, out_obj = given["out"]
            finish_out = lambda stream: out_obj  # noqa: E731
        else:
            out_desc, finish_out = empty_like_caller(ops.q, out_shape, ops.q.dtype)
        o_str = _bhld(out_desc, p.layout, "out")[1]
        lse_desc = finish_lse = None
        if "lse" in given:
            lse_desc, lse_obj = given["lse"]
            finish_lse = lambda stream: lse_obj  # noqa: E731
        elif return_lse:
            lse_desc, finish_lse = empty_like_caller(ops.q, (b, hq, lq), "float32")
        lse_ptr = lse_desc.ptr if lse_desc else 0
        if poison_outputs:  # only what this call allocated (given outputs may be strided views)
            for desc in (None if "out" in given else out_desc,
                         None if "lse" in given else lse_desc):
                if desc is not None:
                    n = int(np.prod(desc.shape)) * desc.itemsize
                    cp.cuda.runtime.memsetAsync(desc.ptr, 0xFF, n, stream.ptr)  # NaN in all types
        lse_sb, lse_sh = (hq * lq, lq)

        fn = load_kernel(fwd)
        launch = p.launch_queue
        i64, i32, ptr = np.int64, np.int32, np.uint64
        args = (queue["tasks"], queue["spans"],
                ptr(ops.q.ptr), *_int64s(ops.strides_q[:3]),
                ptr(ops.k.ptr), *_int64s(ops.strides_k[:3]),
                ptr(ops.v.ptr), *_int64s(ops.strides_v[:3]),
                ptr(out_desc.ptr), *_int64s(o_str[:3]),
                ptr(lse_ptr), *_int64s((lse_sb, lse_sh)),
                queue["part_o"], queue["part_lse"], *_plan_args(p, scale))
        # The grid: the tasks, or for a sync-free plan the most there can be (the kernels read
        # the real count and surplus CTAs return at once).
        n_tasks = launch.num_tasks
        if n_tasks:
            grid, counter = n_tasks, None
            if fwd.persistent:  # as many CTAs as the GPU holds at once, taking tasks in turn
                grid = n_tasks if persistent_grid_cap == 0 else min(
                    n_tasks, _resident_ctas(fwd, ops.q.device_id), persistent_grid_cap or n_tasks)
                counter = _task_counter(p, cp, stream)
            args += (ptr(0 if counter is None else counter.data.ptr), maps)
            fn((grid,), (fwd.threads,), args, shared_mem=smem_bytes(fwd), stream=stream)
        n_jobs = int(launch.combine.shape[0])
        if n_jobs:
            comb = load_kernel(Variant.combine(bf16=bf16))
            comb((n_jobs,), (256,), (queue["combine"], queue["part_o"], queue["part_lse"],
                                     ptr(out_desc.ptr), *map(i64, o_str[:3]), ptr(lse_ptr),
                                     i64(lse_sb), i64(lse_sh), i32(r.block_m), i32(d),
                                     i32(launch.tile_rows)), stream=stream)
        result = finish_out(stream)
        if return_lse:
            return result, finish_lse(stream)
        return result
