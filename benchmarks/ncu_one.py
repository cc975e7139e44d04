"""Run one Tessera kernel on a model-shaped random mask, for ``ncu`` to profile.

``ncu -k regex:bsa_fwd --launch-skip 2 --launch-count 1 python benchmarks/ncu_one.py [density |
family] [shape] [regime]`` (a random mask of 128-token blocks at that density, or a
``tessera.masks`` family at the shape's typical parameters, e.g. ``topk_pooled``; shape: a
``tessera.workloads`` name, Wan-2.1-1.3B by default; regime: a ``plan.regime.name``, e.g.
``sm80_128x64_w4_s2`` for the portable family on any GPU)
"""

import sys

import tessera

from sweep import device_mask  # benchmarks/ (the script's directory)


def main():
    import torch

    from tessera.workloads import WORKLOADS

    what = sys.argv[1] if len(sys.argv) > 1 else "1.0"
    w = WORKLOADS[sys.argv[2] if len(sys.argv) > 2 else "wan-1.3b-480p"]
    b, h, L, d = 1, w.heads, w.seq_len, w.head_dim
    q, k, v = (torch.randn(b, h, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    try:
        density, family = float(what), None
    except ValueError:  # a mask family
        density, family = 0.0, what
    # A device mask, as requests bring them: the plan is then made for this GPU (its default
    # kernel family), not the portable host plan.
    m = device_mask(w, family, density, h)
    from tessera.runtime.regime import regime_from_name

    regime = regime_from_name(sys.argv[3]) if len(sys.argv) > 3 else None
    p = tessera.plan(m, num_q_heads=h, head_dim=d, regime=regime)
    print("regime:", p.regime.name)
    for _ in range(4):
        p.run(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
