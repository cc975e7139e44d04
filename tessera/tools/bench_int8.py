"""``python -m tessera bench --precision int8[,int8-qk]``: the 8-bit forwards
(``tessera.attention(..., precision=P)``) against Tessera's own bf16 forward and cuDNN's FP8
block-sparse forward, in one process, on the WORKLOADS shapes and the bench's mask cases.

Tessera's forwards are timed as requests (a kept plan replanned for the mask, then the
kernels; an 8-bit one's pre-pass included: it has no plan that keeps its codes), back to back
(``BURST`` calls between two events, as a model's layer loop issues them). cuDNN's FP8 forward
("Sage FP8", ``block_sparse_attention_fp8_forward``) quantizes its bf16 inputs itself, so its
call is the like of ours; it runs on sm90 at head dim 128, MHA, lengths that are multiples of
its block, and masks whose query blocks all select the same number of key blocks (top-k
cases). Each 8-bit output is compared with Tessera's bf16 output first (``<name>_diff``); a
peer further than FP8_PEER_TOLERANCE computes something else and is flagged, not timed.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any, Callable

import tessera

from . import peers
from .timing import interleaved_ms
from .workloads import WORKLOADS

__all__ = ["run", "table", "FP8_PEER_TOLERANCE", "BURST"]

# An 8-bit forward's distance from the bf16 output is its rounding error (Tessera's 8-bit:
# ~1.5e-2 on random inputs, RESULTS Q1); beyond this it computes something else.
FP8_PEER_TOLERANCE = 0.1
BURST = 4

# MaskMaker(shape, case, heads) -> (bool block matrix [H', nQB, nKB] on the GPU, q bounds,
# kv bounds): the bench's masks (tessera.tools.bench).
MaskMaker = Callable[[str, str, int], tuple[Any, Any, Any]]


def run(shapes: list[str], cases: list[str], make_mask: MaskMaker, *, heads: int | None = None,
        rounds: int = 8, precisions: tuple[str, ...] = ("int8",)) -> list[dict]:
    """Time the 8-bit forwards of ``precisions``, the bf16 forward and (where it runs) cuDNN's
    FP8 forward on each (shape, case) in interleaved rounds; one dict of figures per pair:
    ``bf16_ms``, for each precision P ``P_ms``, ``P_tflops``, ``P_speedup`` (bf16's time over
    P's), ``P_diff`` (its distance from the bf16 output) and ``P_vs_cudnn_fp8``, and
    ``cudnn_fp8_ms``, ``cudnn_fp8_diff``."""
    import torch

    rows: list[dict] = []
    for shape in shapes:
        w = WORKLOADS[shape]
        h, d = heads or w.heads, w.head_dim
        for case in cases:
            blocks, qb, kb = make_mask(shape, case, h)
            length = int(qb[-1])
            q, k, v = (torch.randn(1, h, length, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            m = tessera.BlockMask.from_dense(blocks, q_bounds=qb, kv_bounds=kb)
            flops = 4 * d * int(m.selected_pairs(1, h).sum())
            row = dict(shape=shape, case=case, density=round(m.density, 4), heads=h,
                       useful_tflop=flops / 1e12)
            bf16 = tessera.attention(q, k, v, m)
            calls = {"bf16": lambda: tessera.attention(q, k, v, m)}
            for p in precisions:
                calls[p] = lambda p=p: tessera.attention(q, k, v, m, precision=p)
                row[f"{p}_diff"] = peers.relative_difference(calls[p](), bf16)
            inputs = peers.cudnn_bsa_inputs(m, 1, h, q.device) if (
                peers.cudnn_bsa_available()) else None
            if peers.cudnn_fp8_runs(inputs, length, d, True):
                try:
                    out = peers.run_cudnn_bsa_fp8(q, k, v, inputs)
                    diff = row["cudnn_fp8_diff"] = peers.relative_difference(out, bf16)
                    if diff <= FP8_PEER_TOLERANCE:
                        calls["cudnn_fp8"] = lambda: peers.run_cudnn_bsa_fp8(q, k, v, inputs)
                    else:
                        row["cudnn_fp8_differs"] = True
                        print(f"\ncuDNN FP8 differs from bf16 by {diff:.2e} on {shape}/{case}",
                              file=sys.stderr)
                except Exception as exc:
                    print(f"\ncuDNN FP8 failed on {shape}/{case}: {exc}", file=sys.stderr)
            rounds_ms = interleaved_ms(calls, rounds=rounds, reps=3, burst=BURST)
            ms = {name: statistics.median(t) for name, t in rounds_ms.items()}
            row.update(rounds_ms=rounds_ms, bf16_ms=ms["bf16"], precisions=list(precisions))
            if "cudnn_fp8" in ms:
                row["cudnn_fp8_ms"] = ms["cudnn_fp8"]
            for p in precisions:
                row.update({f"{p}_ms": ms[p], f"{p}_tflops": flops / ms[p] / 1e9,
                            f"{p}_speedup": ms["bf16"] / ms[p]})
                if "cudnn_fp8" in ms:
                    row[f"{p}_vs_cudnn_fp8"] = ms["cudnn_fp8"] / ms[p]
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """The figures as a fixed-width table, a line per 8-bit precision of each (shape, case):
    its request (ms, useful TFLOP/s), the bf16 one and its time over the 8-bit one's, cuDNN
    FP8's and its time over ours (above 1: Tessera is faster), and both 8-bit outputs'
    distances from the bf16 output."""
    nan = float("nan")
    out = [f"{'shape':16} {'case':12} {'dens':>5} {'precision':9} {'ms':>7} {'TF/s':>5} "
           f"{'bf16':>7} {'x':>5} {'cdnFP8':>7} {'x':>5} {'diff':>8} {'cdn diff':>8}"]
    for r in rows:
        g = lambda key: r.get(key, nan)  # noqa: E731
        for p in r["precisions"]:
            out.append(f"{r['shape']:16} {r['case']:12} {r['density']:5.2f} {p:9} "
                       f"{r[p + '_ms']:7.3f} {r[p + '_tflops']:5.0f} {r['bf16_ms']:7.3f} "
                       f"{r[p + '_speedup']:5.2f} {g('cudnn_fp8_ms'):7.3f} "
                       f"{g(p + '_vs_cudnn_fp8'):5.2f} {r[p + '_diff']:8.1e} "
                       f"{g('cudnn_fp8_diff'):8.1e}")
    return "\n".join(out)
