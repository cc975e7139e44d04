"""Running a plan on the GPU: the caller's stream, the plan's device state (its queue on each
device, task counters, kernel arguments), TMA tensor maps, the persistent grid, the attention
kernel and the combine step.

A plan reaches this module through :func:`run_plan` (``Plan.run``) or :func:`run`
(``tessera.attention``, operands already described); it only reads a plan's fields, so the
runtime's planning layer sits above it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ._array import cupy_or_none
from .capture import capture_memory_if, capturing, stream_capturing
from .cuda import tma
from .cuda.device import device_cc, device_sm_count, smem_limit_bytes
from .cuda.loader import blocks_per_sm, load_kernel
from .cuda.variants import Variant, smem_bytes
from .interop import empty_like_caller
from .quantize_launch import PRECISION_SCHEMES, check_int8, quantize_operands
from .operands import (
    Operands,
    Outputs,
    bhld_view,
    check_mask,
    check_scale,
    describe,
    describe_outputs,
)
from .mask import BlockMask
from .runtime.queue import TaskQueue
from .settings import config
from .streams import StreamMark, cupy_stream, hold_while_read, stream_identity

__all__ = ["AttentionShape", "Launchable", "LaunchState", "DeviceQueue", "Workspace", "run_plan",
           "run", "caller_stream", "check_operands"]

_LOG2E = 1.4426950408889634


# The most task indices a launch may reach (its tasks and a persistent grid's surplus tickets):
# the sm90 producer publishes an index with two flags in one int (sm90/scheduler.cuh, publish_task).
MAX_TASKS = 1 << 29


@dataclass
class DeviceQueue:
    """A plan's task queue on one device (a host plan may run on several GPUs): what the
    kernels' queue pointers address."""

    tasks: Any
    spans: Any
    combine: Any


@dataclass
class Workspace:
    """A plan's split-KV partials for the runs on one stream: runs on one stream execute in
    order and may share them, runs on two streams at once must not (each would overwrite the
    other's partials). A plan without split tasks (most) has none: null pointers."""

    part_o: Any
    part_lse: Any


@dataclass
class LaunchState:
    """The device state a plan's launches keep between runs, owned by the plan.

    Attributes:
        ready: where the planner's work was enqueued (device plans; None for a host plan), a
            :class:`~tessera.streams.StreamMark` that runs on another stream wait for on the
            device.
        queues: per device id, the queue copied there (:class:`DeviceQueue`).
        workspaces: per (device id, stream address, the driver's stream id -- see
            ``_stream_identity``), the split-KV partials (:class:`Workspace`).
        task_counters: per the same key, the counter a persistent kernel takes tasks from (the
            legacy default stream is 0 on every device).
        kernel_args: per scale, the attention kernel's last arguments (made once).
        kernels: per (device id, head dim, bf16, TMA form, 8-bit form), the attention kernel a
            run launches there (:class:`_Kernel`, resolved once).
        tma_box_rows: per (head dim, bf16), the TMA form's K/V box rows (its tensor maps').
        backward_queues: per (device id, tile rows, steps, whether the query-major queue is
            walked), the backward pass's queues copied there (``backward_launch.py``); emptied
            when the plan takes another mask.
    """

    ready: StreamMark | None = None
    queues: dict[int, DeviceQueue] = field(default_factory=dict)
    workspaces: dict[tuple[int, int, int], Workspace] = field(default_factory=dict)
    task_counters: dict[tuple[int, int, int], Any] = field(default_factory=dict)
    kernel_args: dict[float, tuple] = field(default_factory=dict)
    kernels: dict[tuple[int, int, bool, bool, bool], "_Kernel"] = field(default_factory=dict)
    tma_box_rows: dict[tuple[int, bool], int] = field(default_factory=dict)
    backward_queues: dict[tuple[int, int, tuple[int, int], bool], tuple] = field(
        default_factory=dict)

    def record_planned(self, xp: Any) -> None:
        """Note where the planner's work was enqueued (CuPy's current stream): runs on another
        stream wait for this event on the device (no host synchronization); runs on this one
        are ordered after it already. A replan records the same event again: a wait enqueued
        later waits for the new planner work, one enqueued earlier for what was recorded then."""
        if xp is np:
            return
        if self.ready is None:
            self.ready = StreamMark.here()
        else:
            self.ready.again()


@dataclass(frozen=True)
class AttentionShape:
    """What an attention call's q, k and v are, besides their lengths: batch, query and kv
    heads, head dim, element dtype ("bfloat16" or "float16") and layout ("bhld" or "blhd").
    A plan is made for one; a launch checks the operands against it."""

    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    layout: str


class Launchable(Protocol):
    """What a launch reads of a plan (``runtime.plan.Plan`` is one): its shape, regime, queue
    and launch state, so that this module needs nothing of the planning layer above it."""

    mask: BlockMask
    regime: Any  # the plan's Regime (runtime/regime, a layer above)
    launch_queue: TaskQueue
    launch_state: "LaunchState"

    @property
    def shape(self) -> AttentionShape: ...

    @property
    def workspace_elements(self) -> tuple[int, int]: ...


def run_plan(p: Launchable, q: Any, k: Any, v: Any, *, scale: float | None = None,
             return_lse: bool = False, out: Any = None, lse: Any = None,
             precision: str | None = None):
    """Run a plan on the GPU (``Plan.run``); q/k/v must match the shapes it was planned for.

    ``out`` (same dtype and layout as q, last dim contiguous) and ``lse`` (float32
    ``[B, Hq, Lq]``, contiguous) are written in place when given, so a run allocates nothing
    after the plan's first run on the stream; they are returned as given. A run may be
    captured into a CUDA graph (what it allocates then is the graph's); a host-planned plan
    must have run on the GPU once before. ``precision``: "int8" or "int8-qk", an 8-bit
    forward (:data:`~tessera.quantize_launch.PRECISION_SCHEMES`: the pre-pass, then an 8-bit
    form of the plan's kernel: a regime that has one, such as ``tessera.INT8_REGIME``), not
    capturable.
    """
    check_scale(scale)
    if precision is not None and precision not in PRECISION_SCHEMES:
        raise ValueError(f"precision must be one of {(None, *PRECISION_SCHEMES)}, got "
                         f"{precision!r}")
    shape = p.shape
    ops = describe(q, k, v, shape.layout)
    check_operands(p, ops)
    given = describe_outputs(ops, shape.layout, out, lse)
    # q's device current throughout: its architecture, the kernels loaded there, its SMs. A run
    # captured into a CUDA graph allocates (a task counter for a new stream, outputs not given)
    # from memory the graph keeps, as a captured request does.
    with cupy_or_none().cuda.Device(ops.q.device_id), \
            capture_memory_if(stream_capturing(ops.stream_ptr), ops.q.framework,
                              ops.q.device_id):
        quantized = None
        if precision is not None:
            scheme = PRECISION_SCHEMES[precision]
            check_int8(shape.head_dim, device_cc(), stream_capturing(ops.stream_ptr), precision)
            check_int8_regime(p.regime, shape.head_dim, precision)
            with caller_stream(ops):
                quantized = quantize_operands(q, k, v, scheme=scheme, layout=shape.layout)
        return run(p, ops, scale, return_lse or lse is not None, given, quantized)


def check_int8_regime(regime: Any, head_dim: int, precision: str = "int8") -> None:
    """The plan's regime must have an 8-bit form (the sm90 TMA producer's 128-row tiles, span by
    span): ValueError naming the regime and one that has, before anything is launched."""
    try:
        regime.variant(head_dim, True, tma=True, int8=True)
    except ValueError:
        raise ValueError(f"precision={precision!r} runs a plan whose regime has an 8-bit form; "
                         f"{regime.name} has none (plan with regime=tessera.INT8_REGIME)"
                         ) from None


def check_operands(p: Any, ops: Operands) -> None:
    """q, k and v against what plan ``p`` (its ``shape`` and ``mask``) was made for: shapes,
    dtype, token counts and device; ValueError or TypeError naming the difference."""
    shape = p.shape
    b, hq, lq, d = ops.shape_q
    _, hkv, lkv, _ = ops.shape_kv
    if (b, hq, hkv, d) != (shape.batch, shape.num_q_heads, shape.num_kv_heads, shape.head_dim):
        raise ValueError(f"q/k shapes (B={b}, Hq={hq}, Hkv={hkv}, D={d}) differ from the plan's "
                         f"(B={shape.batch}, Hq={shape.num_q_heads}, Hkv={shape.num_kv_heads}, "
                         f"D={shape.head_dim})")
    if ops.q.dtype != shape.dtype:
        raise TypeError(f"q dtype {ops.q.dtype} differs from the plan's {shape.dtype}")
    check_mask(p.mask, b, hq, hkv, lq, lkv)
    if p.mask.on_device and p.mask.device_id != ops.q.device_id:
        raise ValueError(f"the plan lives on device {p.mask.device_id} but q is on "
                         f"{ops.q.device_id}")


def caller_stream(ops: Operands) -> Any:
    """The caller's current stream as a CuPy stream (usable as a context manager)."""
    return cupy_stream(ops.stream_ptr, ops.q.device_id)


def _device_queue(p: Launchable, cp: Any) -> DeviceQueue:
    """The plan's launch queue on the current device (copied once per plan and device)."""
    state = p.launch_state
    device = cp.cuda.Device().id
    got = state.queues.get(device)
    if got is None:
        if capturing() and not p.mask.on_device:  # a host-to-device copy cannot be captured
            raise RuntimeError("a CUDA graph is being captured and this host-planned plan has "
                               "not run on this GPU yet: run it once before capturing")
        q = p.launch_queue
        got = state.queues[device] = DeviceQueue(
            tasks=cp.ascontiguousarray(cp.asarray(q.tasks, dtype=cp.int32)),
            spans=cp.ascontiguousarray(cp.asarray(q.spans, dtype=cp.int32)),
            combine=cp.ascontiguousarray(cp.asarray(q.combine, dtype=cp.int32)))
    return got


_NO_WORKSPACE = Workspace(part_o=np.uint64(0), part_lse=np.uint64(0))


def _stream_key(cp: Any, stream: Any) -> tuple[int, int, int]:
    """Who may share per-stream state: work on one stream of one device executes in order."""
    return (cp.cuda.Device().id, *stream_identity(stream.ptr))


def _workspace(p: Launchable, cp: Any, stream: Any, key: tuple | None = None) -> Workspace:
    """The split-KV partials of ``p``'s runs on ``stream`` of the current device (allocated at
    its first run there); ``key``: the stream's :func:`_stream_key`, when the caller has it."""
    n_o, n_l = p.workspace_elements
    if not n_o:
        return _NO_WORKSPACE
    spaces = p.launch_state.workspaces
    key = key or _stream_key(cp, stream)
    got = spaces.get(key)
    if got is None:
        got = spaces[key] = Workspace(part_o=cp.empty(n_o, dtype=cp.float32),
                                      part_lse=cp.empty(n_l, dtype=cp.float32))
    return got


def _wait_until_planned(p: Launchable, stream: Any, key: tuple | None = None) -> None:
    """Order ``stream`` after the device planner's work for ``p`` (no host synchronization).
    Once per stream: its later work stays ordered after it, so repeated runs -- and a CUDA
    graph captured on a stream the plan already ran on -- make no event calls. A run on
    another stream than the planner's holds the plan (its buffers belong to the planner's
    stream's memory) until the run is done."""
    mark = p.launch_state.ready
    if mark is None:  # a host-built plan
        return
    here = key[1:] if key else stream_identity(stream.ptr)
    mark.order(stream.ptr, here)
    if here != mark.on:
        hold_while_read(stream.ptr, p)


def _task_counter(p: Launchable, cp: Any, stream: Any, key: tuple | None = None) -> Any:
    """The counter a persistent kernel takes ``p``'s tasks from: zeroed once when made, and left
    zero by every launch (the kernel's last ticket resets it, sm90/scheduler.cuh), so a reused
    plan's run enqueues no memset (a new plan's first run still makes one). One per (plan, stream of
    the current device):
    runs on one stream execute in order and may share it, runs on different streams never do,
    and a run allocates nothing after its first on a stream (CUDA-graph capture then records
    the launch alone, and each replay leaves the counter zero for the next)."""
    counters = p.launch_state.task_counters
    key = key or _stream_key(cp, stream)
    counter = counters.get(key)
    if counter is None:
        counter = counters[key] = cp.zeros(1, dtype=np.int32)
    return counter


_NO_MAPS = np.zeros((), dtype=tma.MAPS_DTYPE)[()]  # the kernels' TmaMaps of a cp.async launch
_NO_STEPS = np.uint64(0)  # the q_step / v_step arguments of a 16-bit launch


@dataclass(frozen=True)
class _Kernel:
    """The attention kernel a run of a plan launches on one device, resolved once per plan,
    device and form (a request's host time goes to the launch, not to finding the kernel
    again)."""

    fwd: Variant
    fn: Any
    smem: int
    resident: int  # a persistent variant's largest grid on the device (0: not persistent)


def _kernel(p: Launchable, d: int, bf16: bool, tma_form: bool, cc: int, device_id: int,
            int8: int = 0) -> _Kernel:
    """The plan's kernel on the current device ``device_id`` (compute capability ``cc``, which
    the regime runs on) at head dim ``d``, its TMA form with ``tma_form``, its 8-bit form with
    ``int8``: loaded and checked against the device's shared-memory limit at the first run that
    needs it."""
    key = (device_id, d, bf16, tma_form, int8)
    got = p.launch_state.kernels.get(key)
    if got is not None:
        return got
    r = p.regime
    fwd = r.variant(d, bf16, tma=tma_form, int8=int8)
    limit = smem_limit_bytes(cc)
    if smem_bytes(fwd) > limit:  # the launch would fail with a bare driver error
        raise ValueError(f"regime {r.name} needs {smem_bytes(fwd)} bytes of shared memory at head "
                         f"dim {d}; sm_{cc} allows {limit} per block")
    resident = _resident_ctas(fwd, device_id) if fwd.persistent else 0
    got = p.launch_state.kernels[key] = _Kernel(fwd, load_kernel(fwd), smem_bytes(fwd), resident)
    return got


def _tma_box_rows(p: Launchable, d: int, bf16: bool) -> int:
    """Rows of the K/V tensor maps' boxes of the plan's TMA form at head dim ``d``."""
    rows = p.launch_state.tma_box_rows
    got = rows.get((d, bf16))
    if got is None:
        got = rows[(d, bf16)] = p.regime.variant(d, bf16, tma=True).kv_box_rows
    return got


def _tma_maps(p: Launchable, ops: Operands, bf16: bool):
    """The tensor maps of q, k and v for a TMA launch of ``p``, or None when TMA cannot read
    them (strides, alignment, no driver support): the launch then copies by cp.async."""
    return _encoded_maps((ops.q.ptr, ops.shape_q, tuple(ops.strides_q)),
                         (ops.k.ptr, ops.shape_kv, tuple(ops.strides_k)),
                         (ops.v.ptr, ops.shape_kv, tuple(ops.strides_v)), bf16,
                         p.launch_queue.tile_rows, p.launch_queue.heads_per_task,
                         _tma_box_rows(p, ops.shape_q[3], bf16))


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


def _plan_args(p: Launchable, scale: float) -> tuple:
    """The attention kernels' last arguments, the plan's own and the scale's (made once per
    plan and scale)."""
    cached = p.launch_state.kernel_args
    got = cached.get(scale)
    if got is None:
        launch = p.launch_queue
        got = cached[scale] = (
            np.int32(launch.tile_rows), np.int32(p.shape.num_q_heads // p.shape.num_kv_heads),
            np.float32(scale * _LOG2E), np.int32(launch.num_tasks),
            np.uint64(0 if launch.count is None else launch.count.data.ptr))
    return got


@functools.lru_cache(maxsize=256)
def _resident_ctas(fwd: Variant, device_id: int) -> int:
    """CTAs of ``fwd`` the GPU ``device_id`` (the current one) holds at once: a persistent
    kernel's largest grid."""
    return max(1, blocks_per_sm(fwd) * device_sm_count())


def _int8_operands(p: Launchable, ops: Operands, quantized: Any, bf16: bool
                   ) -> tuple[tuple, Any]:
    """The 8-bit forms' q, k, v kernel arguments (pointers and [B, H, L, D] strides; v is V^T,
    its token stride the padded key count -- or, with P V in 16 bits, the caller's V) and their
    TmaMaps, from the pre-pass's arrays."""
    def desc(a: Any) -> tuple:
        return a.data.ptr, a.shape, tuple(x // a.itemsize for x in a.strides)
    q, k = desc(quantized.q), desc(quantized.k)
    v_t = None if quantized.v_t is None else desc(quantized.v_t)
    v16 = (ops.v.ptr, ops.shape_kv, tuple(ops.strides_v))
    maps = tma.int8_launch_maps(q, k, v_t, desc(quantized.k_scale),
                                tile_rows=p.launch_queue.tile_rows,
                                heads_per_task=p.launch_queue.heads_per_task,
                                block_n=p.regime.block_n, v16=v16, bf16=bf16)
    ptr = np.uint64
    if v_t is None:
        v_args = (ptr(ops.v.ptr), *_int64s(ops.strides_v[:3]))
    else:
        vsb, vsh, vsd, _ = v_t[2]  # (a channel's row of keys, vsd apart: the kernel's v_sl)
        v_args = (ptr(v_t[0]), *_int64s((vsb, vsh, vsd)))
    return (ptr(q[0]), *_int64s(q[2][:3]), ptr(k[0]), *_int64s(k[2][:3]), *v_args), maps


def run(p: Launchable, ops: Operands, scale: float | None, return_lse: bool,
        given: Outputs | None = None, quantized: Any = None):
    """Launch ``p``'s kernels on q's device (current) and the caller's stream; returns the
    caller's outputs (and the LSE with ``return_lse``). ``quantized``: the 8-bit forward's
    operands (``quantize_launch.QuantizedOnDevice``, from ``ops``' q, k, v), which its kernel
    reads in their place."""
    cp = cupy_or_none()
    b, hq, lq, d = ops.shape_q
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bf16 = ops.q.dtype == "bfloat16"
    r = p.regime
    cc = device_cc()
    if not r.runs_on(cc):
        raise ValueError(f"regime {r.name} runs on sm_90 GPUs only; this device is sm_{cc}")
    int8 = 0 if quantized is None else 1 if quantized.v_t is not None else 2  # (INT8's values)
    if int8:
        operand_args, maps = _int8_operands(p, ops, quantized, bf16)
        steps = (np.uint64(quantized.q_scale.data.ptr), np.uint64(quantized.v_scale.data.ptr))
    else:
        maps = _tma_maps(p, ops, bf16) if config.use_tma and r.tma_capable else None
        ptr = np.uint64
        operand_args = (ptr(ops.q.ptr), *_int64s(ops.strides_q[:3]),
                        ptr(ops.k.ptr), *_int64s(ops.strides_k[:3]),
                        ptr(ops.v.ptr), *_int64s(ops.strides_v[:3]))
        steps = (_NO_STEPS, _NO_STEPS)
    kern = _kernel(p, d, bf16, maps is not None, cc, ops.q.device_id, int8)
    fwd, fn, smem, resident = kern.fwd, kern.fn, kern.smem, kern.resident
    if maps is None:
        maps = _NO_MAPS
    stream = caller_stream(ops)
    given = given or Outputs()
    # Which runs share per-stream state: asked of the driver once per run.
    key = _stream_key(cp, stream)
    with stream:  # CuPy work below goes on that stream too
        _wait_until_planned(p, stream, key)
        queue = _device_queue(p, cp)
        work = _workspace(p, cp, stream, key)
        out_shape = (b, hq, lq, d) if p.shape.layout == "bhld" else (b, lq, hq, d)
        if given.out is not None:
            out_desc, out_obj = given.out
            finish_out = lambda stream: out_obj  # noqa: E731
        else:
            out_desc, finish_out = empty_like_caller(ops.q, out_shape, ops.q.dtype)
        o_str = bhld_view(out_desc, p.shape.layout, "out")[1]
        lse_desc = finish_lse = None
        if given.lse is not None:
            lse_desc, lse_obj = given.lse
            finish_lse = lambda stream: lse_obj  # noqa: E731
        elif return_lse:
            lse_desc, finish_lse = empty_like_caller(ops.q, (b, hq, lq), "float32")
        lse_ptr = lse_desc.ptr if lse_desc else 0
        if config.poison_outputs:  # only what this call allocated (given ones may be strided)
            for desc in (None if given.out is not None else out_desc,
                         None if given.lse is not None else lse_desc):
                if desc is not None:
                    n = int(np.prod(desc.shape)) * desc.itemsize
                    cp.cuda.runtime.memsetAsync(desc.ptr, 0xFF, n, stream.ptr)  # NaN in all types
        lse_sb, lse_sh = (hq * lq, lq)

        launch = p.launch_queue
        i64, i32, ptr = np.int64, np.int32, np.uint64
        args = (queue.tasks, queue.spans, *operand_args,
                ptr(out_desc.ptr), *_int64s(o_str[:3]),
                ptr(lse_ptr), *_int64s((lse_sb, lse_sh)),
                work.part_o, work.part_lse, *_plan_args(p, scale))
        # The grid: the tasks, or for a sync-free plan the most there can be (the kernels read
        # the real count and surplus CTAs return at once).
        n_tasks = launch.num_tasks
        if n_tasks + resident * fwd.rings > MAX_TASKS:
            raise ValueError(f"the plan has {n_tasks} tasks; a launch takes at most "
                             f"{MAX_TASKS - resident * fwd.rings} on this GPU (split the call "
                             "by batch or heads)")
        if n_tasks:
            grid, counter = n_tasks, None
            if fwd.persistent:  # as many CTAs as the GPU holds at once, taking tasks in turn
                cap = config.persistent_grid_cap
                ctas = -(-n_tasks // fwd.rings)  # (a ringed CTA starts `rings` tasks)
                grid = ctas if cap == 0 else min(ctas, resident, cap or ctas)
                counter = _task_counter(p, cp, stream, key)
            args += (ptr(0 if counter is None else counter.data.ptr), maps, *steps)
            fn((grid,), (fwd.threads,), args, shared_mem=smem, stream=stream)
        n_jobs = int(launch.combine.shape[0])
        if n_jobs:
            comb = load_kernel(Variant.combine(bf16=bf16))
            # A warp a row: a job's rows over CTAs of the kernel's 256 threads (its bound).
            threads = 256
            comb((n_jobs, -(-r.block_m // (threads // 32))), (threads,),
                 (queue.combine, work.part_o, work.part_lse, ptr(out_desc.ptr),
                  *map(i64, o_str[:3]), ptr(lse_ptr), i64(lse_sb), i64(lse_sh), i32(r.block_m),
                  i32(d), i32(launch.tile_rows)), stream=stream)
        result = finish_out(stream)
        if return_lse:
            return result, finish_lse(stream)
        return result
