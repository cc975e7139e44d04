"""The offline regime profiler: ``python -m tessera profile`` writes ``tables/<gpu>.json``.

It builds a corpus of masks (the :mod:`tessera.families` masks at the WORKLOADS shapes and two
short clips of them, with few heads to keep the runs short or the models' own head counts, plus
random masks at several densities), computes each mask's
:class:`~tessera.runtime.regime.MaskFeatures`, times every candidate regime on it (kernel and
planning) and keeps, per feature key, the regime that was fastest relative to each mask's best
(the oracle). The table is rewritten, with its provenance, after every mask, so an interrupted
run loses at most one mask, and ``--resume`` continues where it stopped.

The GPU part is only :func:`gpu_timer` and :func:`gpu_environment`; everything else (corpus,
bookkeeping, merging, resume, budget) takes the timer as an argument and is tested on the CPU
with a fake one.

Entry fields written beside the required ``features``/``regime``/``ms``/``oracle_ms``:
``key``; ``name`` (the regime's); ``objective`` (``request``: kernel + planning time, or
``kernel``); ``kernel_ms``/``plan_ms`` of the chosen regime; ``default``/``default_ms``: the
regime plans take without a table (the heuristic and its mask-reading rules, for the latest
mask merged) and its mean time; ``masks``: labels of the corpus masks merged into the entry
(``measures``: their raw density, imbalance, ...);
``candidates``: per regime name, mean ``ms``, ``kernel_ms``, ``plan_ms`` and ``rel`` (time /
the mask's best time) over those masks.

Resuming is by mask: a case whose label the table already records is skipped (without
building its mask); a new case whose features fall on an existing key is merged into it.
``ms`` and ``oracle_ms`` are means over the entry's masks: ``ms`` of the chosen regime,
``oracle_ms`` of each mask's own best, so ``ms / oracle_ms`` is what bucketing costs.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence, TextIO

import numpy as np

from ..distribution import install_hint
from .. import __version__
from ..api import attention_backward
from .. import families as mask_families
from .._array import cupy_or_none
from ..cuda.device import current_gpu_name, device_cc, device_sm_count
from ..cuda.loader import nvrtc_version
from ..runtime.plan import plan as make_plan
from ..runtime.regime import (
    TABLES_DIR,
    MaskFeatures,
    MaskMeasures,
    Regime,
    RegimeTable,
    align_pays,
    candidate_regimes,
    features_from_measures,
    gpu_slug,
    heuristic_choice,
    mask_measures,
    pack_pays,
    plan_may_split,
    planned_pick,
    regime_from_name,
    ring_rule_sm_count,
    tasks_in_flight,
    write_json_atomic,
)
from ..runtime.regime.backward import candidate_backward_regimes, default_backward_regime
from ..runtime.regime.candidates import CANDIDATE_SPLIT_RATIO
from ..runtime.regime.heuristic import typical_q_block
from ..runtime.tasks import NEVER_SPLIT_RATIO
from .args import positive_float, positive_int
from .timing import cuda_time_ms
from .workloads import FAMILIES, WORKLOADS, Workload, example_mask

__all__ = ["Case", "Timing", "ProfileResult", "ProfilerUnavailable", "build_corpus",
           "build_heldout_corpus", "merge_entry", "profile", "evaluate", "rescore_evaluation",
           "summarize_evaluation",
           "gpu_timer", "gpu_backward_timer", "gpu_environment", "DENSITIES",
           "SMALL_BLOCK_DENSITIES", "VARIABLE_DENSITIES", "VARIABLE_SIZES", "TEXTLESS_DENSITIES"]

# Random masks per shape: 128-token blocks at these densities, 64-token blocks and variable
# blocks (VARIABLE_SIZES: the geometry packed keys and aligned tiles are for) at the others.
DENSITIES = (0.03, 0.10, 0.20, 0.45, 0.80)
SMALL_BLOCK_DENSITIES = (0.10, 0.30)
VARIABLE_DENSITIES = (0.10, 0.30)
# Shapes with text tokens make their masks' geometry variable (a text block of its own); their
# random masks at 128- and 64-token blocks come text-free too at these densities, the uniform
# geometry a caller who cuts the whole sequence into equal blocks gives (as `bench` does).
TEXTLESS_DENSITIES = (0.10, 0.30)
VARIABLE_SIZES = (32, 256)
OBJECTIVES = ("request", "kernel")
_ROUND = 5  # decimals kept for times in the file


class ProfilerUnavailable(RuntimeError):
    """The GPU profiler cannot run here (no PyTorch, CuPy or GPU)."""


@dataclass(frozen=True)
class Case:
    """One corpus mask: built on demand (``build()`` returns a host :class:`BlockMask`)."""

    label: str
    shape: str
    family: str
    head_dim: int
    heads: int
    build: Callable[[], Any] = field(compare=False, repr=False)


class Timing(NamedTuple):
    kernel_ms: float
    plan_ms: float


# A timer runs one regime on one mask and returns its kernel and planning times (ms). It may
# raise: that regime is then left out for this mask (e.g. a variant that does not build).
Timer = Callable[[Case, Any, Regime], "Timing | tuple[float, float]"]


@dataclass
class ProfileResult:
    table: RegimeTable
    profiled: list[str]  # case labels timed and merged in this run
    skipped: list[str]  # already in the table (resume)
    failed: list[str]  # no candidate regime ran
    stopped: str  # "done" or "budget"
    elapsed_s: float
    timings: int  # timer calls made


# ---------------------------------------------------------------------------- corpus
def _short_clips() -> dict[str, Any]:
    """Profile-only shapes: short clips of WORKLOADS models (previews, first steps of long
    generations), so sequences under 16k tokens have table entries of their own rather than
    borrowing the 17k+ shapes' choices; the held-out shapes use other clip lengths."""

    def clip(model: str, frames: int) -> Workload:
        w = WORKLOADS[model]
        return Workload(f"{model}-{frames}f", w.heads, w.head_dim, (frames, *w.latent[1:]),
                        w.text_tokens, w.text_valid)

    return {w.name: w for w in (clip("wan-1.3b-480p", 7), clip("cogvideox-5b", 5))}


def profile_shapes() -> dict[str, Any]:
    """Every shape :func:`build_corpus` knows: the WORKLOADS models and the short clips."""

    return {**WORKLOADS, **_short_clips()}


def build_corpus(shapes: Sequence[str] | None = None, families: Sequence[str] | None = None,
                 *, heads: int | None = 4, densities: Sequence[float] = DENSITIES,
                 small_block_densities: Sequence[float] = SMALL_BLOCK_DENSITIES,
                 variable_densities: Sequence[float] = VARIABLE_DENSITIES,
                 textless_densities: Sequence[float] = TEXTLESS_DENSITIES,
                 seed: int = 0) -> list[Case]:
    """Corpus cases for ``shapes`` (:func:`profile_shapes` names) x ``families`` (FAMILIES
    names), all by default, shape-major. ``random_blocks`` stands for random masks at
    ``densities`` with 128-token blocks, ``small_block_densities`` with 64-token blocks and
    ``variable_densities`` with blocks of :data:`VARIABLE_SIZES` tokens (text tokens as the
    workload has them), and for a shape with text tokens also masks without them at
    ``textless_densities`` with 128- and 64-token blocks (labels ending ``-textless``: uniform
    geometries). Masks are built only when a case runs; ``heads``
    query heads each (None: the model's own count, what a table for full-size requests should
    be profiled at).
    """

    known = profile_shapes()
    shapes = list(known) if shapes is None else list(shapes)
    families = list(FAMILIES) if families is None else list(families)
    for s in shapes:
        if s not in known:
            raise ValueError(f"unknown shape {s!r}; choose from {', '.join(known)}")
    for f in families:
        if f not in FAMILIES:
            raise ValueError(f"unknown family {f!r}; choose from {', '.join(FAMILIES)}")
    _check_heads(heads)
    cases = []
    for s in shapes:
        w = known[s]
        h = w.heads if heads is None else heads
        text = dict(text_tokens=w.text_tokens, text_valid=w.text_valid or None)
        for f in families:
            if f != "random_blocks":
                cases.append(Case(f"{s}/{f}", s, f, w.head_dim, h,
                                  lambda w=w, f=f, h=h: example_mask(
                                      w, f, heads=h, seed=seed, head_dim=w.head_dim).mask))
                continue
            for block, dens in [(128, d) for d in densities] + \
                               [(64, d) for d in small_block_densities]:
                cases.append(Case(
                    f"{s}/random_blocks@{dens:g}/b{block}", s, f, w.head_dim, h,
                    lambda w=w, b=block, d=dens, text=text, h=h: mask_families.random_blocks(
                        h, w.seq_len, block=b, density=d, seed=seed, **text).mask))
            if w.text_tokens:
                for block, dens in [(b, d) for b in (128, 64) for d in textless_densities]:
                    cases.append(Case(
                        f"{s}/random_blocks@{dens:g}/b{block}-textless", s, f, w.head_dim, h,
                        lambda w=w, b=block, d=dens, h=h: mask_families.random_blocks(
                            h, w.seq_len, block=b, density=d, seed=seed).mask))
            lo, hi = VARIABLE_SIZES
            for dens in variable_densities:
                cases.append(Case(
                    f"{s}/random_blocks@{dens:g}/v{lo}-{hi}", s, f, w.head_dim, h,
                    lambda w=w, d=dens, text=text, h=h: mask_families.random_blocks(
                        h, w.seq_len, density=d, seed=seed, sizes=VARIABLE_SIZES,
                        **text).mask))
    return cases


def _check_heads(heads: int | None) -> None:
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int)
                              or heads <= 0):
        raise ValueError(f"heads must be a positive int or None (the model's), got {heads!r}")


# Held-out shapes: latent grids and lengths no profile shape has (other resolutions and clip
# lengths of the same models, with the models' head counts), so an evaluation never meets a
# mask the profile timed.
HELDOUT_SHAPES = {
    "wan-1.3b-720p-13f": dict(heads=12, head_dim=128, latent=(13, 45, 80)),
    "wan-1.3b-480p-31f": dict(heads=12, head_dim=128, latent=(31, 30, 52)),
    "hunyuan-540p": dict(heads=24, head_dim=128, latent=(33, 34, 60), text_tokens=256,
                         text_valid=80),
    "cogvideox-5b-9f": dict(heads=48, head_dim=64, latent=(9, 30, 45), text_tokens=226,
                            text_valid=226),
}


def build_heldout_corpus(shapes: Sequence[str] | None = None, *, heads: int | None = 4,
                         seed: int = 1) -> list[Case]:
    """The evaluation corpus: :data:`HELDOUT_SHAPES` x the mask families with other seeds and
    other family parameters than :func:`build_corpus` uses (STA windows, top-k fraction,
    cluster counts, random densities), so a regime table is judged on masks it never saw.
    ``heads`` query heads per mask (None: the model's)."""
    
    shapes = list(HELDOUT_SHAPES) if shapes is None else list(shapes)
    for s in shapes:
        if s not in HELDOUT_SHAPES:
            raise ValueError(f"unknown held-out shape {s!r}; choose from "
                             f"{', '.join(HELDOUT_SHAPES)}")
    _check_heads(heads)
    cases: list[Case] = []
    for i, s in enumerate(shapes):
        spec = HELDOUT_SHAPES[s]
        nh = spec["heads"] if heads is None else heads
        lat, d = spec["latent"], spec["head_dim"]
        text = dict(text_tokens=spec.get("text_tokens", 0), text_valid=spec.get("text_valid"))
        seq = math.prod(lat) + text["text_tokens"]
        r = seed + i

        def qk(r=r, seq=seq, d=d, nh=nh):
            rng = np.random.default_rng(r)
            return [rng.standard_normal((nh, seq, d), dtype=np.float32) for _ in range(2)]

        windows = [(1, 3, 3), (3, 5, 5), (5, 3, 3), (1, 1, 7)]
        n_cubes = math.prod(-(-a // 4) for a in lat)
        topk = (0.05, 0.2)[i % 2]
        dens = ((0.07, 0.35), (0.15, 0.6))[i % 2]
        # Every builder binds this shape's values (nh included) as defaults: the lambdas run
        # later, after the loop has moved on.
        builders = {
            "sliding_tile": lambda lat=lat, text=text, nh=nh: mask_families.sliding_tile(
                lat, window=[windows[h % 4] for h in range(nh)], **text),
            "spatial_temporal": lambda lat=lat, text=text, nh=nh: mask_families.spatial_temporal(
                lat, heads=["temporal", "spatial"] * (nh // 2) + ["spatial"] * (nh % 2),
                width=2, **text),
            "radial": lambda lat=lat, text=text: mask_families.radial(lat, dense_distance=2,
                                                              sink_frame=False, **text),
            f"topk_pooled@{topk:g}": lambda lat=lat, text=text, qk=qk, f=topk, n=n_cubes:
                mask_families.topk_pooled(*qk(), lat, topk=max(1, round(f * n)), **text),
            "semantic_clusters": lambda seq=seq, text=text, qk=qk, r=r:
                mask_families.semantic_clusters(*qk(), max(2, seq // 256), max(2, seq // 192),
                                                top_p=0.8, seed=r, **text),
            f"random_blocks@{dens[0]:g}/b128": lambda seq=seq, text=text, r=r, p=dens[0], nh=nh:
                mask_families.random_blocks(nh, seq, block=128, density=p, seed=r, **text),
            f"random_blocks@{dens[1]:g}/b128": lambda seq=seq, text=text, r=r, p=dens[1], nh=nh:
                mask_families.random_blocks(nh, seq, block=128, density=p, seed=r, **text),
            "random_blocks@0.2/b64": lambda seq=seq, text=text, r=r, nh=nh:
                mask_families.random_blocks(nh, seq, block=64, density=0.2, seed=r, **text),
            "random_blocks@0.2/v32-256": lambda seq=seq, text=text, r=r, nh=nh:
                mask_families.random_blocks(nh, seq, density=0.2, seed=r, sizes=VARIABLE_SIZES,
                                            **text),
            # per-head densities over another spread than the profile corpus's 2-60%
            "mixed_density@0.05-0.45": lambda seq=seq, text=text, r=r, nh=nh:
                mask_families.random_blocks(nh, seq, seed=r, density=mask_families.
                                            mixed_densities(nh, r, (0.05, 0.45)), **text),
        }
        if text["text_tokens"]:  # the uniform geometry of such a shape (build_corpus says why)
            builders.update({
                f"random_blocks@{dens[0]:g}/b128-textless": lambda seq=seq, r=r, p=dens[0], nh=nh:
                    mask_families.random_blocks(nh, seq, block=128, density=p, seed=r),
                "random_blocks@0.2/b64-textless": lambda seq=seq, r=r, nh=nh:
                    mask_families.random_blocks(nh, seq, block=64, density=0.2, seed=r)})
        for name, build in builders.items():
            family = name.split("@")[0]
            cases.append(Case(f"{s}/{name}", s, family, d, nh,
                              lambda build=build: build().mask))
    return cases


# ---------------------------------------------------------------------------- bookkeeping
def _objective(kernel_ms: float, plan_ms: float, objective: str) -> float:
    return kernel_ms + plan_ms if objective == "request" else kernel_ms


def merge_entry(existing: dict | None, features: Any, label: str,
                results: dict[str, tuple[Regime, float, float]], default_name: str,
                objective: str, measures: MaskMeasures | None = None) -> dict:
    """The table entry for ``features`` after adding one mask's measurements.

    ``results`` maps regime names to ``(regime, kernel_ms, plan_ms)``. Per candidate the entry
    keeps running means (over its masks) of the objective time, kernel and planning time and
    ``rel`` = time / that mask's best; only candidates measured on every mask of the entry stay
    eligible. The chosen regime has the lowest mean ``rel`` (then time, then name). An entry
    without candidate data (written by hand) is replaced.
    """
    if not results:
        raise ValueError("merge_entry needs at least one measured regime")
    obj = {n: _objective(k, p, objective) for n, (_, k, p) in results.items()}
    best = min(obj.values())
    new = {n: {"ms": obj[n], "kernel_ms": k, "plan_ms": p,
               "rel": obj[n] / best if best > 0 else 1.0}
           for n, (_, k, p) in results.items()}
    old = existing.get("candidates") if existing else None
    n_old = len(existing.get("masks", [])) if existing else 0
    common = [n for n in new if isinstance(old, dict) and n in old]
    if existing and n_old and common:
        w = n_old / (n_old + 1)
        cands = {n: {f: w * float(old[n][f]) + (1 - w) * new[n][f] for f in new[n]}
                 for n in common}
        oracle = w * float(existing["oracle_ms"]) + (1 - w) * best
        masks = list(existing["masks"]) + [label]
        meas = list(existing.get("measures", [None] * n_old)) + [
            measures.to_dict() if measures else None]
    else:
        cands, oracle, masks = new, best, [label]
        meas = [measures.to_dict() if measures else None]
    chosen = min(cands, key=lambda n: (cands[n]["rel"], cands[n]["ms"], n))
    regimes = {n: r for n, (r, _, _) in results.items()}
    rnd = lambda x: round(float(x), _ROUND)  # noqa: E731
    entry = {
        "key": features.key(), "features": features.to_dict(),
        "regime": regimes[chosen].to_dict(), "name": chosen, "objective": objective,
        "ms": rnd(cands[chosen]["ms"]), "oracle_ms": rnd(oracle),
        "kernel_ms": rnd(cands[chosen]["kernel_ms"]), "plan_ms": rnd(cands[chosen]["plan_ms"]),
        "default": default_name,
        "default_ms": rnd(cands[default_name]["ms"]) if default_name in cands else None,
        "masks": masks, "measures": meas,
        "candidates": {n: {f: rnd(v) for f, v in c.items()} for n, c in sorted(cands.items())},
    }
    return entry


def _corpus_summary(entries: dict[str, dict], old: dict, cases: dict[str, Case],
                    extra: dict) -> dict:
    labels = [m for e in entries.values() for m in e.get("masks", [])]
    shapes = set(old.get("shapes", [])) | {cases[m].shape for m in labels if m in cases}
    families = set(old.get("families", [])) | {cases[m].family for m in labels if m in cases}
    return {**old, **extra, "masks": len(labels), "keys": len(entries),
            "shapes": sorted(shapes), "families": sorted(families)}


def _restrictions(kernel_families: Sequence[str] | None,
                  combine_thresholds: Sequence[float] | None, cases: Sequence[Case],
                  arch: int) -> dict[str, Any]:
    """The candidate restrictions as recorded (``"all"`` where not limited), refused when they
    leave a case's head dim without candidates on ``arch``."""
    for d in sorted({c.head_dim for c in cases}):
        if not candidate_regimes(d, arch, kernel_families, combine_thresholds):
            raise ValueError(f"no candidate regimes of kernel families "
                             f"{list(kernel_families or ['all'])} and combine thresholds "
                             f"{list(combine_thresholds or ['all'])} for head dim {d} on "
                             f"sm_{arch}")
    return dict(kernel_families="all" if kernel_families is None else sorted(kernel_families),
                combine_thresholds="all" if combine_thresholds is None else
                sorted(float(x) for x in combine_thresholds))


def _backward_restrictions(kernel_families: Sequence[str] | None, arch: int) -> dict[str, Any]:
    """The backward profile's restriction as recorded, refused when it leaves no candidate."""
    if kernel_families is not None and not any(r.family in kernel_families
                                               for r in candidate_backward_regimes(arch)):
        raise ValueError(f"no candidate backward regimes of kernel families "
                         f"{list(kernel_families)} on sm_{arch}")
    return dict(kernel_families="all" if kernel_families is None else sorted(kernel_families))


def _fmt_min(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def _status(stream: TextIO | None, text: str, final: bool = False) -> None:
    if stream is None:
        return
    stream.write("\r" + text.ljust(110)[:160] + ("\n" if final else ""))
    stream.flush()


class _Measured(NamedTuple):
    mask: Any
    measures: MaskMeasures
    features: Any
    heuristic: Regime


def _measure_case(case: Case, prepare: Callable[[Any], Any] | None, *, dtype: str, arch: int,
                  batch: int, backward: bool = False) -> _Measured:
    """Build a case's mask (``prepare``d, e.g. moved to the device), its features and the
    regime a plan of it takes without a table (``selection.heuristic_choice``; ``backward``:
    the default backward regime, dQ by atomics where it runs)."""
    mask = case.build()
    if prepare is not None:
        mask = prepare(mask)
    meas = mask_measures(mask)
    feats = features_from_measures(meas, head_dim=case.head_dim, dtype=dtype, arch=arch,
                                   num_q_heads=case.heads, batch=batch)
    if backward:
        heuristic: Any = default_backward_regime(arch, typical_q_block(mask.q_bounds),
                                                 typical_q_block(mask.kv_bounds))
    else:  # the regime plans take without a table: the heuristic with its mask-reading rules
        heuristic = heuristic_choice(mask, arch, case.head_dim, num_q_heads=case.heads,
                                     batch=batch, sm_count=ring_rule_sm_count(arch))[0]
    return _Measured(mask, meas, feats, heuristic)


def same_plan_key(regime: Regime, case: Case, mask: Any, batch: int, arch: int,
                  sm_count: int | None) -> str:
    """A name shared by the regimes whose plans of ``mask`` are identical: those differing only
    in split policy when no task may split (``tasks.may_split``: at a model's head count there
    are 16+ tasks per slot of the GPU, so the 2x, 4x and never-split candidates plan alike).
    ``sm_count`` None (the GPU unknown): every regime is its own."""
    if sm_count is None:
        return regime.name

    if plan_may_split(regime, mask, num_q_heads=case.heads, num_kv_heads=case.heads,
                      batch=batch, in_flight=tasks_in_flight(regime, case.head_dim, arch,
                                                             sm_count)):
        return regime.name
    return regime.with_(split_ratio=NEVER_SPLIT_RATIO,
                        min_split_chunks=Regime().min_split_chunks).name


def _time_regimes(case: Case, mask: Any, regimes: Sequence[Regime], timer: Timer, head: str,
                  progress: TextIO | None, same_plan: Callable[[Regime], str] | None = None
                  ) -> dict[str, tuple[Regime, float, float]]:
    """``(regime, kernel_ms, plan_ms)`` by name for every regime the timer could run; a
    regime that fails or gives a bad timing is reported and left out (never ends the run).
    Regimes ``same_plan`` names alike plan the mask identically: the first is timed and the
    others get its timings (a third of the timings at a model's head count)."""
    results: dict[str, tuple[Regime, float, float]] = {}
    timed: dict[str, tuple[float, float]] = {}
    for j, r in enumerate(regimes):
        twin = same_plan(r) if same_plan is not None else r.name
        if twin in timed:
            results[r.name] = (r, *timed[twin])
            continue
        _status(progress, f"{head}: regime {j + 1}/{len(regimes)} {r.name}")
        try:
            k_ms, p_ms = (float(x) for x in timer(case, mask, r))
        except Exception as exc:
            _status(progress, f"  {case.label}: {r.name}: {type(exc).__name__}: {exc}", True)
            continue
        if not (math.isfinite(k_ms) and math.isfinite(p_ms) and k_ms >= 0 and p_ms >= 0):
            _status(progress, f"  {case.label}: {r.name}: bad timing {k_ms!r}, {p_ms!r}", True)
            continue
        results[r.name] = (r, k_ms, p_ms)
        timed[twin] = (k_ms, p_ms)
    return results


def profile(cases: Sequence[Case], *, out: str | Path, arch: int, timer: Timer,
            dtype: str = "bfloat16", batch: int = 1, objective: str = "request",
            budget_s: float | None = None, resume: bool = False, overwrite: bool = False,
            provenance: dict | None = None, prepare: Callable[[Any], Any] | None = None,
            clock: Callable[[], float] = time.monotonic,
            progress: TextIO | None = sys.stderr,
            kernel_families: Sequence[str] | None = None,
            combine_thresholds: Sequence[float] | None = None,
            section: str = "forward") -> ProfileResult:
    """Time every candidate regime on every case and write the table to ``out``.

    ``section="backward"``: the backward regimes (``candidate_backward_regimes``, timed by a
    backward timer such as :func:`gpu_backward_timer`) into the table's backward section; the
    rest of an existing table file is kept, and ``resume`` / ``overwrite`` apply to the section.

    ``kernel_families`` (e.g. ``("sm90",)``) limits the candidates to those kernel families,
    for a GPU where measurements show the others never win (it halves the profile on sm_90);
    ``combine_thresholds`` (e.g. ``(0.0,)``) to those mapping policies (restricted merges plan
    on the host in milliseconds and never came within 5% of the best request on the H200:
    leaving them out halves a request-objective profile again).

    ``timer(case, mask, regime)`` gives ``(kernel_ms, plan_ms)``; ``prepare`` (e.g. moving the
    mask to the device) runs on each built mask before features and timings. The table is
    written (atomically) after every case. ``out`` existing is an error unless ``resume``
    (continue it: cases whose label it already records are skipped, new ones merged into
    their keys; it must be for the same architecture, GPU, dtype and objective) or
    ``overwrite``. Before each case, the run stops if ``budget_s`` seconds of ``clock`` have
    passed since it started (so it may overrun by at most one case).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if section not in ("forward", "backward"):
        raise ValueError(f"section must be 'forward' or 'backward', got {section!r}")
    backward = section == "backward"
    limits = (_backward_restrictions(kernel_families, arch) if backward else
              _restrictions(kernel_families, combine_thresholds, cases, arch))
    out = Path(out)
    provenance = dict(provenance or {})
    sm_count = provenance.get("sms")  # the GPU's, when the caller says (gpu_environment)
    entries: dict[str, dict] = {}
    old_prov: dict = {}
    whole = RegimeTable.load(out) if out.exists() else None  # (the file's other section kept)
    if backward and whole is not None and whole.backward is None and not overwrite:
        resume = True  # a table without a backward section: add one, as a resumed empty one
    if out.exists() and resume:
        old = (whole.backward or RegimeTable([], {}, section="backward")) if backward \
            else whole
        if backward and whole.arch is not None and whole.arch != arch:
            raise ValueError(f"{out} was profiled on sm_{whole.arch}, this GPU is sm_{arch}; "
                             "give another --out")
        old_corpus = old.provenance.get("corpus", {}) if isinstance(
            old.provenance.get("corpus"), dict) else {}
        if old.arch is not None and old.arch != arch:
            raise ValueError(f"{out} was profiled on sm_{old.arch}, this GPU is sm_{arch}; "
                             "give another --out")
        here = provenance.get("gpu")
        if old.gpu and here and gpu_slug(old.gpu) != gpu_slug(here):
            raise ValueError(f"{out} was profiled on {old.gpu}, this GPU is {here}; "
                             "give another --out")
        heads = sorted({c.heads for c in cases})
        for name, now in (("objective", objective), ("dtype", dtype), ("batch", batch),
                          ("heads", heads), *limits.items()):
            # A table that predates a restriction was profiled without it (a section with no
            # entries yet, with anything).
            was = old_corpus.get(name, "all" if name in limits and len(old) else now)
            if was != now:
                raise ValueError(f"{out} was profiled with {name}={was!r}, this run has "
                                 f"{now!r}; give another --out")
        entries = {e["key"]: e for e in old.entries}
        old_prov = old.provenance
    elif out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass --resume to continue it or --overwrite to "
                              "start over")
    done = {m for e in entries.values() for m in e.get("masks", [])}
    by_label = {c.label: c for c in cases}
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    corpus_extra = dict(heads=sorted({c.heads for c in cases}), batch=batch, dtype=dtype,
                        objective=objective, **limits)

    def write() -> RegimeTable:
        old_corpus = old_prov.get("corpus", {}) if isinstance(old_prov.get("corpus"),
                                                                dict) else {}
        prov = {**old_prov, **provenance, "arch": arch, "tessera": __version__,
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "started": old_prov.get("started", started),
                "corpus": _corpus_summary(entries, old_corpus, by_label, corpus_extra)}
        table = RegimeTable(list(entries.values()), prov, source=str(out), section=section)
        if backward:  # the file's forward entries kept (a new file: its GPU, no entries)
            base = whole if whole is not None else RegimeTable(
                [], {k: v for k, v in prov.items() if k != "corpus"}, source=str(out))
            base.with_backward(table).save(out)
        else:
            table.with_backward(whole.backward if whole is not None else None).save(out)
        return table

    profiled: list[str] = []
    skipped: list[str] = []
    failed: list[str] = []
    stopped = "done"
    calls = 0
    t0 = clock()
    n = len(cases)
    table = None
    for i, case in enumerate(cases):
        elapsed = clock() - t0
        budget = f"{_fmt_min(elapsed)}/{_fmt_min(budget_s)} min" if budget_s else \
            f"{_fmt_min(elapsed)} min"
        head = f"[{i + 1}/{n}] {budget} {case.label}"
        if case.label in done:
            skipped.append(case.label)
            _status(progress, f"{head}: already in {out.name}, skipped", final=True)
            continue
        if budget_s is not None and elapsed >= budget_s:
            stopped = "budget"
            _status(progress, f"[{i}/{n}] budget of {_fmt_min(budget_s)} min spent; "
                              f"{n - i} cases left (run again with --resume)", final=True)
            break
        _status(progress, f"{head}: building the mask")
        mask, meas, feats, heuristic = _measure_case(case, prepare, dtype=dtype, arch=arch,
                                                     batch=batch, backward=backward)
        if backward:
            regimes = [r for r in candidate_backward_regimes(arch)
                       if kernel_families is None or r.family in kernel_families]
            same_plan = None  # (a backward regime has no split policy to share a plan over)
        else:
            regimes = candidate_regimes(case.head_dim, arch, kernel_families,
                                        combine_thresholds)

            def same_plan(r: Regime) -> str:
                return same_plan_key(r, case, mask, batch, arch, sm_count)
        if heuristic not in regimes:
            regimes.append(heuristic)
        calls += len(regimes)
        results = _time_regimes(case, mask, regimes, timer, head, progress, same_plan)
        if not results:
            failed.append(case.label)
            _status(progress, f"{head}: no regime ran; not recorded", final=True)
            continue
        key = feats.key()
        entry = merge_entry(entries.get(key), feats, case.label, results, heuristic.name,
                            objective, meas)
        entries[key] = entry
        profiled.append(case.label)
        table = write()
        gain = (f", default x{entry['default_ms'] / entry['ms']:.2f}"
                if entry["default_ms"] and entry["ms"] else "")
        _status(progress, f"{head}: {key} -> {entry['name']} {entry['ms']:.3f} ms{gain}",
                final=True)
    if table is None:  # nothing new: a resumed table as it was, else an empty one written
        table = (RegimeTable(list(entries.values()), old_prov, source=str(out),
                             section=section)
                 if resume and out.exists() and (whole.backward if backward else whole)
                 is not None else write())
    return ProfileResult(table=table, profiled=profiled, skipped=skipped, failed=failed,
                         stopped=stopped, elapsed_s=clock() - t0, timings=calls)


# ---------------------------------------------------------------------------- evaluation
EVAL_FORMAT = "tessera-regime-evaluation"
WITHIN = 1.05  # "within 5% of the oracle"


def evaluate(cases: Sequence[Case], *, table: RegimeTable, out: str | Path, arch: int,
             timer: Timer, dtype: str = "bfloat16", batch: int = 1,
             objective: str | None = None, budget_s: float | None = None, resume: bool = False,
             overwrite: bool = False, provenance: dict | None = None,
             prepare: Callable[[Any], Any] | None = None,
             clock: Callable[[], float] = time.monotonic,
             progress: TextIO | None = sys.stderr,
             kernel_families: Sequence[str] | None = None,
             combine_thresholds: Sequence[float] | None = None) -> dict:
    """Judge ``table`` on ``cases`` (a held-out corpus): time every candidate regime on each
    mask (the oracle is the fastest) and record which regime the table's lookup picks (the
    heuristic when it has nothing for the mask) and which the heuristic would.

    Writes ``out`` (JSON: provenance, one record per mask with every regime's kernel and
    planning times, and :func:`summarize_evaluation`'s summary) after every mask; ``resume``
    skips masks already recorded there. ``objective`` defaults to the table's;
    ``kernel_families`` and ``combine_thresholds`` limit the oracle's candidates as
    :func:`profile`'s.
    """
    objective = objective or table.provenance.get("corpus", {}).get("objective", "request")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    limits = _restrictions(kernel_families, combine_thresholds, cases, arch)
    out = Path(out)
    sm_count = (provenance or {}).get("sms")  # the GPU's, when the caller says
    records: list[dict] = []
    if out.exists() and resume:
        old = json.loads(out.read_text())
        if old.get("format") != EVAL_FORMAT:
            raise ValueError(f"{out} is not a regime evaluation; give another --out")
        if old.get("objective") != objective or old.get("arch") != arch:
            raise ValueError(f"{out} was made for sm_{old.get('arch')} / {old.get('objective')}"
                             f", this run is sm_{arch} / {objective}; give another --out")
        records = list(old.get("records", []))
    elif out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass --resume to continue it or --overwrite to "
                              "start over")
    done = {r["label"] for r in records}
    head_info = dict(format=EVAL_FORMAT, arch=arch, objective=objective, dtype=dtype,
                     batch=batch, table=table.source, table_entries=len(table),
                     table_date=table.provenance.get("date"), **limits,
                     provenance=dict(provenance or {}))

    def write() -> dict:
        doc = {**head_info, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
               "summary": summarize_evaluation(records, objective) if records else None,
               "records": records}
        write_json_atomic(out, doc)
        return doc

    t0 = clock()
    for i, case in enumerate(cases):
        head = f"[{i + 1}/{len(cases)}] {_fmt_min(clock() - t0)} min {case.label}"
        if case.label in done:
            continue
        if budget_s is not None and clock() - t0 >= budget_s:
            _status(progress, f"budget spent; {len(cases) - i} masks left (--resume)", True)
            break
        _status(progress, f"{head}: building the mask")
        mask, meas, feats, heuristic = _measure_case(case, prepare, dtype=dtype, arch=arch,
                                                     batch=batch)
        # What a plan takes: the table's pick with the walk and tiling the mask's own estimates
        # say pay (kept per tile shape, so that a rescore with another table can apply them).
        regimes = candidate_regimes(case.head_dim, arch, kernel_families, combine_thresholds)
        aligns = bool(align_pays(mask, 128))
        shapes = sorted({(r.block_m, r.block_n) for r in regimes if r.family == "sm90"})
        packs = {f"{bm}x{bn}": bool(pack_pays(mask, bn, bm)) for bm, bn in shapes}
        found = table.lookup(feats)
        chosen = heuristic if found is None else _as_recorded(found, aligns, packs)
        for extra in (heuristic, chosen):
            if extra not in regimes:
                regimes.append(extra)
        same = lambda r: same_plan_key(r, case, mask, batch, arch, sm_count)  # noqa: E731
        times = {n: [round(k, _ROUND), round(p, _ROUND)]
                 for n, (_, k, p) in _time_regimes(case, mask, regimes, timer, head,
                                                   progress, same).items()}
        if chosen.name not in times or heuristic.name not in times:
            _status(progress, f"{head}: the chosen or default regime did not run; skipped", True)
            continue
        records.append(dict(label=case.label, shape=case.shape, family=case.family,
                            key=feats.key(), exact=table.lookup_exact(feats) is not None,
                            measures=meas.to_dict(), aligns=aligns, packs=packs,
                            chosen=chosen.name,
                            default=heuristic.name, times=times))
        write()
        obj = {n: _objective(k, p, objective) for n, (k, p) in times.items()}
        ratio = obj[chosen.name] / min(obj.values())
        _status(progress, f"{head}: chosen {chosen.name} x{ratio:.3f} of the oracle", True)
    return write()


def _as_recorded(found: Regime, aligns: bool, packs: dict[str, bool]) -> Regime:
    """A table's pick as a plan takes it (:func:`~tessera.runtime.regime.planned_pick`) from an
    evaluation's recorded estimates: ``aligns`` (align_pays at 128 rows) and ``packs``
    (pack_pays by tile shape; a shape not recorded keeps the pick's walk)."""
    return planned_pick(found, lambda: aligns,
                        lambda r: bool(packs.get(f"{r.block_m}x{r.block_n}", r.pack_keys)))


def rescore_evaluation(doc: dict, table: RegimeTable) -> dict:
    """An evaluation's records with the regime ``table`` picks now, and their summary: from the
    recorded feature keys and, where recorded, the mask's estimates (aligned tiles pay:
    :func:`~tessera.runtime.regime.aligned_pick`; the packed key walk pays, by tile shape:
    :func:`~tessera.runtime.regime.packed_pick`); the heuristic where the table has nothing.
    Every candidate was timed on every held-out mask, so a changed lookup rule is judged on the
    same measurements."""
    records = []
    for r in doc["records"]:
        feats = MaskFeatures.from_key(r["key"])
        found = table.lookup(feats)
        if found is not None:
            found = _as_recorded(found, bool(r.get("aligns", False)), r.get("packs", {}))
        name = found.name if found is not None else r["default"]
        if name not in r["times"]:
            raise ValueError(f"{r['label']}: the table picks {name}, which was not timed")
        records.append({**r, "chosen": name, "exact": table.lookup_exact(feats) is not None})
    return {**doc, "table": table.source, "records": records,
            "summary": summarize_evaluation(records, doc.get("objective", "request"))}


def request_form(name: str) -> str:
    """The form of regime ``name`` that a request runs when the selection picks it: a request
    never splits heavy tasks (``PlanMode.REQUEST``), so the never-split candidate of its tiles
    and policy (a packed key walk never splits, and a name that is no regime's stays: itself)."""
    r = regime_from_name(name)
    if r is None or r.pack_keys:
        return name
    return r.with_(split_ratio=max(CANDIDATE_SPLIT_RATIO),
                   min_split_chunks=Regime().min_split_chunks).name


def _as_requested(record: dict) -> dict:
    """An evaluation record as requests see it: every timed regime by its request form (the
    forms a request can run, where timed), the table's pick and the heuristic's by theirs (or
    as they are where their form was not timed)."""
    timed = record["times"]
    forms = {n: request_form(n) for n in timed}
    times = {f: timed[f] for f in forms.values() if f in timed}

    def as_run(name: str) -> str:
        form = forms[name] if name in forms else request_form(name)
        if form in times:
            return form
        times[name] = timed[name]
        return name

    return {**record, "chosen": as_run(record["chosen"]), "default": as_run(record["default"]),
            "times": times}


def summarize_evaluation(records: Sequence[dict], objective: str = "request") -> dict:
    """What a held-out evaluation shows, for ``objective`` and for kernel time alone.

    Per mask: ``ratio`` = the looked-up regime's time / the oracle's (the fastest measured).
    Reported: the share of masks within 5% of the oracle, the mean slowdown (mean ratio - 1),
    the worst ratio; the same share and worst ratio for the heuristic default (what a GPU
    without a table of its own runs); the single best fixed regime in hindsight (lowest mean
    ratio over these very masks, among regimes measured on all of them) and the heuristic
    default, each as the total time they need over the looked-up regimes' total (> 1: the
    table is faster); per model shape (``by_shape``: shape -> [masks, the table's within 5%, the
    heuristic's within 5%]), where a share below the whole's sits. The request objective compares
    what requests run (:func:`request_form`:
    a request splits no task, so a split policy's timing is not one a request can have);
    kernel time compares every form, as a plan made once and run many times may split.
    """
    def metrics(records: Sequence[dict], obj_of: Callable[[list[float]], float]) -> dict:
        ratios, default_ratios, chosen_t, default_t = [], [], 0.0, 0.0
        per_regime: dict[str, list[float]] = {}
        totals: dict[str, float] = {}
        by_shape: dict[str, list[int]] = {}
        for r in records:
            obj = {n: obj_of(t) for n, t in r["times"].items()}
            best = min(obj.values())
            ratios.append(obj[r["chosen"]] / best)
            default_ratios.append(obj[r["default"]] / best)
            counts = by_shape.setdefault(r.get("shape", "?"), [0, 0, 0])
            counts[0] += 1
            counts[1] += ratios[-1] <= WITHIN
            counts[2] += default_ratios[-1] <= WITHIN
            chosen_t += obj[r["chosen"]]
            default_t += obj[r["default"]]
            for n, v in obj.items():
                per_regime.setdefault(n, []).append(v / best)
                totals[n] = totals.get(n, 0.0) + v
        common = [n for n, v in per_regime.items() if len(v) == len(records)]
        fixed = min(common, key=lambda n: (sum(per_regime[n]), n)) if common else None
        n = len(ratios)
        return dict(
            masks=n, within_5pct=sum(x <= WITHIN for x in ratios) / n if n else None,
            mean_slowdown=sum(ratios) / n - 1 if n else None,
            worst=max(ratios) if n else None,
            default_within_5pct=sum(x <= WITHIN for x in default_ratios) / n if n else None,
            default_worst=max(default_ratios) if n else None,
            best_fixed=fixed,
            best_fixed_mean_slowdown=(sum(per_regime[fixed]) / n - 1) if fixed else None,
            gain_vs_best_fixed=(totals[fixed] / chosen_t) if fixed and chosen_t else None,
            gain_vs_default=(default_t / chosen_t) if chosen_t else None,
            by_shape=by_shape)

    as_run = [_as_requested(r) for r in records] if objective == "request" else records
    summary = {objective: metrics(as_run, lambda t: _objective(t[0], t[1], objective))}
    if objective != "kernel":
        summary["kernel"] = metrics(records, lambda t: t[0])
    summary["exact_keys"] = sum(bool(r.get("exact")) for r in records)
    return summary


# ---------------------------------------------------------------------------- GPU (not on CI)
def gpu_environment() -> tuple[int, dict]:
    """(compute capability, provenance) of the current GPU; :class:`ProfilerUnavailable` with
    a message saying what is missing when the profiler cannot run here."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        raise ProfilerUnavailable("profile needs PyTorch (its CUDA event timers) and a CUDA "
                                  "GPU; PyTorch is not installed here.") from None
    if not torch.cuda.is_available():
        raise ProfilerUnavailable("profile needs a CUDA GPU; none is visible. Plans on this "
                                  "machine use the heuristic default regime.")

    cp = cupy_or_none()
    if cp is None:
        raise ProfilerUnavailable(f"profile needs CuPy: {install_hint('cuda13')} (or cuda12)")

    cc = device_cc()
    name = current_gpu_name()
    drv = cp.cuda.runtime.driverGetVersion()
    rt = cp.cuda.runtime.runtimeGetVersion()
    nv = nvrtc_version()
    prov = dict(gpu=name, arch=cc, sms=device_sm_count(),
                driver=_nvidia_driver() or f"CUDA {drv // 1000}.{drv % 1000 // 10} (driver API)",
                cuda=f"{rt // 1000}.{rt % 1000 // 10}", nvrtc="%d.%d" % nv if nv else None,
                cupy=cp.__version__, torch=torch.__version__)
    return cc, prov


def _nvidia_driver() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        line = res.stdout.strip().splitlines()[0] if res.returncode == 0 else ""
        return line.strip() or None
    except Exception:
        return None


def gpu_timer(*, dtype: str = "bfloat16", batch: int = 1, reps: int = 10,
              plan_reps: int = 12) -> Timer:
    """A timer for :func:`profile` on the current GPU (needs PyTorch and CuPy).

    Per call: plan the mask with the regime, then the median of ``reps`` CUDA-event timings of
    ``plan.run`` (q, k, v random, ``[batch, heads, L, head_dim]``, reused while the shape
    stays; a third of them, at least 3, for kernels over 20 ms) and the fastest of
    ``plan_reps`` timings of planning again (the dynamic-mask path; a third of them for plans
    over 3 ms). Planning is host work (0.15-0.5 ms of CuPy calls, at most one synchronization) whose
    noise only adds: the same code path measured 0.43-0.87 ms as a median of 5 in one run
    (H200, docs/decisions.md), enough to decide a lookup; the minimum of more timings is
    what one regime's planning costs.
    """
    import torch  # noqa: PLC0415


    tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    cache: dict[str, Any] = {}

    def timer(case: Case, mask: Any, regime: Regime) -> Timing:
        shape = (batch, case.heads, mask.seq_len_q, case.head_dim)
        if cache.get("shape") != shape:
            cache.clear()  # free the previous shape's tensors first
            gen = torch.Generator(device="cuda").manual_seed(0)
            cache["qkv"] = tuple(torch.randn(shape, device="cuda", dtype=tdtype, generator=gen)
                                 for _ in range(3))
            cache["shape"] = shape
        q, k, v = cache["qkv"]
        kw = dict(num_q_heads=case.heads, head_dim=case.head_dim, batch=batch, dtype=dtype,
                  regime=regime)
        p = make_plan(mask, **kw)
        # Long kernels (tens of ms) are steady: fewer repetitions keep a profile of the
        # largest shapes within an hour of GPU time.
        first = cuda_time_ms(lambda: p.run(q, k, v), reps=1, warmup=1)
        n = reps if first < 20 else max(3, reps // 3)
        kernel_ms = cuda_time_ms(lambda: p.run(q, k, v), reps=n, warmup=0)

        def replan() -> Any:
            return make_plan(mask, **kw)

        # Slow planning (the general planner, milliseconds) never wins a request by a margin
        # that noise decides: fewer timings keep the profile within an hour of GPU time.
        first_plan = cuda_time_ms(replan, reps=1, warmup=1)
        m = plan_reps if first_plan < 3 else max(3, plan_reps // 3)
        plan_ms = min(first_plan, cuda_time_ms(replan, reps=m, warmup=0, stat=min))
        return Timing(kernel_ms, plan_ms)

    return timer


def gpu_backward_timer(*, dtype: str = "bfloat16", batch: int = 1, reps: int = 10) -> Timer:
    """A timer of backward regimes for :func:`profile` (``section="backward"``) on the current
    GPU (needs PyTorch and CuPy).

    Per call: the forward's output and LSE once per mask and shape, then the median of ``reps``
    CUDA-event timings of ``plan.run_backward`` with the regime (its queues kept: the kernels'
    time) and of ``tessera.attention_backward`` with it (a request: the queues planned again,
    on the device for a device mask); planning is the request's time beyond the kernels'.
    """
    import torch  # noqa: PLC0415

    tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    cache: dict[str, Any] = {}

    def timer(case: Case, mask: Any, regime: Any) -> Timing:
        shape = (batch, case.heads, mask.seq_len_q, case.head_dim)
        p = cache.get("plan") if cache.get("mask") is mask else None
        if p is None or cache.get("shape") != shape:
            cache.clear()  # free the previous mask's tensors first
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(shape, device="cuda", dtype=tdtype, generator=gen)
                           for _ in range(4))
            p = make_plan(mask, num_q_heads=case.heads, head_dim=case.head_dim, batch=batch,
                          dtype=dtype)
            out, lse = p.run(q, k, v, return_lse=True)
            cache.update(mask=mask, shape=shape, plan=p, args=(q, k, v, out, lse, do))
        args = cache["args"]
        first = cuda_time_ms(lambda: p.run_backward(*args, regime=regime), reps=1, warmup=1)
        n = reps if first < 20 else max(3, reps // 3)
        kernel_ms = cuda_time_ms(lambda: p.run_backward(*args, regime=regime), reps=n,
                                 warmup=0)
        request_ms = cuda_time_ms(lambda: attention_backward(*args, mask, regime=regime),
                                  reps=n, warmup=1)
        return Timing(kernel_ms, max(request_ms - kernel_ms, 0.0))

    return timer


# ---------------------------------------------------------------------------- command line
def _heads_arg(text: str) -> int | None:
    """``--heads``: a positive int, or ``model`` (None: each model's own head count)."""
    if text == "model":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'model', got {text!r}")
    return n


def _thresholds(text: str | None) -> list[float] | None:
    """``--combine-thresholds``: floats >= 0 (``ValueError`` naming the bad one)."""
    if not text:
        return None
    out = []
    for x in (x for x in text.split(",") if x):
        try:
            v = float(x)
        except ValueError:
            v = -1.0
        if not v >= 0:
            raise ValueError(f"--combine-thresholds: {x!r} is not a number >= 0")
        out.append(v)
    return out or None


def add_arguments(ap: Any) -> None:
    ap.add_argument("--out", help="table to write (default: tables/<gpu-slug>.json)")
    ap.add_argument("--budget-minutes", type=positive_float, default=30.0,
                    help="stop starting new masks after this long (default 30)")
    ap.add_argument("--resume", action="store_true",
                    help="continue an existing table: skip the masks it already records")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing table")
    ap.add_argument("--shapes", help="comma list of tessera.tools.workloads shapes (default: all)")
    ap.add_argument("--families", help="comma list of mask families (default: all)")
    ap.add_argument("--kernel-families",
                    help="comma list of kernel families to time, e.g. sm90 (default: every "
                         "family the GPU runs)")
    ap.add_argument("--combine-thresholds",
                    help="comma list of combine thresholds (mapping policies) to time, e.g. 0 "
                         "(default: all; restricted merges never won a request on the H200)")
    ap.add_argument("--heads", type=_heads_arg, default=4,
                    help="query heads per mask, or 'model' for each model's own count "
                         "(default 4)")
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--objective", choices=OBJECTIVES, default="request",
                    help="request: kernel + planning time (default); kernel: kernel only")
    ap.add_argument("--reps", type=positive_int, default=10, help="timed kernel runs per regime")
    ap.add_argument("--list", action="store_true",
                    help="list the corpus and the candidate regimes, time nothing")
    ap.add_argument("--backward", action="store_true",
                    help="profile the backward pass's regimes into the table's backward section "
                         "(the rest of the table file is kept)")
    ap.add_argument("--evaluate", metavar="TABLE",
                    help="instead of profiling: judge TABLE on the held-out corpus (other "
                         "shapes, seeds and family parameters) against the oracle of every "
                         "candidate; --out names the evaluation JSON")


def command(args: Any) -> int:
    """``python -m tessera profile``: 0 done, 1 cannot run here (or bad table), 2 bad args."""

    split = lambda s: [x for x in s.split(",") if x] if s else None  # noqa: E731
    try:
        thresholds = _thresholds(args.combine_thresholds)
        if args.evaluate:
            cases = build_heldout_corpus(split(args.shapes), heads=args.heads)
            if args.families:
                cases = [c for c in cases if c.family in split(args.families)]
        else:
            cases = build_corpus(split(args.shapes), split(args.families), heads=args.heads)
    except ValueError as exc:
        print(exc)
        return 2
    if args.evaluate and not args.out and not args.list:
        print("--evaluate needs --out (the evaluation JSON to write)")
        return 2
    if args.list:
        for c in cases:
            print(f"{c.label} (head dim {c.head_dim}, {c.heads} heads)")
        for cc in (80, 86, 90):
            if args.backward:
                names = [r.name for r in candidate_backward_regimes(cc)]
                print(f"sm_{cc}: {len(names)} candidate backward regimes: {', '.join(names)}")
                continue
            for d in sorted({c.head_dim for c in cases}):
                n = len(candidate_regimes(d, cc, split(args.kernel_families), thresholds))
                print(f"sm_{cc} head dim {d}: {n} candidate regimes")
        return 0
    try:
        arch, prov = gpu_environment()
    except ProfilerUnavailable as exc:
        print(exc)
        return 1
    if args.evaluate:
        if args.backward:
            print("--evaluate judges the forward regimes; --backward profiles only")
            return 2
        return _evaluate_command(args, cases, arch, prov)
    out = Path(args.out) if args.out else TABLES_DIR / f"{gpu_slug(prov['gpu'])}.json"
    print(f"profiling {len(cases)} masks on {prov['gpu']} (sm_{arch}) into {out}, budget "
          f"{args.budget_minutes:g} min", file=sys.stderr)
    try:
        options = _gpu_run_options(args, prov)
        if args.backward:
            options["timer"] = gpu_backward_timer(dtype=args.dtype, reps=args.reps)
        res = profile(cases, out=out, arch=arch, objective=args.objective,
                      section="backward" if args.backward else "forward", **options)
    except (FileExistsError, ValueError) as exc:
        print(exc)
        return 1
    print(f"{out}: {len(res.table)} entries; this run profiled {len(res.profiled)} masks, "
          f"skipped {len(res.skipped)}, failed {len(res.failed)}, in {res.elapsed_s / 60:.1f} "
          f"min ({res.stopped})")
    return 0


def _gpu_run_options(args: Any, prov: dict) -> dict[str, Any]:
    """What profiling and evaluating on this GPU share: the timer, dtype, budget, resume /
    overwrite, provenance, and masks moved to the device before they are measured."""
    kinds = [x for x in (args.kernel_families or "").split(",") if x] or None
    return dict(timer=gpu_timer(dtype=args.dtype, reps=args.reps), dtype=args.dtype,
                budget_s=args.budget_minutes * 60, resume=args.resume,
                overwrite=args.overwrite, provenance=prov, prepare=lambda m: m.to_device(),
                kernel_families=kinds, combine_thresholds=_thresholds(args.combine_thresholds))


def _evaluate_command(args: Any, cases: list[Case], arch: int, prov: dict) -> int:
    try:
        table = RegimeTable.load(args.evaluate)
    except (OSError, ValueError) as exc:
        print(f"cannot read the table to evaluate: {exc}")
        return 1
    print(f"evaluating {args.evaluate} on {len(cases)} held-out masks on {prov['gpu']} "
          f"(sm_{arch}) into {args.out}, budget {args.budget_minutes:g} min", file=sys.stderr)
    try:
        doc = evaluate(cases, table=table, out=args.out, arch=arch,
                       **_gpu_run_options(args, prov))
    except (FileExistsError, ValueError) as exc:
        print(exc)
        return 1
    print(format_summary(doc.get("summary")))
    return 0


def format_summary(summary: dict | None) -> str:
    """A few lines of :func:`summarize_evaluation`'s figures, for the terminal."""
    if not summary:
        return "no masks evaluated"
    lines = []
    for obj, m in summary.items():
        if not isinstance(m, dict):
            continue
        lines.append(
            f"{obj:8}: {m['masks']} masks, within 5% of the oracle {100 * m['within_5pct']:.0f}%"
            f", mean slowdown {100 * m['mean_slowdown']:.1f}%, worst x{m['worst']:.2f}; best "
            f"fixed regime {m['best_fixed']} x{m['gain_vs_best_fixed']:.3f}, heuristic "
            f"x{m['gain_vs_default']:.3f} (their total time / the table's)"
            + (f"; the heuristic alone: within 5% {100 * m['default_within_5pct']:.0f}%, worst "
               f"x{m['default_worst']:.2f}" if m.get("default_worst") is not None else ""))
        if m.get("by_shape"):  # (evaluations written before it was recorded have none)
            lines.append("          by shape, within 5% (table / heuristic): " + "; ".join(
                f"{shape} {t}/{n} {h}/{n}" for shape, (n, t, h) in sorted(m["by_shape"].items())))
    lines.append(f"exact table keys: {summary.get('exact_keys')}")
    return "\n".join(lines)
