"""One plan of a ``bench`` mask case, or a peer's call on it, run a few times: a program for
Nsight Compute to profile (``ncu --kernel-name bsa_fwd_sm90 --launch-skip 2 --launch-count 1
python3 benchmarks/one_launch.py --shape S --case C``), which prints the regime and the plan's
stats. The last run sits in an NVTX range named ``profiled``, so ``ncu --nvtx --nvtx-include
profiled/`` profiles every kernel of exactly one call, a peer's too (``--peer``: cuDNN's
block-sparse attention as ``bench`` configures it, FlashAttention-4 dense through
FlexAttention's FLASH backend, cuDNN's dense SDPA).

The masks are drawn as ``python -m tessera bench`` draws them (its generator seeded 0, the
case first in its list), bf16 ``[1, H, L, D]`` inputs; the regime is what a plan takes on this
GPU unless ``--regime`` names one. ``--heads`` below the model's makes a shorter launch, for
Nsight Compute's instruction-level data (SourceCounters replays even an 8-head launch for
minutes; PC sampling alone, ``--metrics group:smsp__pcsamp_warp_stall_reasons``, takes seconds
and ``--page source`` lists its samples by instruction); such a plan may take another regime
(few heads consult the regime table), so name the model's with ``--regime`` to profile its
kernel.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    import tessera


def main(argv: list[str] | None = None) -> int:
    import cupy as cp
    import torch

    import tessera
    from tessera.families.common import variable_bounds
    from tessera.runtime.regime import regime_from_name
    from tessera.tools.bench import CASES
    from tessera.tools.workloads import WORKLOADS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--regime", help="a Regime name (default: the plan's own selection)")
    ap.add_argument("--runs", type=int, default=3, help="launches (profile the last)")
    ap.add_argument("--heads", type=int, help="query heads (default: the model's); fewer make a "
                    "shorter launch, for Nsight Compute's instruction-level sections")
    ap.add_argument("--peer", choices=("cudnn-bsa", "fa4", "sdpa-cudnn"),
                    help="run this peer on the mask instead of Tessera's plan (it must be "
                         "installed; fa4 and sdpa-cudnn compute dense attention)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs must be at least 1, got {args.runs}")
    if args.heads is not None and args.heads < 1:
        ap.error(f"--heads must be at least 1, got {args.heads}")
    regime = None
    if args.regime:
        regime = regime_from_name(args.regime)
        if regime is None:
            ap.error(f"--regime: {args.regime!r} is not a regime name")
    w, c = WORKLOADS[args.shape], CASES[args.case]
    heads = args.heads or w.heads
    L = w.seq_len
    rng = np.random.default_rng(0)
    if c.sizes is not None:
        qb = variable_bounds(rng, L, *c.sizes)
    else:
        qb = c.bounds(L)  # as bench pads 64-token cases to whole blocks
        L = int(qb[-1])
    blocks = cp.asarray(c.make(rng, heads, qb.size - 1))
    mask = tessera.BlockMask.from_dense(blocks, q_bounds=qb, kv_bounds=qb)
    q, k, v = (torch.randn(1, heads, L, w.head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    if args.peer:
        call, what = _peer_call(args.peer, mask, q, k, v)
    else:
        plan = tessera.plan(mask, num_q_heads=heads, head_dim=w.head_dim, dtype="bfloat16",
                            regime=regime)
        call, what = (lambda: plan.run(q, k, v)), f"{plan.regime.name}; {plan.stats()}"
    for i in range(args.runs):
        if i == args.runs - 1:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("profiled")
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"{args.shape} {args.case}: {what}")
    return 0


def _peer_call(peer: str, mask: "tessera.BlockMask", q, k, v) -> tuple[Callable[[], object], str]:
    """The peer's call on ``mask`` (or dense, for the dense peers) and a line naming it."""
    import torch
    import torch.nn.functional as F

    from tessera.tools import peers

    if peer == "cudnn-bsa":
        if not peers.cudnn_bsa_available():
            raise SystemExit("--peer cudnn-bsa: nvidia-cudnn-frontend is not installed")
        inputs = peers.cudnn_bsa_inputs(mask, q.shape[0], q.shape[1], q.device)
        if inputs is None:
            raise SystemExit("--peer cudnn-bsa: the mask is not of uniform 64- or 128-token "
                             "blocks")
        return (lambda: peers.run_cudnn_bsa(q, k, v, inputs)), \
            f"cuDNN BSA, sparse block {inputs.block}, kv_splits={inputs.kv_splits!r}"
    if peer == "fa4":
        if not peers.fa4_available():
            raise SystemExit("--peer fa4: flash-attn-4 is not installed")
        flex = peers.compiled_flex()
        return (lambda: flex(q, k, v, kernel_options={"BACKEND": "FLASH"})), \
            "FlashAttention-4 dense (FlexAttention's FLASH backend)"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)
    return sdpa, "cuDNN SDPA dense"


if __name__ == "__main__":
    sys.exit(main())
