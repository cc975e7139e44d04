"""Planning cost on the host (numpy) and, where CuPy sees a GPU, on the device.

``python benchmarks/plan_speed.py [--profile]``: Wan-1.3B-shaped masks (12 heads, 32,760 tokens)
with 64- and 128-token blocks at 10% density; prints the median plan time of each.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import numpy as np

import tessera


def median_ms(fn, reps=10, sync=None):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    L, H = 32760, 12
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
        has_gpu = True
    except Exception:
        has_gpu = False
    for bs in (64, 128):
        n = -(-L // bs)
        dense = rng.random((H, n, n)) < 0.10
        where = [("host", dense)] + ([("device", cp.asarray(dense))] if has_gpu else [])
        for name, dm in where:
            sync = cp.cuda.Device().synchronize if name == "device" else None

            def build_and_plan():
                m = tessera.BlockMask.from_dense(dm, block_size=bs, seq_len_q=L, seq_len_kv=L)
                return tessera.plan(m, num_q_heads=H, head_dim=128)

            t = median_ms(build_and_plan, sync=sync)
            print(f"{name:6} block {bs:3}: from_dense + plan {t:7.2f} ms")
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(3):
                    build_and_plan()
                if sync:
                    sync()
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
