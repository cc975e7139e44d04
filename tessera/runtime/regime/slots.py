"""Task slots: how many of a regime's tasks a GPU runs at once, whether its kernel fits the GPU's
shared memory, and whether a plan may split tasks at all (the split rule counts the slots)."""

from __future__ import annotations

import functools
from typing import Any

from ...cuda import device, loader
from ...cuda.device import smem_limit_bytes
from ...cuda.variants import smem_bytes
from ..tasks import may_split, tasks_lower_bound
from .value import Regime

__all__ = ["regime_fits", "tasks_in_flight", "plan_tasks_in_flight", "plan_may_split"]


def regime_fits(regime: Regime, head_dim: int, arch: int | None) -> bool:
    """Whether ``regime``'s kernel variants (its TMA form too, where it has one: rings hold more
    than one CTA's tiles) need no more shared memory than ``arch`` allows."""
    forms = (False, True) if regime.tma_capable else (False,)
    return all(smem_bytes(regime.variant(head_dim, tma=tma)) <= smem_limit_bytes(arch)
               for tma in forms)


@functools.lru_cache(maxsize=256)  # on every plan for the current GPU: cache the arithmetic
def tasks_in_flight(regime: Regime, head_dim: int, arch: int | None, sm_count: int) -> int:
    """How many of ``regime``'s tasks a GPU with ``sm_count`` SMs of ``arch`` runs at once.

    An estimate from shared memory (each resident CTA also takes 1 KiB the driver reserves),
    threads (2048 per SM) and, for the persistent sm90 variant, the register file (split for
    ``min_blocks`` CTAs), of the regime's cp.async form (a TMA form's third CTA or rings are
    left out); the split rule (``tasks.split_limit``) only needs the right order of magnitude.
    """

    v = regime.variant(head_dim)
    per_sm_smem = smem_limit_bytes(arch) + 1024
    by_smem = per_sm_smem // (smem_bytes(v) + 1024)
    by_regs = v.min_blocks if v.persistent else by_smem
    return int(sm_count * max(1, min(by_smem, by_regs, 2048 // v.threads)))


def plan_tasks_in_flight(regime: Regime, mask: Any, head_dim: int, arch: int | None,
                         bf16: bool = True) -> int:
    """The task slots ``tessera.plan``'s split rule counts for ``regime``'s plan of ``mask``:
    the current GPU's when the plan is for it (a device mask, or its architecture named), else
    0 (a portable host plan, for whatever GPU runs it)."""
    here = device.device_arch()
    if here is not None and (mask.on_device or arch == here):
        return _device_tasks_in_flight(regime, head_dim, bf16, here, device.device_sm_count())
    return 0


@functools.lru_cache(maxsize=256)
def _device_tasks_in_flight(regime: Regime, head_dim: int, bf16: bool, arch: int,
                            sm_count: int) -> int:
    """:func:`tasks_in_flight` on the current GPU, exact for one-task CTAs: the driver's
    occupancy of the compiled variant, which counts the registers the estimate leaves out (the
    portable family's 128-row tiles hold ~230-255 registers a thread: two CTAs an SM where
    shared memory alone would allow four at head dim 64). Overcounting slots would keep
    ``tasks.may_split`` from ruling splits out, and the planner would then synchronize on
    every request. Persistent variants size their own grid: the estimate is exact there; a
    variant over the GPU's shared-memory limit is not loaded here (its launch refuses it with
    the numbers)."""
    variant = regime.variant(head_dim, bf16)
    if variant.persistent or not regime_fits(regime, head_dim, arch):
        return tasks_in_flight(regime, head_dim, arch, sm_count)

    return sm_count * min(loader.blocks_per_sm(variant), 2048 // variant.threads)


def plan_may_split(regime: Regime, mask: Any, *, num_q_heads: int, num_kv_heads: int,
                   batch: int, in_flight: int) -> bool:
    """``tasks.may_split`` for ``regime``'s plan of ``mask`` (the one place the planner, the
    regime selection and the profiler ask it): the fewest tasks its GQA packing and tile rows
    can give, against ``in_flight`` task slots."""

    if regime.pack_keys:  # packed chunks are not cut (tasks._cut_parts cuts span by span)
        return False
    hp = regime.heads_per_task(mask.batch_heads[1], num_q_heads, num_kv_heads)
    bound = tasks_lower_bound(batch, num_q_heads, hp, mask.seq_len_q, regime.block_m // hp)
    return may_split(regime.split_ratio, bound, in_flight)
