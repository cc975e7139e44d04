"""The GPU side of a request: every kernel one ``tessera.attention`` call launches (planner
kernels, the counter's memset, the attention kernel), for ``ncu`` or ``nsys`` to time. Warm-up
requests first, then one marked by a synchronization on each side.

    ncu --metrics gpu__time_duration.sum --launch-skip N python3 benchmarks/request_kernels.py \
        [--shape wan-1.3b-480p] [--density 0.1] [--warm 3]
"""

import argparse

import tessera

from request_hotspots import random_request  # this folder's: run as a script


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan-1.3b-480p")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--warm", type=int, default=3)
    args = ap.parse_args(argv)
    h, d, (q, k, v), new_mask = random_request(args.shape, args.density)
    for _ in range(args.warm + 1):
        torch.cuda.synchronize()
        tessera.attention(q, k, v, new_mask())
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
