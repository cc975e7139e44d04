"""The planners: what turns a logical mask and its regime into physical tiles and a task
queue. Both answer the same question (:class:`Planner`) and give the same arrays for the same
mask (tested array for array):

- :class:`DevicePlanner`: a device mask without restricted merges, by the planner kernels
  (``device_planner.py``) -- sync-free (the task count stays on the device, buffers sized by
  the geometry) when no task may split, else after one synchronization;
- :class:`ArrayPlanner`: any mask, by array operations in the mask's array module (numpy or
  CuPy): the physical mapping (``mapping.map_to_tiles``), then the task organization
  (``tasks.build_task_queue``).

``plan.py`` asks the device planner first where it applies and the array planner otherwise.

Both take a :class:`~tessera.runtime.mode.Direction`: query-major tiles (the forward pass) or
key-major ones (the backward pass's dK and dV), which are the query-major tiles of the mask's
transpose for the shape with one query head a task (:func:`oriented`): one pipeline, two
directions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from ..launch import AttentionShape
from ..mask import BlockMask
from . import mapping
from .device_planner import SyncFreePlan, plan_on_device
from .mapping import PhysicalTiles, map_to_tiles, selects_every_block
from .mode import Direction, PlanMode
from .queue import TaskQueue
from .regime.choice import RegimeChoice
from .tasks import build_task_queue

__all__ = ["PlanShape", "Organized", "Planner", "DevicePlanner", "ArrayPlanner", "PLANNERS",
           "oriented"]


@dataclass(frozen=True)
class PlanShape(AttentionShape):
    """The attention shape a plan is for, checked, and which stored mask batch and head each
    (batch, query head) reads."""

    batch_of: np.ndarray
    head_of: np.ndarray

    def for_direction(self, direction: Direction) -> "PlanShape":
        """The shape tasks are organized for in ``direction``: key-major tasks hold one query
        head each -- a kv head's dK and dV sum its group's query heads, which read different
        masks -- each still reading its own stored mask head (``head_of``)."""
        if direction is Direction.QUERY_MAJOR:
            return self
        return replace(self, num_kv_heads=self.num_q_heads)


@dataclass
class Organized:
    """A planner's answer.

    Attributes:
        launch_queue: the queue the kernels read (a sync-free plan's bounded buffers with the
            task count on the device, else the exact queue).
        exact: ``(tiles, queue)``, or for a sync-free plan the callable that cuts them from its
            buffers (one small copy, which waits for the planner's kernels).
        device_plan: the sync-free plan (None for exact arrays).
        by_kernels: the planner kernels made it (a request then leaves the queue whole).
    """

    launch_queue: TaskQueue
    exact: Any
    device_plan: SyncFreePlan | None
    by_kernels: bool

    @property
    def tiles(self) -> PhysicalTiles:
        return self.exact[0]


class Planner(Protocol):
    """Physical mapping and task organization of ``mask`` for ``choice``'s regime in ``mode``,
    in ``direction``; None when this planner cannot take the mask (the next one does)."""

    def applies(self, mask: BlockMask, choice: RegimeChoice) -> bool: ...

    def organize(self, mask: BlockMask, shape: PlanShape, mode: PlanMode, choice: RegimeChoice,
                 direction: Direction = Direction.QUERY_MAJOR) -> Organized | None: ...


def oriented(mask: BlockMask, shape: PlanShape,
             direction: Direction) -> tuple[BlockMask, PlanShape]:
    """The mask and shape a planner maps for ``direction``. Query-major: as given. Key-major:
    the mask's transpose (tile rows are key tokens, spans query ranges) and the shape's
    key-major tasks (:meth:`PlanShape.for_direction`)."""
    if direction is Direction.QUERY_MAJOR:
        return mask, shape
    return mask.transposed(), shape.for_direction(direction)


def _tile_rows(mask: BlockMask, shape: PlanShape, choice: RegimeChoice) -> tuple[int, int]:
    """(query heads a task packs, rows of each of them a tile holds)."""
    hp = choice.regime.heads_per_task(mask.batch_heads[1], shape.num_q_heads,
                                      shape.num_kv_heads)
    return hp, choice.regime.block_m // hp


class DevicePlanner:
    """The planner kernels, on a device mask whose regime merges no rows."""

    def applies(self, mask: BlockMask, choice: RegimeChoice) -> bool:
        return mapping.use_device_planner(mask.xp) and choice.regime.combine_threshold == 0

    def organize(self, mask: BlockMask, shape: PlanShape, mode: PlanMode, choice: RegimeChoice,
                 direction: Direction = Direction.QUERY_MAJOR) -> Organized | None:
        regime = choice.regime
        mask, shape = oriented(mask, shape, direction)
        hp, tile_rows = _tile_rows(mask, shape, choice)
        fused = plan_on_device(mask, tile_rows=tile_rows, block_n=regime.block_n,
                               heads_per_task=hp, batch=shape.batch,
                               num_q_heads=shape.num_q_heads, num_kv_heads=shape.num_kv_heads,
                               batch_of=shape.batch_of, head_of=shape.head_of,
                               split_ratio=regime.split_ratio,
                               min_split_chunks=regime.min_split_chunks,
                               in_flight=choice.in_flight, allow_split=choice.allow_split,
                               pack_keys=regime.pack_keys, align_tiles=regime.align_tiles,
                               require_sync_free=mode.sync_free)
        if fused is None:  # the dense rows would be too large: the array planner's
            return None
        if (isinstance(fused, SyncFreePlan) and mode.counts_blocks and not choice.given
                and (regime.whole_spans or regime.block_m == 192)
                and selects_every_block(mask)):
            # A dense device layer planned exactly (its count read for the regime already):
            # its exact queue (one copy) takes the filled last wave, as a host plan's does.
            fused = fused.settle()
        if isinstance(fused, SyncFreePlan):
            return Organized(fused.launch_queue(), fused.settle, fused, True)
        return Organized(fused[1], fused, None, True)


class ArrayPlanner:
    """Array operations in the mask's module: any mask, any regime."""

    def applies(self, mask: BlockMask, choice: RegimeChoice) -> bool:
        return True

    def organize(self, mask: BlockMask, shape: PlanShape, mode: PlanMode, choice: RegimeChoice,
                 direction: Direction = Direction.QUERY_MAJOR) -> Organized:
        regime = choice.regime
        mask, shape = oriented(mask, shape, direction)
        hp, tile_rows = _tile_rows(mask, shape, choice)
        tiles = map_to_tiles(mask, tile_rows, regime.block_n, regime.combine_threshold,
                             regime.pack_keys, regime.align_tiles)
        queue = build_task_queue(tiles, batch=shape.batch, num_q_heads=shape.num_q_heads,
                                 num_kv_heads=shape.num_kv_heads, heads_per_task=hp,
                                 batch_of=shape.batch_of, head_of=shape.head_of,
                                 mask_batch_heads=mask.batch_heads,
                                 split_ratio=regime.split_ratio,
                                 min_split_chunks=regime.min_split_chunks,
                                 in_flight=choice.in_flight, allow_split=choice.allow_split)
        return Organized(queue, (tiles, queue), None, False)


# In the order they are asked: the first that applies and answers plans the mask.
PLANNERS: tuple[Planner, ...] = (DevicePlanner(), ArrayPlanner())
