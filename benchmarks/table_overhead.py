"""What looking a mask up in the regime table adds to a request: the mask measures alone, and
planning / a whole request with the heuristic vs with the table, in one process (H200 script:
benchmarks/device/call_z.sh). Masks are new device tensors every call, as in `tessera bench`."""

import argparse
import math
import sys

import numpy as np

import tessera
from tessera.bench import cuda_time_ms
from tessera.runtime import regime as R
from tessera.workloads import WORKLOADS


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--table", required=True)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    table = R.RegimeTable.load(args.table)
    print(f"{'shape':14} {'density':>7} {'measure':>8} {'plan h':>7} {'plan t':>7} "
          f"{'req h':>7} {'req t':>7}  regime (table)")
    for shape in ("wan-1.3b-480p", "cogvideox-5b"):
        w = WORKLOADS[shape]
        h, d, L = w.heads, w.head_dim, w.seq_len
        q, k, v = (torch.randn(1, h, L, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        n = math.ceil(L / 128)
        for dens in (0.1, 0.3):
            blocks = torch.from_numpy(np.random.default_rng(0).random((h, n, n)) < dens).cuda()

            def new_mask():
                return tessera.BlockMask.from_dense(blocks, block_size=128, seq_len_q=L,
                                                    seq_len_kv=L)

            t_meas = cuda_time_ms(lambda: R.mask_measures(new_mask()), args.reps)
            row = {}
            for label, t in (("h", None), ("t", table)):
                R.use_table(t)
                row[f"plan {label}"] = cuda_time_ms(
                    lambda: tessera.plan(new_mask(), num_q_heads=h, head_dim=d), args.reps)
                row[f"req {label}"] = cuda_time_ms(
                    lambda: tessera.attention(q, k, v, new_mask()), args.reps)
            name = tessera.plan(new_mask(), num_q_heads=h, head_dim=d).regime.name
            R.use_table(None)
            print(f"{shape:14} {dens:7.2f} {t_meas:8.3f} {row['plan h']:7.3f} "
                  f"{row['plan t']:7.3f} {row['req h']:7.3f} {row['req t']:7.3f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
