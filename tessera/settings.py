"""Process-wide switches of the GPU path, in one documented object: ``tessera.config``.

Each switch is read at every launch or request, so a change applies to the next call. Tests and
benchmarks change them for a while with :meth:`Settings.override`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any, Iterator

import numpy as np

__all__ = ["Settings", "config"]


# The integer switches and their least values; those that also take None.
_INT_MINIMA = {"persistent_grid_cap": 0, "request_plans_kept": 0, "request_selection_refresh": 1}
_NONE_ALLOWED = {"persistent_grid_cap"}


@dataclass
class Settings:
    """Switches of the launch path.

    Attributes:
        poison_outputs: fill every output Tessera allocates with NaN before the kernels run, so
            a test can prove that each element was written (a memset per call; off in use).
        persistent_grid_cap: most CTAs a persistent kernel is launched with (None: as many as
            the GPU holds at once; 0: one per task, i.e. not persistent). Tests set it low so
            that a small mask's tasks queue up behind few CTAs, each running several.
        use_tma: the producer variant copies K/V (and the Hopper backward its chunks) by TMA
            wherever the operands allow; False keeps every launch on cp.async (an A/B switch
            for benchmarks and tests).
        portable_backward: the backward pass runs the portable kernels (sm80/bwd_*.cu) on sm_90
            GPUs too, instead of the Hopper ones (an A/B switch for benchmarks and tests).
        deterministic_backward: the backward pass computes dQ in a pass of its own, each row
            by one task (no floating-point atomics: bitwise repeatable). False (the default):
            the Hopper kernels of 128-row tasks sum it by float32 atomics during the dK/dV pass
            instead -- five matrix products a pair, not seven: on the H100 as fast or faster
            (up to 1.2x at head dim 64) -- and the sum's order varies between runs
            (docs/decisions.md, "Backward"). The 64-row tasks of small-block masks and the
            portable kernels always take the two passes.
        request_plans_kept: sync-free plans ``tessera.attention`` keeps for the next request of
            the same geometry, shapes and stream (least recently used dropped first); 0 plans
            every request anew.
        request_selection_refresh: a request whose regime selection reads the mask (ragged
            geometries, whose aligned-tile and packed-walk rules count the mask's pairs and
            chunks; a regime table's lookup) reads it -- a synchronization -- on every
            ``request_selection_refresh``-th request of its geometry, shapes and stream; the
            others take the last answer read and plan without waiting for the GPU. 1 reads on
            every request. The choice of regime changes the speed, never the result.
    """

    poison_outputs: bool = False
    persistent_grid_cap: int | None = None
    use_tma: bool = True
    portable_backward: bool = False
    deterministic_backward: bool = False
    request_plans_kept: int = 8
    request_selection_refresh: int = 16

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in {f.name for f in fields(self)}:
            raise AttributeError(f"tessera.config has no setting {name!r} (settings: "
                                 f"{', '.join(f.name for f in fields(self))})")
        if name in ("poison_outputs", "use_tma", "portable_backward", "deterministic_backward"):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"config.{name} must be True or False, got {value!r}")
            value = bool(value)
        if name in _INT_MINIMA and not (name in _NONE_ALLOWED and value is None):
            if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
                    or value < _INT_MINIMA[name]):
                none = "None or " if name in _NONE_ALLOWED else ""
                raise ValueError(f"config.{name} must be {none}an int >= "
                                 f"{_INT_MINIMA[name]}, got {value!r}")
            value = int(value)
        object.__setattr__(self, name, value)

    @contextlib.contextmanager
    def override(self, **changes: Any) -> Iterator["Settings"]:
        """Change some switches for the duration of a ``with`` block, then restore them."""
        names = [f.name for f in fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise TypeError(f"config.override got unknown settings {unknown} (settings: "
                            f"{', '.join(names)})")
        old = {name: getattr(self, name) for name in changes}
        try:
            for name, value in changes.items():
                setattr(self, name, value)
            yield self
        finally:
            for name, value in old.items():
                setattr(self, name, value)


config = Settings()
