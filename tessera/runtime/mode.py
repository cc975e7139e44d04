"""What a plan may do, as one value: :class:`PlanMode`; and which way its tiles run:
:class:`Direction`.

Planning trades host work and waits for the GPU against a better queue. The three callers want
three different trades, and each reads its whole policy off its mode instead of a set of flags:

- ``EXACT`` (``tessera.plan``): a plan made once and run many times. It may read the mask back
  (its block count decides a dense layer's walk and the head-dim-64 tile rows), split heavy
  tasks and fill the last wave.
- ``REQUEST`` (``tessera.attention``): a new mask every call. It never splits (the split needs
  the mask's totals on the host, milliseconds a plan) nor counts a device mask's blocks, so a
  device mask is planned without waiting for the GPU.
- ``CAPTURE`` (inside a CUDA-graph capture): nothing read back at all -- a device mask, a regime
  chosen from the geometry, buffers sized by the geometry's bounds.
"""

from __future__ import annotations

import enum

__all__ = ["PlanMode", "Direction"]


class PlanMode(enum.Enum):
    """What a plan may do (see the module docstring)."""

    EXACT = "exact"
    REQUEST = "request"
    CAPTURE = "capture"

    @property
    def reads_mask(self) -> bool:
        """Whether the regime selection may read the mask back (a synchronization)."""
        return self is not PlanMode.CAPTURE

    @property
    def counts_blocks(self) -> bool:
        """Whether a device mask's blocks may be counted (a scalar read back) for the rules that
        rest on the count, as a host mask's always are."""
        return self is PlanMode.EXACT

    @property
    def splits(self) -> bool:
        """Whether a selected regime may split heavy tasks or merge rows (host work)."""
        return self is PlanMode.EXACT

    @property
    def sync_free(self) -> bool:
        """Whether the plan must read nothing back from the GPU."""
        return self is PlanMode.CAPTURE


class Direction(enum.Enum):
    """Which side of the mask a plan's physical tiles hold.

    - ``QUERY_MAJOR``: tiles of query rows, each walking the key spans its rows select (the
      forward pass, and the backward pass's dQ).
    - ``KEY_MAJOR``: tiles of key rows, each walking the query spans that select them -- the
      mask's transpose (the backward pass's dK and dV). A task then holds one query head's rows
      of a key tile; the query heads of a kv head's group are summed after (GQA).

    A parameter of the planners (``planners.Planner``): the key-major plan of a mask is the
    query-major plan of its transpose, for the shape with queries and keys exchanged.
    """

    QUERY_MAJOR = "query-major"
    KEY_MAJOR = "key-major"
