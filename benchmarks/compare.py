"""Tessera vs dense SDPA (cuDNN, flash) vs FlexAttention, in one process, on the WORKLOADS shapes.

Run on a GPU machine with PyTorch: ``python benchmarks/compare.py [--quick] [--json FILE]``.
Prints one row per (shape, mask): kernel ms, useful TFLOP/s, request ms (plan + run with a new
mask each call), and ratios. Useful FLOPs = 4 * D * selected (query, key) pairs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

import tessera

SHAPES = {  # name: (B, H, L, D)
    "wan-1.3b": (1, 12, 32760, 128),
    "cogvideox-5b": (1, 48, 17776, 64),
}


def bench(fn, reps=20, warmup=3):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def band_mask(n, h, width):
    i = np.arange(n)
    band = np.abs(i[:, None] - i[None, :]) <= width
    return np.broadcast_to(band, (h, n, n)).copy()


def masks_for(h, n, rng):
    return {
        "random 10%": rng.random((h, n, n)) < 0.10,
        "random 30%": rng.random((h, n, n)) < 0.30,
        "band 16%": band_mask(n, h, int(0.08 * n)),
        "dense": np.ones((h, n, n), bool),
    }


def main(argv=None):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-flex", action="store_true")
    args = ap.parse_args(argv)
    reps = 5 if args.quick else 20
    rng = np.random.default_rng(0)
    rows = []
    flex = None
    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import BlockMask as FlexMask, flex_attention

            flex = torch.compile(flex_attention)
        except Exception as exc:  # pragma: no cover
            print("FlexAttention unavailable:", exc, file=sys.stderr)
    for name in args.shapes.split(","):
        b, h, L, d = SHAPES[name]
        q, k, v = (torch.randn(b, h, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        dense_flops = 4 * d * L * L * b * h
        sd = {}
        for be, label in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
            try:
                with sdpa_kernel(be):
                    sd[label] = bench(lambda: F.scaled_dot_product_attention(q, k, v), reps)
            except Exception as exc:
                print(f"sdpa {label} failed: {exc}", file=sys.stderr)
        n = math.ceil(L / 128)
        for mname, dense in masks_for(h, n, rng).items():
            mask_dev = torch.from_numpy(dense).cuda()
            bm = tessera.BlockMask.from_dense(mask_dev, block_size=128, seq_len_q=L, seq_len_kv=L)
            pairs = int(bm.selected_pairs(b, h).sum())
            flops = 4 * d * pairs
            p = tessera.plan(bm, num_q_heads=h, head_dim=d, batch=b)
            t_kernel = bench(lambda: p.run(q, k, v), reps)

            def request():
                m = tessera.BlockMask.from_dense(mask_dev, block_size=128, seq_len_q=L,
                                                 seq_len_kv=L)
                return tessera.attention(q, k, v, m)
            t_req = bench(request, reps)
            t_plan = bench(lambda: tessera.plan(tessera.BlockMask.from_dense(
                mask_dev, block_size=128, seq_len_q=L, seq_len_kv=L), num_q_heads=h,
                head_dim=d, batch=b), reps)
            row = dict(shape=name, mask=mname, density=round(bm.density, 4),
                       tessera_ms=t_kernel, tessera_tflops=flops / t_kernel / 1e9,
                       tessera_request_ms=t_req, tessera_plan_ms=t_plan,
                       stats=str(p.stats()))
            for label, t in sd.items():
                row[f"sdpa_{label}_ms"] = t
                row[f"sdpa_{label}_tflops"] = dense_flops / t / 1e9
            if flex is not None:
                try:
                    def build():
                        knb = mask_dev.sum(-1, dtype=torch.int32)[None]
                        kidx = torch.argsort(~mask_dev, dim=-1, stable=True).to(torch.int32)[None]
                        return FlexMask.from_kv_blocks(knb, kidx, BLOCK_SIZE=128,
                                                       seq_lengths=(L, L))
                    fm = build()
                    t_flex = bench(lambda: flex(q, k, v, block_mask=fm), reps)
                    t_build = bench(build, reps)
                    t_flex_req = bench(lambda: flex(q, k, v, block_mask=build()), reps)
                    row.update(flex_ms=t_flex, flex_tflops=flops / t_flex / 1e9,
                               flex_build_ms=t_build, flex_request_ms=t_flex_req,
                               kernel_vs_flex=t_flex / t_kernel,
                               request_vs_flex=t_flex_req / t_req)
                except Exception as exc:
                    print(f"flex failed on {name}/{mname}: {exc}", file=sys.stderr)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(),
                           rows=rows), f, indent=1)
    hdr = (f"{'shape':13} {'mask':11} {'dens':>5} {'tes ms':>7} {'TF/s':>5} {'req ms':>7} "
           f"{'plan':>6} {'flex ms':>7} {'TF/s':>5} {'freq ms':>7} {'k x':>5} {'req x':>5} "
           f"{'cudnn TF':>8} {'fa2 TF':>6}")
    print(hdr)
    for r in rows:
        print(f"{r['shape']:13} {r['mask']:11} {r['density']:5.2f} {r['tessera_ms']:7.2f} "
              f"{r['tessera_tflops']:5.0f} {r['tessera_request_ms']:7.2f} {r['tessera_plan_ms']:6.2f} "
              f"{r.get('flex_ms', float('nan')):7.2f} {r.get('flex_tflops', float('nan')):5.0f} "
              f"{r.get('flex_request_ms', float('nan')):7.2f} {r.get('kernel_vs_flex', float('nan')):5.2f} "
              f"{r.get('request_vs_flex', float('nan')):5.2f} {r.get('sdpa_cudnn_tflops', float('nan')):8.0f} "
              f"{r.get('sdpa_flash_tflops', float('nan')):6.0f}")


if __name__ == "__main__":
    main()
