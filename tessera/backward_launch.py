"""Running a plan's backward pass on the GPU: the gradient inputs checked, the backward queues on
the device, and the kernels on the caller's stream: Delta (``cuda/bwd_rows.cu``), then dK/dV
and dQ of the Hopper or the portable family (``cuda/sm90/bwd_*.cu``, ``cuda/sm80/bwd_*.cu``) --
or, on the Hopper family in 128-row tasks unless ``config.deterministic_backward``, dK/dV
summing dQ by atomics into float32, then dQ's conversion (``bwd_rows.cu``).

A plan reaches this module through :func:`run_backward_plan` (``Plan.run_backward``); it reads
the plan's shape, mask and its backward queues (``runtime/backward.py``, asked of the plan),
so the planning layer stays above it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Protocol

import numpy as np

from ._array import cupy_or_none
from .capture import capture_memory_if, capturing, stream_capturing
from .cuda import tma
from .cuda.device import device_cc
from .cuda.loader import load_kernel
from .cuda.variants import Variant, smem_bytes
from .interop import empty_like_caller
from .launch import AttentionShape, LaunchState, caller_stream, check_operands
from .operands import (Operands, bhld_view, check_scale, describe, describe_like_q,
                       describe_lse)
from .settings import config

# A backward regime (``runtime.regime.backward.BackwardRegime``, the planning layer's value) is
# read here by its fields and ``kernels()`` only: typed ``Any`` so that this layer imports
# nothing above it.
BackwardRegime = Any

__all__ = ["BackwardLaunchable", "run_backward_plan", "run_backward"]

_LOG2E = 1.4426950408889634
_DELTA_THREADS = 256  # bsa_bwd_delta's launch bound: 8 rows a CTA, a warp each
_CONVERT_THREADS = 256  # bsa_bwd_dq_convert's launch bound: four columns a thread


class BackwardLaunchable(Protocol):
    """What a backward launch reads of a plan (``runtime.plan.Plan`` is one)."""

    launch_state: LaunchState

    @property
    def shape(self) -> AttentionShape: ...

    def backward_regime(self, arch: int | None, *, deterministic: bool = False,
                        portable: bool = False) -> BackwardRegime: ...

    def backward_queues(self, block_m: int = 64, block_n: tuple[int, int] | None = None,
                        query_major: bool = True) -> Any: ...


def run_backward_plan(p: BackwardLaunchable, q: Any, k: Any, v: Any, out: Any, lse: Any,
                      dout: Any, *, scale: float | None = None,
                      regime: BackwardRegime | None = None) -> tuple[Any, Any, Any]:
    """The gradients ``(dq, dk, dv)`` of ``p``'s attention for the output gradient ``dout``
    (``Plan.run_backward``), in q's type and layout. ``out`` and ``dout`` are like q (its
    dtype, shape and layout, rows 16-byte aligned); ``lse`` is the forward's float32
    ``[B, Hq, Lq]`` (contiguous). ``regime``: the backward regime to run (None: the plan's
    selection). Everything is checked before anything is launched."""
    check_scale(scale)
    ops = describe(q, k, v, p.shape.layout)
    check_operands(p, ops)
    return run_backward(p, ops, out, lse, dout, scale, regime)


def run_backward(p: BackwardLaunchable, ops: Operands, out: Any, lse: Any, dout: Any,
                 scale: float | None, regime: BackwardRegime | None = None
                 ) -> tuple[Any, Any, Any]:
    """:func:`run_backward_plan` once q, k and v are described and checked against ``p``
    (``tessera.attention_backward``, which has done both): the gradient inputs and the regime
    checked, then the launches on q's device."""
    layout = p.shape.layout
    o_desc = describe_like_q(out, "out", ops, layout)
    do_desc = describe_like_q(dout, "dout", ops, layout)
    ld = describe_lse(lse, ops, "the forward's contiguous float32 LSE")
    cp = cupy_or_none()
    with cp.cuda.Device(ops.q.device_id):
        cc = device_cc()
        if regime is not None and not regime.runs_on(cc):
            raise ValueError(f"regime {regime.name} runs on sm_90 only; this GPU is sm_{cc} "
                             "(the sm80 family runs everywhere)")
        with capture_memory_if(stream_capturing(ops.stream_ptr), ops.q.framework,
                               ops.q.device_id):
            if regime is None:  # (inside a capture the selection reads nothing back)
                regime = p.backward_regime(cc, deterministic=config.deterministic_backward,
                                           portable=config.portable_backward)
            return _launch(p, ops, o_desc, do_desc, ld, scale, regime, cc)


def _device_queues(p: BackwardLaunchable, cp: Any, block_m: int, block_n: tuple[int, int],
                   query_major: bool) -> tuple[Any, Any]:
    """``p``'s backward queues on the current device, (dq, dkdv) as (tasks, spans, rows,
    device task count or None, tile rows) -- dq None unless ``query_major`` (dQ by atomics
    walks no query-major queue) -- planned once per plan, device, tile rows and steps; host
    queues copied there, the planner kernels' used as they are."""
    key = (cp.cuda.Device().id, block_m, block_n, query_major)
    got = p.launch_state.backward_queues.get(key)
    if got is None:
        if capturing():
            raise RuntimeError("a CUDA graph is being captured and this plan's backward pass "
                               "has not run on this GPU yet: run it once before capturing")
        bq = p.backward_queues(block_m, block_n, query_major)
        got = p.launch_state.backward_queues[key] = tuple(
            None if x is None or (not query_major and x is bq.dq) else
            (cp.ascontiguousarray(cp.asarray(x.tasks, dtype=cp.int32)),
             cp.ascontiguousarray(cp.asarray(x.spans, dtype=cp.int32)),
             int(x.tasks.shape[0]), x.count, int(x.tile_rows))
            for x in (bq.dq, bq.dkdv))
    return got


_NO_MAPS = np.zeros((), dtype=tma.CHUNK_MAPS_DTYPE)[()]  # the ChunkMaps of a cp.async launch


@functools.lru_cache(maxsize=64)  # a training step's layers reuse their buffers: encode once
def _chunk_maps(q: tuple, dout: tuple, k: tuple, v: tuple, bf16: bool, kv_rows: int,
                q_rows: int):
    """The (dK/dV, dQ) kernels' ChunkMaps: boxes of the dK/dV kernel's ``kv_rows`` query rows of
    Q and dO, and of the dQ kernel's ``q_rows`` keys of K and V; None when TMA cannot read one
    of the operands (strides, alignment, no driver support)."""
    try:
        return (tma.chunk_maps(q, dout, bf16=bf16, rows=kv_rows),
                tma.chunk_maps(k, v, bf16=bf16, rows=q_rows))
    except tma.TensorMapError:
        return None


def _launch(p: BackwardLaunchable, ops: Operands, o_desc: Any, do_desc: Any, lse_desc: Any,
            scale: float | None, regime: BackwardRegime, cc: int) -> tuple[Any, Any, Any]:
    cp = cupy_or_none()
    shape = p.shape
    b, hq, lq, d = ops.shape_q
    _, hkv, lkv, _ = ops.shape_kv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bf16 = ops.q.dtype == "bfloat16"
    layout = shape.layout
    o_str = bhld_view(o_desc, layout, "out")[1]
    do_str = bhld_view(do_desc, layout, "dout")[1]
    # The chunk operands' tensor maps (dK/dV: Q and dO; dQ: K and V), or None where TMA cannot
    # read them: then the cp.async kernels.
    maps = None
    if regime.tma and config.use_tma:
        dkdv_tma, dq_tma = regime.kernels(d, bf16, cc, tma=True)
        maps = _chunk_maps((ops.q.ptr, ops.shape_q, tuple(ops.strides_q)),
                           (do_desc.ptr, ops.shape_q, tuple(do_str)),
                           (ops.k.ptr, ops.shape_kv, tuple(ops.strides_k)),
                           (ops.v.ptr, ops.shape_kv, tuple(ops.strides_v)), bf16,
                           dkdv_tma.macro("BN"), (dq_tma or dkdv_tma).macro("BN"))
    dkdv_variant, dq_variant = ((dkdv_tma, dq_tma) if maps is not None
                                else regime.kernels(d, bf16, cc, tma=False))
    block_m = dkdv_variant.macro("BM")
    block_n = ((dq_variant or dkdv_variant).macro("BN"), dkdv_variant.macro("BN"))
    stream = caller_stream(ops)
    i64, i32, f32, ptr = np.int64, np.int32, np.float32, np.uint64
    with stream:
        dq_queue, kv_queue = _device_queues(p, cp, block_m, block_n, dq_variant is not None)

        def grad(rows: int, heads: int):
            want = (b, heads, rows, d) if layout == "bhld" else (b, rows, heads, d)
            desc, finish = empty_like_caller(ops.q, want, ops.q.dtype)
            if config.poison_outputs:
                cp.cuda.runtime.memsetAsync(desc.ptr, 0xFF, desc.itemsize * int(np.prod(want)),
                                            stream.ptr)
            return desc, finish, bhld_view(desc, layout, "gradient")[1]

        dq, dk, dv = grad(lq, hq), grad(lkv, hkv), grad(lkv, hkv)
        rows = b * hq * lq
        delta = cp.empty(rows, dtype=cp.float32)
        fn = load_kernel(Variant.bwd_delta(head_dim=d, bf16=bf16))
        per_cta = _DELTA_THREADS // 32
        fn((-(-rows // per_cta),), (_DELTA_THREADS,),
           (ptr(o_desc.ptr), *map(i64, o_str[:3]), ptr(do_desc.ptr), *map(i64, do_str[:3]),
            delta, i32(hq), i32(lq), i64(rows)), stream=stream)
        operands = (ptr(ops.q.ptr), *map(i64, ops.strides_q[:3]),
                    ptr(ops.k.ptr), *map(i64, ops.strides_k[:3]),
                    ptr(ops.v.ptr), *map(i64, ops.strides_v[:3]),
                    ptr(do_desc.ptr), *map(i64, do_str[:3]),
                    ptr(lse_desc.ptr), delta,
                    ptr(dq[0].ptr), *map(i64, dq[2][:3]),
                    ptr(dk[0].ptr), *map(i64, dk[2][:3]),
                    ptr(dv[0].ptr), *map(i64, dv[2][:3]),
                    i32(hq), i32(lq))
        # dQ by atomics: float32 sums, zeroed (rows no task reaches keep a zero gradient), from
        # the caller's allocator like the gradients: a torch caller's cached blocks come back
        # stream-ordered, where a new block of CuPy's pool (100+ MB at a model's shape) is a
        # cudaMalloc, which may wait for the GPU.
        sums = None
        if dq_variant is None:
            sums, _ = empty_like_caller(ops.q, (rows * d,), "float32")
            cp.cuda.runtime.memsetAsync(sums.ptr, 0, rows * d * 4, stream.ptr)
        for v, queue, chunk_maps in ((dkdv_variant, kv_queue, maps[0] if maps else _NO_MAPS),
                                     (dq_variant, dq_queue, maps[1] if maps else _NO_MAPS)):
            if v is None or not queue[2]:
                continue
            tasks, spans, n_rows, count, tile_rows = queue
            # A device count: the grid covers the queue's rows, CTAs past the count return.
            load_kernel(v)((n_rows,), (v.threads,),
                           (tasks, spans, *operands, i32(tile_rows), i32(hq // hkv), f32(scale),
                            f32(scale * _LOG2E), i32(n_rows),
                            ptr(0 if count is None else count.data.ptr),
                            ptr(0 if sums is None else sums.ptr), chunk_maps),
                           shared_mem=smem_bytes(v), stream=stream)
        if sums is not None:
            fn = load_kernel(Variant.bwd_dq_convert(head_dim=d, bf16=bf16))
            quads = rows * d // 4
            fn((-(-quads // _CONVERT_THREADS),), (_CONVERT_THREADS,),
               (ptr(sums.ptr), ptr(dq[0].ptr), *map(i64, dq[2][:3]), i32(hq), i32(lq), i64(rows),
                f32(scale)), stream=stream)
        return dq[1](stream), dk[1](stream), dv[1](stream)

