"""Kernel variants: which ``.cu`` source, entry point and parameter values one compiled kernel
has, and what it needs to launch (threads, dynamic shared memory, persistence). This module is the
one source of variant values: the loader writes each variant's values, defaults filled in from
:data:`PARAMETERS`, into the ``Config`` struct the kernel sources read (``variant.cuh``).

Pure arithmetic on the variant's values, no CuPy: the regime layer names variants and checks
their shared memory on machines without a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from .device import SM90_SMEM_PER_SM, SM90_SMEM_RESERVED, smem_limit_bytes

__all__ = ["Variant", "smem_bytes", "ROW_GROUP", "WIDE_BN", "WIDE_SPANS", "WIDE_SLACK",
           "has_wide_step", "PARAMETERS", "SM80", "SM90", "BACKWARD_SOURCES", "BWD_ROWS",
           "BACKWARD_KERNELS", "SM90_BACKWARD_KERNELS", "QUANTIZE", "QUANTIZE_KERNELS",
           "backward_block_n", "config_header"]

# The sources of the two attention families, and of the portable backward pass.
SM80 = "sm80/bsa.cu"
SM90 = "sm90/bsa.cu"
# The backward pass: Delta (every GPU), then dK/dV and dQ of either family -- each kernel its own
# source, so each compiles (and is checked for spills) at its own tile.
BWD_ROWS = "bwd_rows.cu"
BACKWARD_SOURCES = {"bsa_bwd_dkdv_sm80": "sm80/bwd_dkdv.cu", "bsa_bwd_dq_sm80": "sm80/bwd_dq.cu",
                    "bsa_bwd_dkdv_sm90": "sm90/bwd_dkdv.cu", "bsa_bwd_dq_sm90": "sm90/bwd_dq.cu"}
BACKWARD_KERNELS = ("bsa_bwd_dkdv_sm80", "bsa_bwd_dq_sm80")
# The 8-bit forward's pre-pass (every GPU): its kernels, in launch order.
QUANTIZE = "quantize.cu"
QUANTIZE_KERNELS = ("quant_channel_partials", "quant_channel_finish", "quant_rows",
                    "quant_v_transposed")
SM90_BACKWARD_KERNELS = ("bsa_bwd_dkdv_sm90", "bsa_bwd_dq_sm90")
_SM80_BACKWARD = tuple(BACKWARD_SOURCES[k] for k in BACKWARD_KERNELS)
_SM90_BACKWARD = tuple(BACKWARD_SOURCES[k] for k in SM90_BACKWARD_KERNELS)


def backward_block_n(head_dim: int, key_major: bool) -> int:
    """Columns a backward step takes (keys for dQ, query rows for dK/dV): 32 for the dK/dV
    kernel at head dims above 64, whose two D-wide accumulators (dK, dV) leave room for two
    32-column score blocks and no more within 255 registers; 64 elsewhere."""
    return 32 if key_major and head_dim > 64 else 64

# The wide key step of the sm90 TMA variants that have one (sm90/traits.cuh WIDE_BN).
WIDE_BN = 192


def has_wide_step(block_m: int, block_n: int, head_dim: int) -> bool:
    """Whether the sm90 TMA variant of this tile shape and head dim has the wide key step
    (``WIDE_BN``): 128x128 tiles at head dim 64, whose stages hold 192 keys beside the two
    consumer warpgroups' accumulators."""
    return (block_m, block_n, head_dim) == (128, 128, 64)


def pv_wait_anchored(block_m: int, block_n: int, head_dim: int, tma: bool,
                     whole_tasks: bool = False) -> bool:
    """Whether the sm90 variant keeps its softmax's first exponentials ahead of the wait for the
    previous P V (``PV_WAIT_ANCHOR``, sm90/softmax.cuh; P's conversions then run between the
    rest): the TMA form of 64x64 tiles at head dim 128, a lone consumer warpgroup a CTA, whose
    exponentials then overlap its own P V (Wan's 64-token top-k 1.055x faster, H200), and the
    whole-span loop of a dense layer at head dim 128 (Wan 1.007x / 1.009x in two machine
    starts). Elsewhere it measured within -2..+2%, and 3% slower on the 128-row tiles' sparse
    walk: the other warpgroup's products already fill the tensor cores (docs/decisions.md)."""
    return tma and ((block_m, block_n, head_dim) == (64, 64, 128)
                    or (whole_tasks and head_dim == 128))


@dataclass(frozen=True)
class Variant:
    """One compiled configuration of a kernel source.

    ``kernel`` names the entry point; ``source`` the ``.cu`` file (relative to ``tessera/cuda``);
    ``macros`` the variant's values of the source's :data:`PARAMETERS` (the others take their
    defaults), written into its ``Config`` struct.
    """

    source: str
    kernel: str
    macros: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    @classmethod
    def bsa_sm80(cls, *, block_m: int, block_n: int, head_dim: int, num_warps: int, stages: int,
                 bf16: bool, min_blocks: int = 1, guard: bool = True) -> "Variant":
        """The portable family (mma.sync). ``guard``: the variant checks the V of chunks whose
        span applies to some of a tile's rows for non-finite values (common/guard.cuh); plans
        whose regime restricts no span (Regime.restricts_rows) run without it."""
        mt = block_m // (16 * num_warps)
        return cls(SM80, "bsa_fwd_sm80", (
            ("BM", block_m), ("BN", block_n), ("D", head_dim), ("WARPS", num_warps), ("MT", mt),
            ("STAGES", stages), ("MIN_BLOCKS", min_blocks), ("BF16", int(bf16))) + (
            () if guard else (("GUARD", 0),)))

    @classmethod
    def bsa_sm90(cls, *, block_m: int, block_n: int, head_dim: int, stages: int,
                 bf16: bool, producer: bool = False, pack_keys: bool = False,
                 tma: bool = False, wide: bool = False, guard: bool = True,
                 rings: int = 1, whole_tasks: bool = False, int8: int = 0) -> "Variant":
        """The Hopper family (sm_90a only): 64 rows per consumer warpgroup, plus a producer
        warpgroup that does all copies when ``producer`` -- then with two Q buffers where they
        fit the sm_90 shared-memory limit (all but 128-row tiles with 128-key steps at head dim
        128), so the next task's Q loads while the current task computes. 64-row producer
        variants split their registers for two CTAs an SM where their shared memory fits (64x64
        at every head dim, 64x128 at head dim 64), for three with TMA copies at 64x64 and head
        dim 64: one CTA would hold the whole register file for a single consumer warpgroup.
        ``pack_keys``: the packed key walk
        (Regime.pack_keys). ``tma``: the producer copies K/V chunks by TMA (producer variants of
        the span-by-span walk only; the launch passes tensor maps). ``wide``
        (Regime.wide_steps): the TMA variant of 128x128 tiles at head dim 64 steps 192 keys at
        a time through tasks of a few long spans (``WIDE_BN``, by the rule of
        tasks.wide_step_tasks; see sm90/traits.cuh); other variants have no wide step and ignore
        it. ``guard``: as for bsa_sm80. ``rings`` (TMA producer, 64-row tiles): lone consumer
        warpgroups a CTA, each on its own tasks and stage ring fed by its own producer warp
        (``RINGS``), one CTA an SM; two Q buffers each where they fit.
        ``whole_tasks`` (Regime.whole_spans; producer variants of the span-by-span walk): every
        task is one span over all its rows, walked by arithmetic in one loop
        (``WHOLE_TASKS``): only for plans whose mask selects every block.
        ``int8`` (``INT8``, sm90/traits.cuh): 1, the 8-bit forward; 2, its 8-bit scores with
        16-bit P V -- the TMA producer of the span-by-span walk, 128-row tiles, no wide step,
        head dim 64 or 128, never the guard."""
        if int8 not in (0, 1, 2):
            raise ValueError(f"int8 must be 0, 1 or 2, got {int8!r}")
        if int8 and not (tma and producer and not pack_keys and rings == 1 and not whole_tasks
                         and block_m == 128 and head_dim in (64, 128) and block_n in (64, 128)):
            raise ValueError("the 8-bit form is the TMA producer's, span by span, 128 rows, at "
                             f"head dim 64 or 128 and 64- or 128-key steps (got {block_m}x"
                             f"{block_n}, head dim {head_dim}, rings={rings})")
        if tma and (not producer or pack_keys):
            raise ValueError("TMA copies are the producer's, for the span-by-span walk")
        if whole_tasks and (not producer or pack_keys):
            raise ValueError("whole_tasks needs the producer's span-by-span walk")
        if rings not in (1, 2, 3, 4) or (rings > 1 and not (tma and block_m == 64)):
            raise ValueError(f"rings must be 1, or 2-4 for the TMA producer's 64-row tiles, got "
                             f"{rings} ({block_m} rows, tma={tma})")
        wide = wide and tma and not int8 and has_wide_step(block_m, block_n, head_dim)
        guard = guard and not int8
        macros = (("BM", block_m), ("BN", block_n), ("D", head_dim), ("STAGES", stages),
                  ("BF16", int(bf16))) + ((("PACK_KEYS", 1),) if pack_keys else ()) + (
                  (("TMA", 1),) if tma else ()) + (
                  (("WIDE_BN", WIDE_BN),) if wide else ()) + (() if guard else (("GUARD", 0),)) + (
                  (("PV_WAIT_ANCHOR", 1),)
                  if pv_wait_anchored(block_m, block_n, head_dim, tma, whole_tasks) else ()) + (
                  (("WHOLE_TASKS", 1),) if whole_tasks else ()) + (
                  (("INT8", int(int8)),) if int8 else ())
        if not producer:
            return cls(SM90, "bsa_fwd_sm90", macros)
        def ws(q_buffers: int, min_blocks: int, aligned: bool = False) -> "Variant":
            return cls(SM90, "bsa_fwd_sm90", macros + (("PRODUCER", 1),) + (
                (("Q_BUFFERS", 2),) if q_buffers == 2 else ()) + (
                (("MIN_BLOCKS", min_blocks),) if min_blocks > 1 else ()) + (
                (("SMEM_ALIGNED", 1),) if aligned else ()))

        if rings > 1:
            ringed = [cls(v.source, v.kernel, v.macros + (("RINGS", rings),))
                      for v in (ws(2, 1), ws(1, 1))]
            return next((v for v in ringed if smem_bytes(v) <= smem_limit_bytes(90)), ringed[-1])
        if block_m == 64:
            # Three CTAs an SM where a TMA producer leaves the consumers enough registers (64x64
            # tiles at head dim 64: 136 each) and three fit: as many consumer warps an SM as
            # the plain variant, none of them copying. Else two: with two Q buffers where they
            # fit (64-key steps at head dims 64, 96; 128-key steps at head dim 64 without the
            # alignment slack), else with one and no slack (64-key steps at head dim 128, 160
            # bytes over with the slack). CI's compile test keeps every such variant
            # spill-free under that register budget.
            three = (ws(2, 3),) if tma and head_dim == 64 and block_n == 64 else ()
            for v in three + (ws(2, 2), ws(2, 2, aligned=True), ws(1, 2, aligned=True)):
                if v.min_blocks * (smem_bytes(v) + SM90_SMEM_RESERVED) <= SM90_SMEM_PER_SM:
                    return v
        two = ws(2, 1)
        return two if smem_bytes(two) <= smem_limit_bytes(90) else ws(1, 1)

    @property
    def tma(self) -> bool:
        """Whether the kernel reads K/V by TMA (its launch must pass the tensor maps)."""
        return bool(dict(self.macros).get("TMA"))

    @property
    def kv_rows(self) -> int:
        """Keys a K/V stage holds: the widest step (``WIDE_BN`` where the variant has one)."""
        return dict(self.macros).get("WIDE_BN") or self.macro("BN")

    @property
    def kv_box_rows(self) -> int:
        """Rows of the K and V tensor maps' boxes (TMA variants): a step's width, or 64 where
        steps of two widths are copied as several boxes."""
        return 64 if dict(self.macros).get("WIDE_BN") else self.macro("BN")

    @property
    def rings(self) -> int:
        """Task streams a CTA runs side by side (``RINGS``; 1 but in ringed variants)."""
        return dict(self.macros).get("RINGS", 1)

    @property
    def min_blocks(self) -> int:
        """CTAs per SM the variant's register budget is set for (``__launch_bounds__``)."""
        return dict(self.macros).get("MIN_BLOCKS", 1)

    @property
    def threads(self) -> int:
        """Threads per CTA of a block-sparse attention variant."""
        if self.source == SM90:
            return (self.macro("BM") // 64 * self.rings
                    + dict(self.macros).get("PRODUCER", 0)) * 128
        if self.source in _SM90_BACKWARD:
            return self.macro("BM") // 64 * 128
        return self.macro("WARPS") * 32

    @property
    def persistent(self) -> bool:
        """Whether a CTA runs a sequence of tasks (grid of at most the CTAs the GPU holds at
        once) rather than one: the warp-specialized sm90 variant."""
        return self.source == SM90 and bool(dict(self.macros).get("PRODUCER"))

    @property
    def local_bytes(self) -> int:
        """Local memory (ptxas' stack frame) the variant uses by design: the sm90 family's copy
        of one row tile's accumulators, which rows a restricted chunk excludes keep across its
        product when its V holds an Inf or NaN (sm90/epilogue.cuh, GuardedRows); 0 elsewhere."""
        if self.source == SM90 and dict(self.macros).get("GUARD", 1):
            return self.macro("D") // 8 * 4 * 4
        return 0

    @classmethod
    def bwd_sm80(cls, kernel: str, *, head_dim: int, bf16: bool, block_m: int = 64,
                 block_n: int | None = None, stages: int = 2) -> "Variant":
        """A kernel of the portable backward (sm80/bwd_*.cu, runs on sm_80 and newer): 16 rows
        a warp, ``block_m`` rows a task (64: what a tile of the backward queues holds), its step
        ``block_n`` (None: :func:`backward_block_n`). ``kernel`` is one of
        :data:`BACKWARD_KERNELS`."""
        if kernel not in BACKWARD_KERNELS:
            raise ValueError(f"the portable backward has {', '.join(BACKWARD_KERNELS)}, got "
                             f"{kernel!r}")
        bn = backward_block_n(head_dim, kernel == "bsa_bwd_dkdv_sm80") if block_n is None \
            else block_n
        return cls(BACKWARD_SOURCES[kernel], kernel, (
            ("BM", block_m), ("BN", bn), ("D", head_dim), ("WARPS", block_m // 16), ("MT", 1),
            ("STAGES", stages), ("BF16", int(bf16))))

    @classmethod
    def bwd_sm90(cls, kernel: str, *, head_dim: int, bf16: bool, block_m: int = 128,
                 block_n: int = 64, atomic_dq: bool = False, tma: bool = False,
                 dq_buffers: int = 1) -> "Variant":
        """A kernel of the Hopper backward (sm90/bwd_*.cu, sm_90a only): 64 rows a warpgroup,
        ``block_m`` rows a task (128, or 64 for masks of 64-token blocks), ``block_n`` columns a
        step, stages of chunks copied by cp.async or, with ``tma``, by TMA: three (a chunk's
        last product runs into the next chunk), or two for 64-row tasks at head dim 128, whose
        shared memory then fits two CTAs an SM. ``kernel`` is one of
        :data:`SM90_BACKWARD_KERNELS`. ``atomic_dq`` (the dK/dV kernel only): it also sums dQ
        into float32 by atomic adds (a chunk's partial through shared memory and one bulk
        reduce), and no dQ kernel runs; 128-row tasks only (at head dim 128 its two warpgroups
        split dQ's columns; on the masks that take 64-row tasks the two passes are faster).
        ``dq_buffers`` (dQ by atomics at head dims 64 and 128): 2 puts alternate chunks'
        partial dQ in two sets of tiles, so a chunk waits for the bulk reduce issued a chunk
        earlier instead of its own predecessor's, just issued; at head dim 128 the second set
        takes the third stage's shared memory (two stages)."""
        if kernel not in SM90_BACKWARD_KERNELS:
            raise ValueError(f"the Hopper backward has {', '.join(SM90_BACKWARD_KERNELS)}, got "
                             f"{kernel!r}")
        if block_m not in (64, 128):
            raise ValueError(f"block_m must be 64 or 128 (a warpgroup or two), got {block_m!r}")
        if atomic_dq and kernel != "bsa_bwd_dkdv_sm90":
            raise ValueError("atomic_dq is a variant of the dK/dV kernel (bsa_bwd_dkdv_sm90)")
        if atomic_dq and block_m != 128:
            raise ValueError("dQ by atomics takes 128-row tasks (block_m=128)")
        if dq_buffers not in (1, 2) or (dq_buffers == 2 and not (atomic_dq and head_dim != 96)):
            raise ValueError(f"dq_buffers must be 1, or 2 with dQ by atomics at head dim 64 or "
                             f"128 (where shared memory holds two sets), got {dq_buffers!r}")
        small = block_m == 64
        return cls(BACKWARD_SOURCES[kernel], kernel, (
            ("BM", block_m), ("BN", block_n), ("D", head_dim),
            ("STAGES", 2 if head_dim == 128 and (small or dq_buffers == 2) else 3),
            ("BF16", int(bf16)))
            + ((("MIN_BLOCKS", 2),) if small else ())
            + ((("ATOMIC_DQ", 1),) if atomic_dq else ()) + ((("TMA", 1),) if tma else ())
            + ((("DQ_BUFFERS", 2),) if dq_buffers == 2 else ()))

    @classmethod
    def bwd_delta(cls, *, head_dim: int, bf16: bool) -> "Variant":
        """The backward pass's Delta = rowsum(dO * O) kernel (bwd_rows.cu, every GPU)."""
        return cls(BWD_ROWS, "bsa_bwd_delta", (("D", head_dim), ("BF16", int(bf16))))

    @classmethod
    def quantize(cls, kernel: str, *, head_dim: int, bf16: bool) -> "Variant":
        """A kernel of the 8-bit forward's pre-pass (quantize.cu, every GPU): one of
        :data:`QUANTIZE_KERNELS`."""
        if kernel not in QUANTIZE_KERNELS:
            raise ValueError(f"quantize.cu has {', '.join(QUANTIZE_KERNELS)}, got {kernel!r}")
        return cls(QUANTIZE, kernel, (("D", head_dim), ("BF16", int(bf16))))

    @classmethod
    def bwd_dq_convert(cls, *, head_dim: int, bf16: bool) -> "Variant":
        """dQ from the float32 sums of the dK/dV kernel's atomic variant (bwd_rows.cu, the
        same module as :meth:`bwd_delta`'s)."""
        return cls(BWD_ROWS, "bsa_bwd_dq_convert", (("D", head_dim), ("BF16", int(bf16))))

    @classmethod
    def pooled_topk(cls, kernel: str, element: str = "float32") -> "Variant":
        """A kernel of pooled_topk.cu (the device's pooled top-k masks): ``cube_pool`` for
        inputs of ``element`` ("bfloat16", "float16" or "float32"); ``cube_scores`` and
        ``topk_rows`` read float32 whatever the inputs were."""
        if kernel not in ("cube_pool", "cube_scores", "topk_rows"):
            raise ValueError(f"pooled_topk.cu has cube_pool, cube_scores and topk_rows, "
                             f"got {kernel!r}")
        if kernel != "cube_pool" or element == "float32":
            return cls("pooled_topk.cu", kernel, (("F32", 1),) if kernel == "cube_pool" else ())
        if element not in ("bfloat16", "float16"):
            raise ValueError(f"cube_pool reads bfloat16, float16 or float32, got {element!r}")
        return cls("pooled_topk.cu", kernel, (("BF16", int(element == "bfloat16")),))

    @classmethod
    def combine(cls, *, bf16: bool) -> "Variant":
        return cls("combine.cu", "bsa_combine", (("BF16", int(bf16)),))

    def macro(self, name: str) -> int:
        return dict(self.macros)[name]

    @property
    def label(self) -> str:
        """Names the compiled module: the source and macro values (a module may hold several
        kernels, e.g. the planner's; each compiles once)."""
        stem = self.source.removesuffix(".cu").replace("/", "_")
        return stem + "".join(f"_{k.lower()}{v}" for k, v in self.macros)


@functools.lru_cache(maxsize=256)  # asked on every launch
def smem_bytes(v: Variant) -> int:
    """Dynamic shared memory of a block-sparse attention variant (mirrors the formulas in
    sm80/bsa.cu and sm90/smem.cuh); 0 for other kernels."""
    if v.source == SM80:
        lds = v.macro("D") + 8
        return 2 * lds * (v.macro("BM") + v.macro("STAGES") * 2 * v.macro("BN"))
    if v.source in _SM80_BACKWARD:  # two resident tiles, the chunk stages, their LSE and Delta
        lds, bn, stages = v.macro("D") + 8, v.macro("BN"), v.macro("STAGES")
        return 2 * lds * (2 * v.macro("BM") + stages * 2 * bn) + stages * 2 * bn * 4
    if v.source in _SM90_BACKWARD:  # the same, unpadded (swizzled), plus 1 KiB to align tiles
        d, bn, stages = v.macro("D"), v.macro("BN"), v.macro("STAGES")
        macros = dict(v.macros)
        ds = 0
        if macros.get("ATOMIC_DQ"):  # dS^T's tile, the partial dQ's float32 tiles
            ds = 2 * v.macro("BM") * bn + 4 * bn * d * (1 if d == 128 else v.macro("BM") // 64
                                                        ) * macros.get("DQ_BUFFERS", 1)
        barriers = 8 * stages if macros.get("TMA") else 0  # a stage's mbarrier
        return (1024 + 2 * d * (2 * v.macro("BM") + stages * 2 * bn) + ds + stages * 2 * bn * 4
                + barriers)
    if v.source == SM90:  # tiles unpadded (swizzled), plus 1 KiB to align them
        d, stages = v.macro("D"), v.macro("STAGES")
        macros = dict(v.macros)
        q_bufs = macros.get("Q_BUFFERS", 1)
        # producer: full/empty per stage and per Q buffer, four task-index words; with TMA a
        # 16-byte chunk word per stage (STAGED_SPANS)
        barriers = 8 * (2 * stages + 2 * q_bufs + 2) if macros.get("PRODUCER") else 0
        if macros.get("TMA"):
            barriers += 16 * stages
        align = 0 if macros.get("SMEM_ALIGNED") else 1024
        int8 = macros.get("INT8", 0)
        elem, v_elem = (1, 1 if int8 == 1 else 2) if int8 else (2, 2)  # Q/K's, V's bytes
        k_steps = 4 * v.kv_rows if int8 else 0
        ring = (d * (elem * q_bufs * v.macro("BM") + (elem + v_elem) * stages * v.kv_rows)
                + stages * k_steps + barriers)
        return align + v.rings * ring
    return 0


# The wide step's rule, which sm90/walks.cuh's wide_task reads from the Config (WIDE_SPANS,
# WIDE_SLACK): tasks of more spans never take it, nor tasks whose keys in wide steps exceed their
# keys in narrow ones by more than 1 / WIDE_SLACK.
WIDE_SPANS = 4


WIDE_SLACK = 32


# Rows one warp owns in every kernel family (the M of one mma.sync / a quarter of a wgmma M=64).
# Row groups with no valid row may skip their matrix work (the portable kernel skips per warp of
# 16 or 32 rows), so stats count computed pairs per group: an approximation of what runs.
ROW_GROUP = 16


# Each kernel source's compile-time parameters and their defaults (None: every variant sets it).
# sm80/traits.cuh and sm90/traits.cuh say what each one means.
PARAMETERS: dict[str, dict[str, int | None]] = {
    SM80: {"BM": None, "BN": None, "D": None, "WARPS": None, "MT": None, "STAGES": None,
           "BF16": None, "MIN_BLOCKS": 1, "GUARD": 1},
    SM90: {"BM": None, "BN": None, "D": None, "STAGES": None, "BF16": None, "PRODUCER": 0,
           "Q_BUFFERS": 1, "MIN_BLOCKS": 1, "TMA": 0, "RINGS": 1, "SMEM_ALIGNED": 0,
           "PACK_KEYS": 0, "GUARD": 1, "PV_WAIT_ANCHOR": 0, "WHOLE_TASKS": 0, "WIDE_BN": 0,
           "INT8": 0,
           "WIDE_SPANS": WIDE_SPANS, "WIDE_SLACK": WIDE_SLACK},
    **{src: {"BM": None, "BN": None, "D": None, "WARPS": None, "MT": None, "STAGES": None,
             "BF16": None, "MIN_BLOCKS": 1} for src in _SM80_BACKWARD},
    **{src: {"BM": None, "BN": None, "D": None, "STAGES": None, "BF16": None, "MIN_BLOCKS": 1,
             "ATOMIC_DQ": 0, "TMA": 0, "DQ_BUFFERS": 1} for src in _SM90_BACKWARD},
    BWD_ROWS: {"D": None, "BF16": None},
    QUANTIZE: {"D": None, "BF16": None},
    "combine.cu": {"BF16": None},
    "pooled_topk.cu": {"F32": 0, "BF16": 1},
    "plan.cu": {},
}


def config_header(v: Variant) -> str:
    """The text of ``variant.cuh`` for ``v``: a ``Config`` struct holding every parameter of its
    source, its own values over the defaults. Raises ValueError on a value the source does not
    take or a required one missing."""
    params = PARAMETERS.get(v.source)
    if params is None:
        raise ValueError(f"variant source {v.source!r} is none of {', '.join(PARAMETERS)}")
    given = dict(v.macros)
    unknown = sorted(set(given) - set(params))
    if unknown:
        raise ValueError(f"{v.source} takes no parameter {', '.join(unknown)} "
                         f"(its parameters: {', '.join(params) or 'none'})")
    values = {**params, **given}
    missing = [k for k, x in values.items() if x is None]
    if missing:
        raise ValueError(f"{v.label} leaves {', '.join(missing)} unset")
    fields = "".join(f"  static constexpr int {k} = {int(x)};\n" for k, x in values.items())
    return (f"// The parameters of kernel variant {v.label}, written by tessera/cuda/loader.py\n"
            f"// from tessera/cuda/variants.py.\n#pragma once\n\nstruct Config {{\n{fields}}};\n")
