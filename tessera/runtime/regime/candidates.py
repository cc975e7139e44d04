"""The regimes the offline profiler measures on a GPU (the space a regime table chooses from)."""

from __future__ import annotations

from typing import Sequence

from ...cuda.variants import has_wide_step
from .heuristic import sm90_warps
from .slots import regime_fits
from .value import Regime

__all__ = ["candidate_regimes"]


# The space the profiler measures: 2 x 2 x 3 x 2 = 24 sm80 regimes; on sm_90 the sm90 family's
# tile shapes in the same policies, and their packed-key and aligned-tile forms.
CANDIDATE_BLOCK_M = (64, 128)


CANDIDATE_BLOCK_N = (32, 64)


CANDIDATE_SPLIT_RATIO = (2.0, 4.0, 1e9)  # 1e9: never split


CANDIDATE_COMBINE = (0.0, 0.3)


CANDIDATE_WARPS = 4


CANDIDATE_SM90_BLOCK_N = (64, 128)


# sm_90 tile rows: 64 and 128 at every head dim; 192 (three consumer warpgroups, 128 keys a step)
# at head dim 64, the only one whose accumulators leave the producer its registers.
CANDIDATE_SM90_BLOCK_M = {64: (64, 128, 192)}


def _sm90_shapes(head_dim: int) -> list[tuple[int, int]]:
    rows = CANDIDATE_SM90_BLOCK_M.get(head_dim, CANDIDATE_BLOCK_M)
    return [(bm, bn) for bm in rows for bn in CANDIDATE_SM90_BLOCK_N
            if bm != 192 or bn == 128]


def candidate_regimes(head_dim: int, arch: int | None,
                      kernel_families: Sequence[str] | None = None,
                      combine_thresholds: Sequence[float] | None = None) -> list[Regime]:
    """The regimes worth profiling for ``head_dim`` on compute capability ``arch`` (only those
    of ``kernel_families``, e.g. ``("sm90",)``, and of ``combine_thresholds``, e.g. ``(0.0,)``,
    when given).

    The sm80 family with 4 warps: 64- or 128-row tiles (16 or 32 rows a warp, the two shapes the
    kernel supports at 4 warps), 32 or 64 keys a step, double buffered; on sm_90 also the sm90
    family, 64-row tiles on one warpgroup (with a producer warpgroup at head dims 64 and 128),
    128-row tiles warp-specialized and, at head dim 64, 192-row tiles
    with 128-key steps, 64 or 128 keys a step, three stages. Each tile shape with split policy
    2x or 4x the mean task, or never (1e9), and combine threshold 0 (merge only identical key
    sets) or 0.3. The sm90 shapes also in the two forms the heuristic's selection takes for
    ragged geometries (combine threshold 0): the packed key walk (``pack_keys``; its plans never
    split, so one split policy, the default) and, for 128-row tiles, aligned tiles
    (``align_tiles``, each split policy); at head dim 64 the 128x128 tiles also with 192-key
    steps (``wide_steps``, combine threshold 0, each split policy). Variants whose shared
    memory exceeds ``arch``'s per-CTA limit are left out. The order is stable (tile shape, then
    form, then split, then combine), so names index the list reproducibly.
    """
    shapes = [dict(block_m=bm, block_n=bn, num_warps=CANDIDATE_WARPS)
              for bm in CANDIDATE_BLOCK_M for bn in CANDIDATE_BLOCK_N]
    if arch == 90:
        # 64-row tiles plain (one warpgroup) -- with a producer warpgroup, two CTAs an SM or (64x64
        # at head dim 64) four rings a CTA, as default_regime takes them at head dims 64 and
        # 128 --, 128- and 192-row tiles
        # warp-specialized (the plain 128-row variant was slower on every swept
        # mask: docs/decisions.md).
        shapes += [dict(family="sm90", block_m=bm, block_n=bn,
                        num_warps=sm90_warps(bm, bn, head_dim))
                   for bm, bn in _sm90_shapes(head_dim)]
        if sm90_warps(64, 64, head_dim) > 8:
            # The rings' one-ring form too (three CTAs an SM), which the heuristic takes where
            # tasks are too few for rings (one_ring_where_few_tasks). Not packed: a packed walk
            # runs one ring a CTA already, the rings' packed form's kernel.
            shapes.append(dict(family="sm90", block_m=64, block_n=64, num_warps=8,
                               packed_form=False))
    out = []
    for shape in shapes:
        packed_form = shape.pop("packed_form", True)
        sm90 = shape.get("family") == "sm90"
        stages = 3 if sm90 else 2
        forms = [dict(split_ratio=split, combine_threshold=comb)
                 for split in CANDIDATE_SPLIT_RATIO for comb in CANDIDATE_COMBINE]
        if sm90:
            if packed_form:
                forms.append(dict(combine_threshold=0.0, pack_keys=True))
            if shape["block_m"] == 128:
                forms += [dict(split_ratio=split, combine_threshold=0.0, align_tiles=True)
                          for split in CANDIDATE_SPLIT_RATIO]
            # The variants with the 192-key step (128x128 producer tiles at head dim 64): dense
            # masks ~3% faster, random ones slower, so a table learns where it pays.
            if has_wide_step(shape["block_m"], shape["block_n"], head_dim):
                forms += [dict(split_ratio=split, combine_threshold=0.0, wide_steps=True)
                          for split in CANDIDATE_SPLIT_RATIO]
        for form in forms:
            r = Regime(**shape, stages=stages, **form)
            if (regime_fits(r, head_dim, arch)
                    and (kernel_families is None or r.family in kernel_families)
                    and (combine_thresholds is None
                         or r.combine_threshold in combine_thresholds)):
                out.append(r)
    return out
