"""The regime a plan takes, final for its :class:`~tessera.runtime.mode.PlanMode`: the one given,
or the selection's answer (``selection.py``) made what the mode allows -- a dense host layer's
whole-span walk where the plan may count blocks, never a split or a merged row where it may
not read the mask's totals back. Nothing downstream rewrites it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..mode import PlanMode
from ..tasks import NEVER_SPLIT_RATIO
from .heuristic import selects_every_block
from .selection import selected_regime, whole_span_pick
from .slots import plan_may_split, plan_tasks_in_flight
from .value import Regime

__all__ = ["RegimeChoice", "regime_for_mode"]


@dataclass(frozen=True)
class RegimeChoice:
    """A plan's regime and what was decided with it.

    Attributes:
        regime: the regime the plan runs.
        by_geometry: whether every mask of this geometry gets it (given, or selected without
            reading the selection): a replan for another such mask gives what a new plan would.
        given: the caller named it (it is checked, never changed).
        in_flight: tasks the GPU runs at once (0: unknown), which the split rule counts.
        allow_split: whether the plan may split heavy tasks.
    """

    regime: Regime
    by_geometry: bool
    given: bool
    in_flight: int
    allow_split: bool


def regime_for_mode(mask: Any, mode: PlanMode, *, regime: Any, selection: Any, arch: int | None,
                    head_dim: int, dtype: str, num_q_heads: int, num_kv_heads: int,
                    batch: int) -> RegimeChoice:
    """The final regime of a plan of ``mask`` in ``mode``: ``regime`` when given (checked),
    else ``selection`` (an answer of :func:`selected_regime` made already), else the
    selection's answer now. ValueError or TypeError naming what cannot be planned so."""
    given = regime is not None
    if given:
        by_geometry = True
    elif selection is not None:
        regime, by_geometry = selection
    else:  # the table in force for arch, else the heuristic (runtime/regime/)
        regime, by_geometry = selected_regime(
            mask, arch=arch, head_dim=head_dim, dtype=dtype, num_q_heads=num_q_heads,
            batch=batch, num_kv_heads=num_kv_heads, read_mask=mode.reads_mask,
            count_blocks=mode.counts_blocks)
    if not isinstance(regime, Regime):
        raise TypeError(f"regime must be a tessera Regime, got {type(regime).__name__}")
    if arch is not None and not regime.runs_on(arch):
        raise ValueError(f"regime {regime.name} runs on sm_90 GPUs only; arch={arch} was asked "
                         "for (plan with arch=90, or an sm80 regime)")
    if not given and not mode.sync_free:
        # A dense host mask's tasks are whole spans, which its kernel walks by arithmetic.
        picked = whole_span_pick(regime, mask, head_dim, mode.counts_blocks)
        if picked is not regime:
            regime, by_geometry = picked, False
    elif regime.whole_spans:
        _check_whole_spans(regime, mask, mode)
    # Planning for the current GPU (a device mask, or its architecture named): the split rule
    # may count the tasks it runs at once; a portable host plan (arch None) does not.
    in_flight = plan_tasks_in_flight(regime, mask, head_dim, arch, dtype == "bfloat16")
    allow_split = plan_may_split(regime, mask, num_q_heads=num_q_heads,
                                 num_kv_heads=num_kv_heads, batch=batch, in_flight=in_flight)
    if (mode.sync_free or not mode.splits and not given) and (
            allow_split or regime.combine_threshold):
        # Splitting needs the mask's totals on the host, restricted merges the general planner.
        if given:
            raise ValueError(f"regime {regime.name} may split tasks or merge rows, which reads "
                             "the mask back; a sync-free plan needs "
                             f"regime.with_(split_ratio={NEVER_SPLIT_RATIO:g}, "
                             "combine_threshold=0.0)")
        regime = regime.with_(split_ratio=NEVER_SPLIT_RATIO, combine_threshold=0.0)
        allow_split = False
    return RegimeChoice(regime, by_geometry, given, in_flight, allow_split)


def _check_whole_spans(regime: Regime, mask: Any, mode: PlanMode) -> None:
    """A whole-span regime walks every task as one span over all its rows: true of a mask that
    selects every block (tests/runtime/test_plan.py), and of no other in general."""
    if mode.sync_free:
        raise ValueError(f"regime {regime.name} needs the mask's block count, a readback a "
                         "sync-free plan cannot make; use regime.with_(whole_spans=False)")
    if not selects_every_block(mask):
        raise ValueError(f"regime {regime.name} runs masks that select every block only; "
                         f"this one selects {mask.nnz} of "
                         f"{int(np.prod(mask.shape, dtype=np.int64))}")
