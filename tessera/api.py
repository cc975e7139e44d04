"""The front door: ``tessera.attention``, one call that plans a new mask and runs it, keeping
sync-free plans between requests of the same geometry so a model's layer loop replans instead
of planning anew; ``tessera.attention_backward``, its gradients. On torch tensors that require
grad, ``tessera.attention`` is differentiable (``autograd.py``), its backward
``attention_backward``.

Every check on the inputs happens before anything is launched (``operands.py``) and raises a
ValueError or TypeError that names the argument.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from ._array import cupy_or_none
from .autograd import differentiable
from .backward_launch import run_backward
from .capture import capture_memory_if, stream_capturing
from .cuda import device
from .launch import caller_stream, run
from .mask import BlockMask, bounds_key
from .operands import Operands, check_mask, check_scale, describe, gradient_recorded
from .quantize_launch import PRECISION_SCHEMES, check_int8, quantize_operands
from .runtime.backward import BackwardPlan
from .runtime.cache import PlanCache, RequestKey
from .runtime.mode import PlanMode
from .runtime.plan import Plan, checked_shape, plan, plan_selected
from .runtime.regime import ENV_TABLE, selected_regime, selection_generation
from .runtime.regime.backward import BackwardRegime, check_backward_regime_argument
from .runtime.regime.heuristic import INT8_REGIME
from .settings import config

__all__ = ["attention", "attention_backward", "request_plans", "kept_plans", "PRECISIONS"]

# attention's precision argument: None (the operands' own 16-bit type), or an 8-bit forward:
# "int8" (both products) or "int8-qk" (the scores; P V in 16 bits) -- quantize_launch's
# PRECISION_SCHEMES; tessera/quantization.py says how each rounds and what that costs.
PRECISIONS = (None, *PRECISION_SCHEMES)


def attention(q: Any, k: Any, v: Any, block_mask: BlockMask, *, scale: float | None = None,
              return_lse: bool = False, layout: str = "bhld", regime: Any = None,
              precision: str | None = None):
    """Block-sparse attention of ``q`` over ``k``/``v`` exactly on ``block_mask``.

    ``q`` is ``[B, Hq, Lq, D]`` (``layout="bhld"``) or ``[B, Lq, Hq, D]`` (``"blhd"``), k/v the
    same with Hkv heads (Hq a multiple of Hkv) and Lkv tokens; CuPy arrays or any CUDA DLPack
    tensor (PyTorch, JAX), bf16 or fp16, D in 64/96/128. Plans (on the device when the mask is
    there) and runs in one call; returns the output in the caller's type and layout, plus the
    natural-log LSE ``[B, Hq, Lq]`` (float32) with ``return_lse``. A later request of the same
    mask geometry, shapes and stream replans a kept plan (``tessera.config.request_plans_kept``).
    Unless ``regime`` is given, a request never splits heavy tasks (``PlanMode.REQUEST``:
    the split costs milliseconds of host planning, more than it saves), so a device mask is
    planned without waiting for the GPU. Inside a CUDA-graph capture the whole request is
    captured (after one warm-up request outside it; ``PlanMode.CAPTURE``). On torch tensors that
    require grad (while autograd records) the output is differentiable (``autograd.py``), its
    backward :func:`attention_backward`.

    ``precision="int8"`` (opt-in, Hopper GPUs, head dims 64 and 128; forward only): Q and K
    rounded to int8 a token at a time (K smoothed, both rotated), P to u8 a chunk at a time, V
    to int8 a channel at a time, the products on the 8-bit tensor cores -- about 1.5e-2
    relative error against float64 on random inputs (:mod:`tessera.quantization`, ``python -m
    tessera quant-error``). ``precision="int8-qk"``: the scores alone from int8, P V in 16 bits
    (about 0.9e-2). The output keeps q's dtype.
    """
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a tessera.BlockMask, got {type(block_mask).__name__}")
    check_scale(scale)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision is not None:
        return _attention_int8(q, k, v, block_mask, scale, return_lse, layout, regime,
                               precision)
    if gradient_recorded(q, k, v) is not None:
        out, lse = differentiable(
            lambda q_, k_, v_: attention(q_, k_, v_, block_mask, scale=scale, return_lse=True,
                                         layout=layout, regime=regime),
            lambda q_, k_, v_, o, lse_, do: attention_backward(
                q_, k_, v_, o, lse_, do, block_mask, scale=scale, layout=layout),
            q, k, v)
        return (out, lse) if return_lse else out
    ops = _described(q, k, v, block_mask, layout)
    # Plan on q's device and the caller's stream: the device planner's arrays must be ready
    # before the kernels read them, and a framework's side stream does not wait for CuPy's
    # default one.
    with cupy_or_none().cuda.Device(ops.q.device_id):
        capturing = stream_capturing(ops.stream_ptr)
        if capturing and not block_mask.on_device:
            raise ValueError("block_mask must be on the GPU while the stream is being captured "
                             "into a CUDA graph (a host mask's plan is copied to the GPU, "
                             "which a graph cannot capture): build it from a device tensor")
        # The mask is read on the caller's stream: after its writes, wherever they were made.
        with caller_stream(ops), block_mask.reading(), \
                capture_memory_if(capturing, ops.q.framework, ops.q.device_id), \
                _request_plan(block_mask, ops, layout, regime, capturing) as p:
            return run(p, ops, scale, return_lse)


def _described(q: Any, k: Any, v: Any, block_mask: BlockMask, layout: str) -> Operands:
    """q, k, v described (``operands.describe``) and ``block_mask`` checked against them: its
    token counts and heads, and the device a device mask lives on."""
    ops = describe(q, k, v, layout)
    b, hq, lq, _ = ops.shape_q
    _, hkv, lkv, _ = ops.shape_kv
    check_mask(block_mask, b, hq, hkv, lq, lkv)
    if block_mask.on_device and block_mask.device_id != ops.q.device_id:
        raise ValueError(f"block_mask is on device {block_mask.device_id} but q is on "
                         f"{ops.q.device_id}")
    return ops


def check_8bit_call(precision: str, regime: Any, grads_recorded: bool) -> None:
    """Refuse, naming it, what an 8-bit forward (``precision``) does not take: a ``regime`` (it
    runs INT8_REGIME) or inputs whose gradients autograd records (it is forward-only). The GPU
    path here and the torch integration's CPU path share it."""
    if regime is not None:
        raise ValueError(f"regime must be None with precision={precision!r} (the 8-bit "
                         f"forwards run their own regime, {INT8_REGIME.name})")
    if grads_recorded:
        raise ValueError(f"precision={precision!r} is forward-only: q, k, v must not require "
                         "grad while autograd records (detach them, or run under "
                         "torch.no_grad())")


def _attention_int8(q: Any, k: Any, v: Any, block_mask: BlockMask, scale: float | None,
                    return_lse: bool, layout: str, regime: Any, precision: str):
    """The 8-bit forward of :func:`attention` (its arguments checked there): the pre-pass's
    codes (quantize_launch.py), then the 8-bit kernel over a request plan of INT8_REGIME."""
    check_8bit_call(precision, regime, gradient_recorded(q, k, v) is not None)
    ops = _described(q, k, v, block_mask, layout)
    with cupy_or_none().cuda.Device(ops.q.device_id):
        check_int8(ops.shape_q[3], device.device_cc(), stream_capturing(ops.stream_ptr),
                   precision)
        with caller_stream(ops), block_mask.reading(), \
                _request_plan(block_mask, ops, layout, INT8_REGIME, False) as p:
            quantized = quantize_operands(q, k, v, scheme=PRECISION_SCHEMES[precision],
                                          layout=layout)
            return run(p, ops, scale, return_lse, quantized=quantized)


def attention_backward(q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any,
                       block_mask: BlockMask, *, scale: float | None = None,
                       layout: str = "bhld",
                       regime: BackwardRegime | None = None) -> tuple[Any, Any, Any]:
    """The gradients ``(dq, dk, dv)`` of ``tessera.attention(q, k, v, block_mask)`` for the
    output gradient ``dout``, exactly on the mask (keys no row selects get zero dK and dV, rows
    that select nothing zero dQ; GQA sums a group's query heads into its kv head).

    ``out`` and ``lse`` are the forward's (``return_lse=True``): P is recomputed from the LSE
    and Delta = rowsum(dO * O) read from ``out``, so a backward costs no forward. ``out`` and
    ``dout`` are like q (dtype, shape, layout, rows 16-byte aligned); ``lse`` float32
    ``[B, Hq, Lq]``, contiguous. Gradients come back in the caller's type and layout, q's dtype.
    On the Hopper kernels dQ is summed by float32 atomics where that is faster (its order
    varies between runs); ``tessera.config.deterministic_backward`` has every gradient row
    written by one task instead (bitwise repeatable). A device mask's backward queues
    are planned on the device without a synchronization (a host mask's on the host); a plan
    for a static mask keeps them (:meth:`Plan.run_backward`). ``regime``: a
    :class:`~tessera.BackwardRegime` to run (None: the regime table's backward section where
    it answers, else the heuristic; a device mask's density is not read for it).
    """
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a tessera.BlockMask, got {type(block_mask).__name__}")
    check_scale(scale)
    check_backward_regime_argument(regime)
    ops = _described(q, k, v, block_mask, layout)
    b, hq, _, d = ops.shape_q
    hkv = ops.shape_kv[1]
    with cupy_or_none().cuda.Device(ops.q.device_id):
        shape = checked_shape(block_mask, hq, hkv, d, None, b, ops.q.dtype, layout)
        with caller_stream(ops), block_mask.reading():
            return run_backward(BackwardPlan(block_mask, shape, read_mask=False), ops, out, lse,
                                dout, scale, regime)


# The plans tessera.attention keeps between requests (config.request_plans_kept bounds it).
request_plans = PlanCache()


@contextlib.contextmanager
def _request_plan(mask: BlockMask, ops: Operands, layout: str, regime: Any,
                  capturing: bool) -> Iterator[Plan]:
    """The plan of a request, for the duration of its launch: a kept plan of the same
    :class:`~tessera.runtime.cache.RequestKey` replanned for ``mask`` (Plan.replan: the planner's
    kernels and nothing else -- no allocation, no regime selection), else a new one, kept
    afterwards when a later mask of its geometry can reuse it.

    Reuse is safe because a kept plan serves one request at a time, on one stream: a request's
    replan is enqueued after the previous request's kernels, which were the last to read its
    buffers, and a plan is taken out of the cache while its request plans and launches. A
    request ``capturing`` into a CUDA graph takes a new sync-free plan (``PlanMode.CAPTURE``),
    so that the graph never shares buffers with later requests."""
    b, hq, lq, d = ops.shape_q
    hkv = ops.shape_kv[1]
    key = kept = selection = None
    if not config.request_plans_kept and len(request_plans):  # keeping was turned off
        request_plans.clear()
    if config.request_plans_kept and mask.on_device and not capturing:
        base = key = RequestKey(
            ops.q.device_id, ops.stream_ptr, regime, selection_generation(),
            os.environ.get(ENV_TABLE), (b, hq, hkv, d, ops.q.dtype, layout), mask.batch_heads,
            bounds_key(mask.q_bounds), bounds_key(mask.kv_bounds))
        since = request_plans.reads_since(base)
        if since is not None:
            # The selection reads the mask here: on every request_selection_refresh-th request;
            # the others take the last answer read (no synchronization). Plans are kept per
            # regime the selection gave.
            read = since + 1 >= config.request_selection_refresh
            selection = _selected(mask, ops, read)
            request_plans.note_reads(base, 0 if read else since + 1)
            key = base.with_selection(selection[0])
        kept = request_plans.take(key)
    if kept is not None:
        p = kept.replan(mask)
    else:
        if selection is not None:
            p = plan_selected(mask, selection, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                              batch=b, dtype=ops.q.dtype, layout=layout,
                              arch=device.device_cc())
        else:
            p = plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, batch=b,
                     dtype=ops.q.dtype, layout=layout, regime=regime, arch=device.device_cc(),
                     mode=PlanMode.CAPTURE if capturing else PlanMode.REQUEST)
        if not p.replannable or (regime is not None and not p.regime_by_geometry):
            key = None
        elif key is not None and selection is None and not p.regime_by_geometry:
            # This geometry's selection read the mask: from now on it does so on every
            # request_selection_refresh-th request, and plans are kept per regime (the one
            # just read, which the selection remembers for the geometry).
            request_plans.note_reads(key, 0)
            key = key.with_selection(_selected(mask, ops, False)[0])
    try:
        yield p
    finally:
        if key is not None:
            request_plans.keep(key, p)


def _selected(mask: BlockMask, ops: Operands, read_mask: bool) -> tuple[Any, bool]:
    """The regime selection of a request's plan (``PlanMode.REQUEST``'s): with
    ``read_mask=False`` the last answer read for this geometry and shapes, without reading."""
    b, hq, _, d = ops.shape_q
    return selected_regime(mask, arch=device.device_cc(), head_dim=d, dtype=ops.q.dtype,
                           num_q_heads=hq, batch=b, num_kv_heads=ops.shape_kv[1],
                           read_mask=read_mask)


def kept_plans() -> int:
    """How many plans requests keep now (for tests and ``python -m tessera info``)."""
    return len(request_plans)
