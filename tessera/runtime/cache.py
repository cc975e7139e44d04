"""Plans kept between requests: a model's layers ask for the same few geometries again and
again, with a new mask each time, and a kept sync-free plan replans a new mask into its own
buffers (``Plan.replan``) instead of planning anew.

A :class:`PlanCache` keeps plans under a key, least recently used first out: a
:class:`RequestKey` -- everything a new plan would read besides the mask's selection -- for a
request's mask, made anew every call; a :class:`FixedMaskKey` -- the mask itself and the
shapes -- for a mask that stays (a layer's fixed pattern), planned once and then only run. It
also counts, per request key whose regime selection reads the mask, the requests since it last
read one. ``tessera.attention`` owns one, bounded by ``tessera.config.request_plans_kept``; the
diffusers session keeps its fixed masks' plans in another, bounded by the layers it routes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from ..settings import config
from .plan import Plan

__all__ = ["RequestKey", "FixedMaskKey", "PlanCache"]


@dataclass(frozen=True)
class RequestKey:
    """What a request's new plan would read besides the selection: the device and stream it is
    planned and launched on, the regime given (or the table and generation that select one),
    the attention ``shapes`` (batch, query heads, kv heads, head dim, dtype, layout) and the
    mask's geometry. ``selected``: the regime the selection read from a mask, for geometries
    whose selection reads the mask (plans are kept per answer)."""

    device: int
    stream: int
    regime: Any
    selection_generation: int
    table_env: str | None
    shapes: tuple[int, int, int, int, str, str]
    batch_heads: tuple[int, int]
    q_bounds: bytes
    kv_bounds: bytes
    selected: Any = None

    def with_selection(self, regime: Any) -> "RequestKey":
        """The key of the plan kept for the selection's answer ``regime``."""
        return replace(self, selected=regime)


@dataclass(frozen=True)
class FixedMaskKey:
    """A fixed mask's plan: the mask (by identity: a kept plan holds it, so its id is not
    reused while the plan is kept) and the attention ``shapes`` (batch, query heads, kv heads,
    head dim, dtype, layout) on a ``device``."""

    mask_id: int
    shapes: tuple[int, int, int, int, str, str]
    device: int


class PlanCache:
    """Plans kept per key (:class:`RequestKey` or :class:`FixedMaskKey`), at most ``capacity``
    (None: ``config.request_plans_kept``, read at each :meth:`keep`), least recently used
    dropped first, and the selection reads per request key. A plan is taken out while its
    request plans and launches (:meth:`take`) and put back after (:meth:`keep`): a concurrent
    request of the same key, from another thread, makes a plan of its own."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                     or capacity < 0):
            raise ValueError(f"capacity must be None or an int >= 0, got {capacity!r}")
        self.capacity = capacity
        self._plans: OrderedDict[RequestKey | FixedMaskKey, Plan] = OrderedDict()
        self._reads: dict[RequestKey, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._plans)

    def keys(self) -> list[RequestKey | FixedMaskKey]:
        """The keys of the kept plans, least recently used first."""
        with self._lock:
            return list(self._plans)

    def plans(self) -> list[Plan]:
        """The kept plans, least recently used first."""
        with self._lock:
            return list(self._plans.values())

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._reads.clear()

    def take(self, key: RequestKey | FixedMaskKey) -> Plan | None:
        """The plan kept under ``key``, taken out of the cache (None: none kept)."""
        with self._lock:
            return self._plans.pop(key, None)

    def keep(self, key: RequestKey | FixedMaskKey, plan: Plan) -> None:
        """Keep ``plan`` under ``key`` as the most recently used, dropping the least recently
        used beyond the capacity."""
        limit = config.request_plans_kept if self.capacity is None else self.capacity
        with self._lock:
            self._plans[key] = plan
            self._plans.move_to_end(key)
            while len(self._plans) > limit:
                self._plans.popitem(last=False)
            if len(self._reads) > 4 * limit:
                self._reads.clear()  # geometries long gone (a bound, not an LRU)

    def reads_since(self, key: RequestKey) -> int | None:
        """Requests of ``key`` since its selection last read a mask (None: its selection never
        read one: it answers from the geometry alone)."""
        with self._lock:
            return self._reads.get(key)

    def note_reads(self, key: RequestKey, since: int) -> None:
        """Record that ``since`` requests of ``key`` passed since its selection read a mask."""
        with self._lock:
            self._reads[key] = since
