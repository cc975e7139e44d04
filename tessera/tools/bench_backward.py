"""``python -m tessera bench --backward``: Tessera's backward pass against the peers' backward
passes, in one process, on the WORKLOADS shapes and the bench's mask cases.

Every peer runs at its best on the exact mask (WORKLOADS.md, :mod:`tessera.tools.peers`):
FlexAttention compiled with the blocks as full tiles and its query-major lists (which only its
backward reads), its backward the same compiled call under autograd; cuDNN's
``block_sparse_attention_backward`` on uniform 64- or 128-token blocks (bf16, MHA, head dim
128: where it runs at all), from its own forward's output and LSE; FlashAttention-4's dense
backward on the dense case. Each peer's gradients are compared with Tessera's first (the worst
of dQ, dK, dV), and one that differs is flagged, not timed.

"backward" = one run of a plan's backward pass (``Plan.run_backward``: Delta, dK/dV, dQ) from
the forward's output and LSE, its queues planned already; the peers' the same (their backward
alone). On the Hopper kernels in 128-row tasks the other dQ mode than the default (dQ summed
by atomics, or the deterministic two passes: ``config.deterministic_backward``) is timed beside
it ("alt", ``other_mode``, and its time over the default's). "fwd+bwd" = the forward that
saves what the backward reads, then the backward. Both timed in interleaved rounds with every
peer (:func:`~tessera.tools.timing.interleaved_ms`).
"request" = ``tessera.attention_backward`` on a new mask object: the backward queues planned
(by the planner kernels, without a synchronization), then the kernels. Useful FLOP/s count
the backward as 2.5x the forward's 4 * D * selected pairs (the convention of the
FlashAttention papers).
"""

from __future__ import annotations

import statistics
import sys
from typing import Any, Callable

import tessera

from ..cuda.device import device_cc
from . import peers
from .timing import cuda_time_ms, interleaved_ms
from .workloads import WORKLOADS

__all__ = ["run", "table", "BACKWARD_FLOPS"]

# Backward FLOPs per forward FLOP (the papers' convention: five matrix products against two,
# less the recomputation's share).
BACKWARD_FLOPS = 2.5

# MaskMaker(shape, case, heads) -> (bool block matrix [H', nQB, nKB] on the GPU, q bounds,
# kv bounds): the bench's masks (tessera.tools.bench), handed in so this module needs nothing
# of the bench's own.
MaskMaker = Callable[[str, str, int], tuple[Any, Any, Any]]


def run(shapes: list[str], cases: list[str], make_mask: MaskMaker, *, heads: int | None = None,
        rounds: int = 8, reps: int = 10, batch: int = 1, flex: bool = True,
        kv_heads: int | None = None, dtype: str = "bfloat16") -> list[dict]:
    """Time Tessera's backward and every installed peer's (FlexAttention's unless ``flex`` is
    False) on each (shape, case); one dict of figures per pair (``<peer>_ms``,
    ``bwd_vs_<peer>``, ``<peer>_fwdbwd_ms``, ...). ``kv_heads``: GQA with that many kv heads
    (None: MHA); ``dtype``: "bfloat16" or "float16" (cuDNN's backward takes MHA bf16 only,
    so it sits out the others)."""
    import torch

    if dtype not in ("bfloat16", "float16"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float16', got {dtype!r}")
    element = getattr(torch, dtype)

    flex_fn = None
    try:
        flex_fn = peers.compiled_flex() if flex else None
    except Exception as exc:  # pragma: no cover - depends on the torch build
        print(f"FlexAttention unavailable: {exc}", file=sys.stderr)
    rows: list[dict] = []
    for shape in shapes:
        w = WORKLOADS[shape]
        h, d = heads or w.heads, w.head_dim
        hkv = kv_heads or h
        if h % hkv:
            raise ValueError(f"kv_heads must divide the query heads ({h} on {shape}), got "
                             f"{kv_heads}")
        for case in cases:
            blocks, qb, kb = make_mask(shape, case, h)
            length = int(qb[-1])
            q, do = (torch.randn(batch, h, length, d, device="cuda", dtype=element)
                     for _ in range(2))
            k, v = (torch.randn(batch, hkv, length, d, device="cuda", dtype=element)
                    for _ in range(2))

            def new_mask():
                return tessera.BlockMask.from_dense(blocks, q_bounds=qb, kv_bounds=kb)

            m = new_mask()
            flops = BACKWARD_FLOPS * 4 * d * int(m.selected_pairs(batch, h).sum())
            p = tessera.plan(m, num_q_heads=h, num_kv_heads=hkv, head_dim=d, batch=batch,
                             dtype=dtype)
            out, lse = p.run(q, k, v, return_lse=True)
            ours = p.run_backward(q, k, v, out, lse, do)
            row = dict(shape=shape, case=case, density=round(m.density, 4), tokens=length,
                       useful_tflop=flops / 1e12, heads=h, kv_heads=hkv, dtype=dtype,
                       regime=p.backward_regime(
                           device_cc(), deterministic=tessera.config.deterministic_backward,
                           portable=tessera.config.portable_backward).name)
            found = _peers(q, k, v, do, ours, m, flex_fn, row, dense=case == "dense")

            def fwd_bwd():
                o, l_ = p.run(q, k, v, return_lse=True)
                return p.run_backward(q, k, v, o, l_, do)

            other = not tessera.config.deterministic_backward  # the other dQ mode

            def other_mode():
                with tessera.config.override(deterministic_backward=other):
                    return p.run_backward(q, k, v, out, lse, do)

            calls = {"tessera": lambda: p.run_backward(q, k, v, out, lse, do),
                     "tessera_fwdbwd": fwd_bwd}
            if p.backward_regime(device_cc()).dq == "atomics":
                # (the Hopper kernels in 128-row tasks: both dQ modes run here)
                row["other_mode"] = "deterministic" if other else "atomic"
                row["other_diff"] = max(
                    peers.relative_difference(g, o) for g, o in zip(other_mode(), ours))
                calls["tessera_other"] = other_mode
            for name, (bwd, both) in found.items():
                calls[name] = bwd
                calls[f"{name}_fwdbwd"] = both
            rounds_ms = interleaved_ms(calls, rounds=rounds, reps=3)
            ms = {name: statistics.median(t) for name, t in rounds_ms.items()}
            row.update(tessera_ms=ms["tessera"], tessera_tflops=flops / ms["tessera"] / 1e9,
                       tessera_fwdbwd_ms=ms["tessera_fwdbwd"])
            if "tessera_other" in ms:
                row.update(other_ms=ms["tessera_other"],
                           other_vs_default=ms["tessera_other"] / ms["tessera"])
            for name in found:
                row.update({f"{name}_ms": ms[name], f"{name}_tflops": flops / ms[name] / 1e9,
                            f"bwd_vs_{name}": ms[name] / ms["tessera"],
                            f"{name}_fwdbwd_ms": ms[f"{name}_fwdbwd"],
                            f"fwdbwd_vs_{name}": ms[f"{name}_fwdbwd"] / ms["tessera_fwdbwd"]})
            row["tessera_request_ms"] = cuda_time_ms(
                lambda: tessera.attention_backward(q, k, v, out, lse, do, new_mask()), reps)
            rows.append(row)
            print(f"{shape} {case}: backward {ms['tessera']:.3f} ms", file=sys.stderr)
    return rows


def _grads(outputs: Any, inputs: tuple, do: Any) -> tuple:
    import torch

    return torch.autograd.grad(outputs, inputs, do, retain_graph=True)


def _peers(q, k, v, do, ours, m, flex_fn, row: dict, dense: bool
           ) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Each installed peer's (backward, forward + backward) calls on mask ``m``, its gradients
    compared with Tessera's ``ours`` first: a peer further than PEER_TOLERANCE from them (the
    worst of dQ, dK, dV) is flagged in ``row`` (``<peer>_differs``), not returned."""
    import torch

    found: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {}

    def checked(name: str, grads: tuple) -> bool:
        diff = max(peers.relative_difference(g, o) for g, o in zip(grads, ours))
        return peers.agrees(row, name, diff, "in its gradients (the worst of dQ, dK, dV)")

    leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
    if flex_fn is not None:
        try:
            fm = peers.flex_block_mask(m, q.device, backward=True)
            opts = peers.flex_kernel_options(fm)
            gqa = q.shape[1] != k.shape[1]

            def flex(*xs):
                return flex_fn(*xs, block_mask=fm, kernel_options=opts, enable_gqa=gqa)

            flex_out = flex(*leaves)
            if checked("flex", _grads(flex_out, leaves, do)):
                found["flex"] = (lambda: _grads(flex_out, leaves, do),
                                 lambda: _grads(flex(*leaves), leaves, do))
        except Exception as exc:
            print(f"Flex backward failed: {exc}", file=sys.stderr)
    if peers.cudnn_bsa_available():
        try:
            inputs = peers.cudnn_bsa_inputs(m, q.shape[0], q.shape[1], q.device, k.shape[1])
            # (its sm90 backward: bf16, MHA, head dim 128)
            if (inputs is not None and q.shape[-1] == 128 and q.shape[1] == k.shape[1]
                    and q.dtype == torch.bfloat16):
                oc, lc = peers.run_cudnn_bsa(q, k, v, inputs, return_lse=True)
                if checked("cudnn_bsa", peers.run_cudnn_bsa_backward(q, k, v, oc, lc, do,
                                                                     inputs)):
                    def both():
                        o, l_ = peers.run_cudnn_bsa(q, k, v, inputs, return_lse=True)
                        return peers.run_cudnn_bsa_backward(q, k, v, o, l_, do, inputs)

                    found["cudnn_bsa"] = (
                        lambda: peers.run_cudnn_bsa_backward(q, k, v, oc, lc, do, inputs), both)
                    row["cudnn_bsa_block"] = inputs.block
        except Exception as exc:
            print(f"cuDNN BSA backward failed: {exc}", file=sys.stderr)
    if dense and peers.fa4_available():
        try:
            from flash_attn.cute import flash_attn_func

            blhd = tuple(x.detach().transpose(1, 2).contiguous().requires_grad_()
                         for x in (q, k, v))
            do_blhd = do.transpose(1, 2).contiguous()

            def fa4(*xs):
                res = flash_attn_func(*xs)
                return res[0] if isinstance(res, tuple) else res

            fa4_out = fa4(*blhd)
            grads = tuple(g.transpose(1, 2) for g in _grads(fa4_out, blhd, do_blhd))
            if checked("fa4", grads):
                found["fa4"] = (lambda: _grads(fa4_out, blhd, do_blhd),
                                lambda: _grads(fa4(*blhd), blhd, do_blhd))
        except Exception as exc:
            print(f"FlashAttention-4 backward failed: {exc}", file=sys.stderr)
    return found


def table(rows: list[dict]) -> str:
    """The figures as a fixed-width table: Tessera's backward (ms, useful TFLOP/s), the peers'
    and their ratios to it (above 1: Tessera is faster), forward + backward, the request, and
    the backward regime the plan took."""
    nan = float("nan")
    head = (f"{'shape':22} {'case':12} {'dens':>5} {'bwd':>7} {'TF/s':>5} {'alt':>7} "
            f"{'x':>5} {'flex':>7} "
            f"{'x':>5} {'bsa':>7} {'x':>5} {'fa4':>7} {'x':>5} {'f+b':>7} {'flex x':>6} "
            f"{'bsa x':>6} {'request':>8} regime")
    out = [head]
    for r in rows:
        g = lambda key: r.get(key, nan)  # noqa: E731
        shape = r["shape"]  # GQA's kv heads and fp16 marked
        if r.get("kv_heads") not in (None, r.get("heads")):
            shape += f"/kv{r['kv_heads']}"
        if r.get("dtype") == "float16":
            shape += "/fp16"
        out.append(
            f"{shape:22} {r['case']:12} {r['density']:5.2f} {r['tessera_ms']:7.3f} "
            f"{r['tessera_tflops']:5.0f} {g('other_ms'):7.3f} "
            f"{g('other_vs_default'):5.2f} {g('flex_ms'):7.3f} {g('bwd_vs_flex'):5.2f} "
            f"{g('cudnn_bsa_ms'):7.3f} {g('bwd_vs_cudnn_bsa'):5.2f} {g('fa4_ms'):7.3f} "
            f"{g('bwd_vs_fa4'):5.2f} {r['tessera_fwdbwd_ms']:7.3f} {g('fwdbwd_vs_flex'):6.2f} "
            f"{g('fwdbwd_vs_cudnn_bsa'):6.2f} {r['tessera_request_ms']:8.3f} "
            f"{r.get('regime', '')}")
    return "\n".join(out)
