"""Request time with tessera.attention's kept plans against new plans, in one process: the two
modes alternate every few requests (api.request_plans_kept toggled), so both see the same
machine, clocks and host noise. Each request is timed alone (CUDA events, GPU idle at the
start, new mask object each time) and back to back (20 between synchronizations).

    python3 benchmarks/request_kept.py [--shape cogvideox-5b] [--density 0.1] [--rounds 20]
"""

import argparse
import statistics
import sys

import tessera
from tessera import api
from tessera.bench import cuda_time_ms

from request_hotspots import random_request  # this folder's: run as a script


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="cogvideox-5b")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    h, d, (q, k, v), new_mask = random_request(args.shape, args.density)
    kept_default = api.request_plans_kept

    def request():
        return tessera.attention(q, k, v, new_mask())

    p = tessera.plan(new_mask(), num_q_heads=h, head_dim=d)
    alone = {"kept": [], "new": []}
    b2b = {"kept": [], "new": []}
    kernel = []
    for _ in range(args.rounds):
        kernel.append(cuda_time_ms(lambda: p.run(q, k, v), 5, burst=5))
        for mode, kept in (("kept", kept_default), ("new", 0)):
            api.request_plans_kept = kept
            request()  # the first request of the mode (a kept plan made or replanned)
            alone[mode].append(cuda_time_ms(request, 5))
            b2b[mode].append(cuda_time_ms(lambda: [request() for _ in range(20)], 1) / 20)
    med = statistics.median
    print(f"{args.shape} density {args.density}, {args.rounds} rounds, medians, ms: kernel "
          f"{med(kernel):.3f}; request alone kept {med(alone['kept']):.3f} new "
          f"{med(alone['new']):.3f}; back to back kept {med(b2b['kept']):.3f} new "
          f"{med(b2b['new']):.3f} ({p.regime.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
