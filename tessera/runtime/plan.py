"""Plans: a logical mask mapped, organized and ready to run, with the workspace it needs.

``plan()`` is the whole host/device planning path: physical mapping, then task organization.
It is array-module agnostic: a CuPy mask is planned on the device with no copy of the mask to the
host (at most a few scalars, the sizes of the arrays it makes, come back). A device mask without
restricted merges takes the planner kernels (``device_planner.py``), with no synchronization at
all when no task may split -- but a plan made directly reads the mask's block count where the
count decides its tiles or a dense layer's walk (see :func:`plan`); everything else the general
path, which gives the same arrays.
A sync-free plan can be replanned for another mask of its geometry (``Plan.replan``), which
``tessera.attention`` does for the requests of a model. What a plan may do is its
:class:`~tessera.runtime.mode.PlanMode`: ``EXACT`` (``tessera.plan``), ``REQUEST``
(``tessera.attention``: never splits) or ``CAPTURE`` (inside a CUDA graph: reads nothing back).

The pipeline (:func:`_plan`): the regime for the mode (``regime/choice.py``), the physical
mapping and task organization (``planners.py``: the device planner, else the array planner),
the last wave filled, the Plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .._array import to_numpy
from ..autograd import differentiable
from ..backward_launch import run_backward_plan
from ..capture import capture_memory_if, stream_capturing
from ..cuda.device import check_arch
from ..dtypes import SUPPORTED_HEAD_DIMS, checked_dtype
from ..launch import MAX_TASKS, AttentionShape, LaunchState, run_plan
from ..mask import BlockMask
from ..operands import gradient_recorded
from . import mapping
from .backward import BackwardPlan, BackwardQueues
from .device_planner import SyncFreePlan
from .mapping import PhysicalTiles
from .mode import PlanMode
from .queue import Span, Task, TaskQueue, records
from .planners import PLANNERS, Organized, PlanShape
from .regime import ROW_GROUP, Regime
from .regime.backward import BackwardRegime, check_backward_regime_argument
from .regime.choice import RegimeChoice, regime_for_mode
from .tasks import NEVER_SPLIT_RATIO, fill_last_wave, task_groups

__all__ = ["Plan", "PlanShape", "PlanStats", "plan", "plan_selected", "checked_shape"]


@dataclass
class PlanStats:
    """What a plan will do: useful vs computed work, and how it is spread over tasks."""

    useful_pairs: int
    computed_pairs: int
    wasted_ratio: float
    num_tiles: int
    num_groups: int
    num_merged: int
    num_tasks: int
    num_split_jobs: int
    num_spans: int
    max_task_chunks: int
    mean_task_chunks: float

    def __str__(self) -> str:
        return (f"useful {self.useful_pairs:,} pairs, computed {self.computed_pairs:,} "
                f"(x{self.wasted_ratio:.3f}); {self.num_tiles} tiles from {self.num_groups} "
                f"groups ({self.num_merged} restricted merges); {self.num_tasks} tasks, "
                f"{self.num_split_jobs} split, {self.num_spans} spans; task chunks max "
                f"{self.max_task_chunks}, mean {self.mean_task_chunks:.1f}")


@dataclass
class Plan:
    """A mask planned for one attention shape; ``run`` executes it (GPU), ``emulate.run`` on CPU.

    ``tiles`` and ``queue`` are the exact arrays. ``launch_queue`` is what the kernels read: the
    queue itself, or for a sync-free device plan its bounded buffers with the task count left on
    the device -- then ``tiles``/``queue`` are cut from them on first use (one small copy, which
    waits for the planner's kernels), and a request that only runs the plan never waits. Such
    a plan can also take a later mask of its geometry into the same buffers (:meth:`replan`).
    """

    mask: BlockMask
    regime: Regime
    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    dtype: str
    layout: str
    launch_queue: TaskQueue
    # Tasks the GPU it was planned for runs at once (0: unknown), which the queue's launch order
    # and split rule were decided for.
    in_flight: int = 0
    # Whether every mask of this geometry gets this regime (given, or selected without reading
    # the selection): a replan for another such mask then gives what a new plan would.
    regime_by_geometry: bool = True
    # (tiles, queue), or for a sync-free plan the callable that cuts them from its buffers.
    _exact: tuple[PhysicalTiles, TaskQueue] | Callable[[], tuple[PhysicalTiles, TaskQueue]] = \
        field(repr=False, default=None)  # type: ignore[assignment]
    # A sync-free plan's device buffers and the launches that replan them (None: a host plan).
    device_plan: SyncFreePlan | None = field(repr=False, default=None)
    # The launches' device state (queues per device, task counters, ...; ``launch.py``).
    launch_state: LaunchState = field(default_factory=LaunchState, repr=False)
    # What the plan may do (its backward regime selection reads a device mask in EXACT only).
    mode: PlanMode = PlanMode.EXACT
    # The backward pass of this plan's mask (made at its first backward run).
    _backward: BackwardPlan | None = field(default=None, repr=False)

    def _planned(self) -> None:
        """Note where the planner's work was enqueued (``launch.LaunchState.record_planned``)."""
        self.launch_state.record_planned(self.mask.xp)

    @property
    def shape(self) -> AttentionShape:
        """The attention shape the plan was made for (what a run checks q, k and v against)."""
        return AttentionShape(self.batch, self.num_q_heads, self.num_kv_heads, self.head_dim,
                              self.dtype, self.layout)

    @property
    def replannable(self) -> bool:
        """Whether :meth:`replan` can take a new mask (a sync-free device plan whose regime
        holds for any mask: not ``whole_spans``, which holds for masks selecting every block)."""
        return (self.device_plan is not None and self.device_plan.relaunch is not None
                and not self.regime.whole_spans)

    def replan(self, block_mask: BlockMask) -> "Plan":
        """Plan ``block_mask``, a mask of this plan's geometry, into this plan's own buffers and
        return the plan: the planner kernels run again on CuPy's current stream, with nothing
        allocated and nothing waited for, so a model can keep one plan per layer and change its
        mask every step. The regime stays this plan's (:attr:`regime_by_geometry` says whether
        a new plan would pick the same). Runs of this plan already enqueued on this stream
        finish first; runs still in flight on another stream must be ordered before this call
        by the caller, as for any array the GPU may still read.

        Raises ValueError when the plan is not :attr:`replannable` or the mask's geometry,
        batch and heads, array module or GPU differ from the plan's mask.
        """
        if not isinstance(block_mask, BlockMask):
            raise TypeError(f"block_mask must be a tessera.BlockMask, got "
                            f"{type(block_mask).__name__}")
        if not self.replannable:
            raise ValueError("only a sync-free device plan can be replanned (this one was "
                             "planned on the host, may split tasks, or runs whole spans); plan "
                             "the mask anew")
        old = self.mask
        if block_mask is not old:
            if block_mask.xp is not old.xp:
                raise ValueError("block_mask must live where the plan's mask does "
                                 f"({'device' if old.on_device else 'host'})")
            if block_mask.batch_heads != old.batch_heads or not (
                    _same_bounds(block_mask.q_bounds, old.q_bounds)
                    and _same_bounds(block_mask.kv_bounds, old.kv_bounds)):
                raise ValueError(f"block_mask's geometry {block_mask} differs from the plan's "
                                 f"{old}")
        if block_mask.device_id != old.device_id:
            raise ValueError(f"block_mask is on device {block_mask.device_id}, the plan's mask "
                             f"on {old.device_id}")
        with block_mask.device_context(), block_mask.reading():
            dense = mapping.device_dense_rows(block_mask)
            xp = block_mask.xp
            self.device_plan.relaunch(xp.ascontiguousarray(dense).view(np.uint8))
            self.mask = block_mask
            self._exact = self.device_plan.settle
            self._backward = None
            self.launch_state.backward_queues.clear()
            self._planned()
        return self

    def _settled(self) -> tuple[PhysicalTiles, TaskQueue]:
        if callable(self._exact):
            mark = self.launch_state.ready
            if mark is not None:  # the copy back runs on CuPy's current stream: after the planner
                with self.mask.device_context():
                    mark.order(int(self.mask.xp.cuda.get_current_stream().ptr))
            self._exact = self._exact()
        return self._exact

    @property
    def tiles(self) -> PhysicalTiles:
        """The physical tiles (exact; see the class docstring)."""
        return self._settled()[0]

    @property
    def queue(self) -> TaskQueue:
        """The task queue (exact; see the class docstring)."""
        return self._settled()[1]

    @property
    def sync_free(self) -> bool:
        """Whether the task count stayed on the device (the plan's buffers are bounds)."""
        return self.launch_queue.count is not None

    @property
    def heads_per_task(self) -> int:
        return self.launch_queue.heads_per_task

    @property
    def workspace_elements(self) -> tuple[int, int]:
        """Elements of fp32 partial output and of fp32 partial lse the split-KV step needs."""
        slots = self.launch_queue.num_slots
        return slots * self.regime.block_m * self.head_dim_v, slots * self.regime.block_m

    def task_assignments(self) -> np.ndarray:
        """Each queued task's (batch, head) assignment: its index in head_assignments' list, the
        group tasks.launch_keys orders by (from the task's batch and first query head)."""
        return task_groups(
            to_numpy(self.queue.tasks), self.batch, self.num_q_heads,
            self.num_kv_heads, self.heads_per_task, self.mask.batch_index(self.batch),
            self.mask.head_index(self.num_q_heads, self.num_kv_heads), self.mask.batch_heads[1])

    def computed_pairs(self) -> int:
        """(query, key) pairs the kernels evaluate: per span chunk, block_n keys for every row
        group (ROW_GROUP rows, one warp's share) holding at least one row the span applies to
        (sm80), or for all block_m rows of the task (sm90: its warpgroups issue every chunk)."""
        tasks = records(self.queue.tasks, Task)
        spans = records(self.queue.spans, Span)
        if tasks.size == 0:
            return 0
        n_sp = tasks.span_end - tasks.span_begin
        t_of = np.repeat(np.arange(tasks.size), n_sp)
        s_idx = np.concatenate([np.arange(a, b) for a, b in zip(tasks.span_begin, tasks.span_end)]
                               ) if n_sp.sum() else np.zeros(0, np.int64)
        mine = spans[s_idx]
        k0, k1, r0, r1 = mine.k_start, mine.k_end, mine.r_start, mine.r_end
        bn = self.regime.block_n
        chunks = (k1 - k0 + bn - 1) // bn
        if self.regime.pack_keys:  # a task's keys end to end (sm90: every row, every chunk)
            keys = np.bincount(t_of, weights=k1 - k0, minlength=tasks.size).astype(np.int64)
            return int(((keys + bn - 1) // bn * bn * self.regime.block_m).sum())
        if self.regime.family == "sm90":  # every warpgroup multiplies every chunk of its task
            return int((chunks * bn * self.regime.block_m).sum())
        q0, q1 = tasks.q_start[t_of], tasks.q_end[t_of]
        lo = np.maximum(q0, r0) - q0
        hi = np.minimum(q1, r1) - q0
        groups = np.where(hi > lo, (hi + ROW_GROUP - 1) // ROW_GROUP - lo // ROW_GROUP, 0)
        return int((groups * self.heads_per_task * ROW_GROUP * bn * chunks).sum())

    def stats(self) -> PlanStats:
        """Useful and computed pairs, waste, task counts and balance (computed on the host)."""
        useful = int(self.mask.selected_pairs(self.batch, self.num_q_heads).sum())
        computed = self.computed_pairs()
        cost = records(self.queue.tasks, Task).cost if self.queue.num_tasks else np.zeros(1)
        return PlanStats(
            useful_pairs=useful, computed_pairs=computed,
            wasted_ratio=computed / useful if useful else float("nan"),
            num_tiles=self.tiles.num_tiles, num_groups=self.tiles.num_groups,
            num_merged=self.tiles.num_merged, num_tasks=self.queue.num_tasks,
            num_split_jobs=int(self.queue.combine.shape[0]),
            num_spans=int(self.queue.spans.shape[0]), max_task_chunks=int(cost.max()),
            mean_task_chunks=float(cost.mean()))

    def run(self, q: Any, k: Any, v: Any, *, scale: float | None = None,
            return_lse: bool = False, out: Any = None, lse: Any = None,
            precision: str | None = None):
        """Execute on the GPU (``launch.run_plan``); needs CuPy and a CUDA device.
        With ``out``/``lse`` given the run writes them in place and allocates nothing. On torch
        tensors that require grad (while autograd records) the output is differentiable, its
        backward :meth:`run_backward` (``autograd.py``): a fixed mask trains with its plan.
        ``precision="int8"`` / ``"int8-qk"``: an 8-bit forward (``tessera.attention``'s),
        forward only, for a plan of a regime with an 8-bit form (``tessera.INT8_REGIME``)."""
        name = gradient_recorded(q, k, v)
        if name is None or precision is not None:
            if name is not None:
                raise ValueError(f"precision={precision!r} is forward-only: {name} requires "
                                 "grad (detach it, or run under torch.no_grad())")
            return run_plan(self, q, k, v, scale=scale, return_lse=return_lse, out=out, lse=lse,
                            precision=precision)
        if out is not None or lse is not None:
            raise ValueError(f"{name} requires grad: a differentiable run makes its own out and "
                             "lse (pass neither, or run under torch.no_grad())")
        got = differentiable(
            lambda q_, k_, v_: run_plan(self, q_, k_, v_, scale=scale, return_lse=True),
            lambda q_, k_, v_, o, lse_, do: run_backward_plan(self, q_, k_, v_, o, lse_, do,
                                                              scale=scale),
            q, k, v)
        return got if return_lse else got[0]

    def backward_queues(self, block_m: int = 64, block_n: tuple[int, int] | None = None,
                        query_major: bool = True) -> BackwardQueues:
        """The backward pass's task queues of this plan's mask with ``block_m``-row tasks
        (``runtime.backward``; unless ``query_major``, the key-major one alone may be planned):
        planned at the first call (by the planner kernels without a synchronization where they
        apply, else on the host), then kept until the plan takes another mask."""
        return self._backward_plan().backward_queues(block_m, block_n, query_major)

    def backward_regime(self, arch: int | None, *, deterministic: bool = False,
                        portable: bool = False) -> BackwardRegime:
        """The backward regime this plan's mask runs on ``arch`` (the regime table's backward
        section, else the heuristic: ``regime.selection.select_backward_regime``), chosen once.
        A plan made by a request reads nothing of a device mask for it."""
        return self._backward_plan().backward_regime(arch, deterministic=deterministic,
                                                     portable=portable)

    def _backward_plan(self) -> BackwardPlan:
        if self._backward is None:
            shape = checked_shape(self.mask, self.num_q_heads, self.num_kv_heads, self.head_dim,
                                  self.head_dim_v, self.batch, self.dtype, self.layout)
            self._backward = BackwardPlan(self.mask, shape, self.launch_state,
                                          read_mask=self.mode is PlanMode.EXACT)
        return self._backward

    def run_backward(self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, *,
                     scale: float | None = None,
                     regime: BackwardRegime | None = None) -> tuple[Any, Any, Any]:
        """The gradients ``(dq, dk, dv)`` of this plan's attention for the output gradient
        ``dout``, from the forward's ``out`` and ``lse`` (``run(..., return_lse=True)``), on
        the GPU (``backward_launch.run_backward_plan``), each in q's type and layout.
        ``regime``: a :class:`~tessera.BackwardRegime` to run instead of the selected one
        (:meth:`backward_regime`)."""
        check_backward_regime_argument(regime)
        return run_backward_plan(self, q, k, v, out, lse, dout, scale=scale, regime=regime)


def _same_bounds(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (a.shape == b.shape and bool(np.array_equal(a, b)))


def plan(block_mask: BlockMask, *, num_q_heads: int, num_kv_heads: int | None = None,
         head_dim: int, head_dim_v: int | None = None, batch: int | None = None,
         dtype: Any = "bfloat16", layout: str = "bhld", regime: Regime | None = None,
         arch: int | None = None, mode: PlanMode | None = None) -> Plan:
    """Plan ``block_mask`` for attention with these heads, head dim and dtype.

    ``batch`` defaults to the mask's stored batch; ``regime`` to the one the regime table in
    force for ``arch`` gives, else the heuristic default (``tessera.runtime.regime``);
    ``arch=None`` with a device mask means the mask's device's. The plan's arrays live where
    the mask lives (numpy, or CuPy on the mask's device).

    ``mode`` (:class:`~tessera.runtime.mode.PlanMode`) says what the plan may do; by default
    ``EXACT``, or ``CAPTURE`` while CuPy's current stream is being captured into a CUDA graph:

    - ``EXACT``: a device mask's block count is read back (one scalar) where it decides the
      plan, as a host mask's is: at head dim 64 on large blocks (a dense layer takes 192-row
      tiles, a mask selecting ``ROWS128_MIN_DENSITY_D64`` of its blocks 128-row ones), and for
      a dense layer at head dim 128 (its tasks walked as whole spans, its exact queue read back
      once for its filled last wave); heavy tasks may split.
    - ``REQUEST`` (``tessera.attention``'s): a selected regime never splits heavy tasks nor
      merges rows -- both need the general task organization on the host, milliseconds a plan,
      more than the tail a split shortens where one is possible at all (``tasks.may_split``;
      docs/decisions.md) -- and a device mask's plan is sync-free.
    - ``CAPTURE``: nothing read back from the GPU: a device mask; a regime chosen without
      reading the mask (the one the last selection for this geometry and shapes found by
      reading a mask -- a warm-up request -- else the heuristic's) whose tasks never split nor
      merge rows (a selected one is made so; a given one must be); buffers sized by the
      geometry's bounds. ValueError when the mask or the regime cannot be planned so.
    """
    return _plan_on_its_device(block_mask, num_q_heads, num_kv_heads, head_dim, head_dim_v,
                               batch, dtype, layout, regime, arch, mode, None)


def plan_selected(block_mask: BlockMask, selection: tuple[Regime, bool], *, num_q_heads: int,
                  num_kv_heads: int, head_dim: int, batch: int, dtype: Any, layout: str,
                  arch: int | None) -> Plan:
    """:func:`plan` in ``REQUEST`` mode whose regime selection is made already: ``selection`` is
    :func:`~tessera.runtime.regime.selected_regime`'s answer, possibly read from an earlier mask
    of the geometry (``config.request_selection_refresh``), so the plan reads nothing back from
    the GPU for it."""
    return _plan_on_its_device(block_mask, num_q_heads, num_kv_heads, head_dim, None, batch,
                               dtype, layout, None, arch, PlanMode.REQUEST, selection)


def _plan_on_its_device(block_mask: BlockMask, num_q_heads: int, num_kv_heads: int | None,
                        head_dim: int, head_dim_v: int | None, batch: int | None, dtype: Any,
                        layout: str, regime: Regime | None, arch: int | None,
                        mode: PlanMode | None, selection: tuple[Regime, bool] | None) -> Plan:
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a tessera.BlockMask, got {type(block_mask).__name__}")
    if mode is not None and not isinstance(mode, PlanMode):
        raise TypeError(f"mode must be None or a tessera.PlanMode (EXACT, REQUEST, CAPTURE), got "
                        f"{mode!r}")
    shape = checked_shape(block_mask, num_q_heads, num_kv_heads, head_dim, head_dim_v, batch,
                           dtype, layout)
    check_arch(arch)
    with block_mask.device_context(), block_mask.reading():
        xp = block_mask.xp
        captured = xp is not np and stream_capturing(xp.cuda.get_current_stream().ptr)
        # A plan captured outside tessera.attention keeps its memory for the graph
        # (capture.capture_memory; inside a request the request's own applies: it nests).
        with capture_memory_if(captured, "cupy", block_mask.device_id):
            mode = mode or (PlanMode.CAPTURE if captured else PlanMode.EXACT)
            return _plan(block_mask, shape, mode, regime, arch, selection)


def checked_shape(mask: BlockMask, num_q_heads: int, num_kv_heads: int | None, head_dim: int,
                  head_dim_v: int | None, batch: int | None, dtype: Any,
                  layout: str) -> PlanShape:
    """The shape arguments checked, by name, before anything is planned."""
    num_kv_heads = num_q_heads if num_kv_heads is None else num_kv_heads
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    batch = mask.batch_heads[0] if batch is None else batch
    for name, val in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads),
                      ("head_dim", head_dim), ("head_dim_v", head_dim_v), ("batch", batch)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val <= 0:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if layout not in ("bhld", "blhd"):
        raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported (supported: "
                         f"{SUPPORTED_HEAD_DIMS})")
    if head_dim_v != head_dim:
        raise ValueError(f"head_dim_v must equal head_dim ({head_dim}): the kernels write "
                         f"head_dim values per row, got head_dim_v={head_dim_v}")
    if batch * num_q_heads > MAX_TASKS:
        # Every (batch, query head) pair is at least one task, and a launch takes at most
        # MAX_TASKS: a plan past it could never run.
        raise ValueError(f"batch x num_q_heads = {batch * num_q_heads} exceeds the "
                         f"{MAX_TASKS} tasks a launch takes: split the call by batch or heads")
    return PlanShape(int(batch), int(num_q_heads), int(num_kv_heads), int(head_dim),
                     checked_dtype(dtype), layout, mask.batch_index(batch),
                     mask.head_index(num_q_heads, num_kv_heads))


def _plan(mask: BlockMask, shape: PlanShape, mode: PlanMode, regime: Regime | None,
          arch: int | None, selection: tuple[Regime, bool] | None) -> Plan:
    """The pipeline, with the mask's device current: select the regime for the mode, map the
    logical blocks onto tiles and organize them into a task queue (on the device where the
    planner kernels can, else on the arrays), fill the last wave, make the Plan."""
    if mode.sync_free and not mapping.use_device_planner(mask.xp):
        raise ValueError("block_mask must be on the GPU for a sync-free plan (one made while a "
                         "CUDA graph is captured): a host mask is planned on the host")
    choice = regime_for_mode(mask, mode, regime=regime, selection=selection, arch=arch,
                             head_dim=shape.head_dim, dtype=shape.dtype,
                             num_q_heads=shape.num_q_heads, num_kv_heads=shape.num_kv_heads,
                             batch=shape.batch)
    done = _organize(mask, shape, mode, choice)
    p = Plan(mask=mask, regime=choice.regime, batch=shape.batch, num_q_heads=shape.num_q_heads,
             num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
             head_dim_v=shape.head_dim, dtype=shape.dtype, layout=shape.layout,
             launch_queue=done.launch_queue, in_flight=choice.in_flight,
             regime_by_geometry=choice.by_geometry, _exact=done.exact,
             device_plan=done.device_plan, mode=mode)
    p._planned()
    return p


def _organize(mask: BlockMask, shape: PlanShape, mode: PlanMode, choice: RegimeChoice
              ) -> Organized:
    """The first planner that applies and answers (``planners.PLANNERS``), then the last wave
    filled where the plan may cut tasks."""
    organized = next(o for planner in PLANNERS if planner.applies(mask, choice) and
                     (o := planner.organize(mask, shape, mode, choice)) is not None)
    regime = choice.regime
    # A request of a selected regime leaves a device planner's queue whole, as it splits
    # nothing: the cut would copy the queue back to the host and sort it, every request.
    cuts = mode is not PlanMode.REQUEST or choice.given or not organized.by_kernels
    if (organized.device_plan is not None or not cuts or regime.pack_keys
            or regime.split_ratio >= NEVER_SPLIT_RATIO):
        return organized
    # Equal tasks whose last wave would run part-full end sooner cut into parts.
    # (A device planner's queue here synchronized already: its costs are read back.)
    tiles, queue = organized.exact
    hp = queue.heads_per_task

    def groups(tasks: np.ndarray) -> np.ndarray:
        return task_groups(tasks, shape.batch, shape.num_q_heads, shape.num_kv_heads, hp,
                           shape.batch_of, shape.head_of, mask.batch_heads[1])

    queue = fill_last_wave(queue, groups, regime.block_n, choice.in_flight,
                           regime.min_split_chunks)
    return Organized(queue, (tiles, queue), None, organized.by_kernels)
