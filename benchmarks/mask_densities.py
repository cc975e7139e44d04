"""Densities and generation times of the video mask families (tessera.masks).

``PYTHONPATH=. python benchmarks/mask_densities.py [--device]``

For each family at its default parameters on the WORKLOADS model shapes, prints the logical
density (``BlockMask.density``: selected block pairs / block pairs), the token-pair density
(selected (query, key) token pairs / L^2, averaged over mask heads) and the host generation
time (median of 3 after one warm-up). The data-dependent families (top-k pooled, semantic
clusters) use random normal q, k with 2 heads and D = 64 on the Wan-1.3B shape. ``--device``
adds the same two families computed with CuPy on the GPU at full head counts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tessera import masks as M

# name, latent (t, h, w), heads, text tokens, valid text tokens
SHAPES = [
    ("Wan-1.3B", (21, 30, 52), 12, 0, None),
    ("Wan-14B", (21, 45, 80), 40, 0, None),
    ("HunyuanVideo", (33, 45, 80), 24, 256, 100),
    ("CogVideoX", (13, 30, 45), 48, 226, None),
]


def timed(fn, reps: int = 3, sync=None):
    out = fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t) * 1e3)
    return out, statistics.median(times)


def row(shape: str, label: str, vm: M.VideoMask, ms: float) -> str:
    m = vm.mask.to_host()
    L = m.seq_len_q
    pairs = m.selected_pairs().mean() / (L * m.seq_len_kv)
    bh = "x".join(str(x) for x in m.batch_heads)
    return (f"| {shape} | {label} | {L} | {m.num_q_blocks}x{m.num_kv_blocks} | {bh} | "
            f"{m.density:.3f} | {pairs:.3f} | {ms:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", action="store_true", help="also time the CuPy paths")
    args = ap.parse_args()

    print("| shape | family (params) | L | blocks | mask BxH | block density | "
          "token-pair density | gen ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name, lat, heads, text, valid in SHAPES:
        L = int(np.prod(lat)) + text
        tx = dict(text_tokens=text, text_valid=valid)
        fams = [
            ("sliding_tile tile 6x8x8 win 3x3x3", lambda: M.sliding_tile(lat, **tx)),
            ("sliding_tile per-head (3,3,3)/(1,5,7)/(3,1,10)",
             lambda: M.sliding_tile(lat, window=[(3, 3, 3), (1, 5, 7), (3, 1, 10)]
                                    * (heads // 3) + [(3, 3, 3)] * (heads % 3), **tx)),
            ("spatial_temporal spatial w=1", lambda: M.spatial_temporal(lat, **tx)),
            ("spatial_temporal temporal w=1 (token-major)",
             lambda: M.spatial_temporal(lat, heads="temporal", **tx)),
            ("spatial_temporal temporal w=1 position rule (token-major)",
             lambda: M.spatial_temporal(lat, heads="temporal", temporal_rule="position", **tx)),
            ("spatial_temporal half/half heads (original order)",
             lambda: M.spatial_temporal(lat, heads=["spatial", "temporal"] * (heads // 2), **tx)),
            ("radial dense_distance=1 sink", lambda: M.radial(lat, **tx)),
            ("random_blocks 128 density 0.1", lambda: M.random_blocks(heads, L, **tx)),
        ]
        for label, fn in fams:
            vm, ms = timed(fn)
            print(row(name, label, vm, ms), flush=True)

    name, lat, _, _, _ = SHAPES[0]
    rng = np.random.default_rng(0)
    n = int(np.prod(lat))
    q = rng.standard_normal((2, n, 64), dtype=np.float32)
    k = rng.standard_normal((2, n, 64), dtype=np.float32)
    data_fams = [
        ("topk_pooled cube 4x4x4 topk=10% (2 heads, D=64, random q/k)",
         lambda q, k: M.topk_pooled(q, k, lat)),
        ("topk_pooled cube 4x4x4 top_p=0.9 (2 heads, D=64, random q/k)",
         lambda q, k: M.topk_pooled(q, k, lat, top_p=0.9)),
        ("semantic_clusters 128 q / 512 kv, top_p 0.9, min 10% (2 heads, D=64, random q/k)",
         lambda q, k: M.semantic_clusters(q, k, 128, 512)),
    ]
    for label, fn in data_fams:
        vm, ms = timed(lambda: fn(q, k))
        print(row(name, label, vm, ms), flush=True)

    if args.device:
        import cupy as cp

        sync = cp.cuda.Device().synchronize
        for name, lat, heads, text, valid in (SHAPES[0], SHAPES[2]):
            n = int(np.prod(lat)) + text
            g = cp.random.default_rng(0)
            qd = g.standard_normal((1, heads, n, 128), dtype=cp.float32).astype(cp.float16)
            kd = g.standard_normal((1, heads, n, 128), dtype=cp.float32).astype(cp.float16)
            tx = dict(text_tokens=text, text_valid=valid)
            for label, fn in [
                (f"topk_pooled topk=10% (CuPy, {heads} heads, D=128, fp16)",
                 lambda: M.topk_pooled(qd, kd, lat, **tx)),
                (f"topk_pooled top_p=0.9 (CuPy, {heads} heads, D=128, fp16)",
                 lambda: M.topk_pooled(qd, kd, lat, top_p=0.9, **tx)),
                (f"semantic_clusters 128/512 (CuPy, {heads} heads, D=128, fp16)",
                 lambda: M.semantic_clusters(qd, kd, 128, 512, **tx)),
            ]:
                vm, ms = timed(fn, sync=sync)
                print(row(name, label, vm, ms), flush=True)


if __name__ == "__main__":
    main()
