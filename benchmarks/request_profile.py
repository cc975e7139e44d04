"""Where a request's host time goes, with the regime table in force and without.

``PYTHONPATH=. python3 benchmarks/request_profile.py``: CogVideoX-5B random_blocks (CSR on the
device, fp16 CuPy) and Wan-1.3B sliding_tile (from_dense); median request ms, the time of
``mask_features`` alone, and a cProfile (cumulative) of 10 requests with the table.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import tessera
from tessera.runtime import regime as R
from tessera.workloads import WORKLOADS, example_mask


def med(fn, sync, reps=15):
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def main() -> None:
    import cupy as cp

    sync = cp.cuda.Device().synchronize
    for shape, fam, dense in (("cogvideox-5b", "random_blocks", False),
                              ("wan-1.3b-480p", "sliding_tile", True)):
        w = WORKLOADS[shape]
        vm = example_mask(w, fam, heads=4, head_dim=w.head_dim).mask
        m = (tessera.BlockMask.from_dense(cp.asarray(vm.to_dense()), q_bounds=vm.q_bounds,
                                          kv_bounds=vm.kv_bounds) if dense else vm.to_device())
        q, k, v = (cp.random.standard_normal((1, 4, w.seq_len, w.head_dim), dtype=cp.float32)
                   .astype(cp.float16) for _ in range(3))
        for label, table in (("table", "auto"), ("no table", None)):
            R.use_table(table)
            req = med(lambda: tessera.attention(q, k, v, m), sync)
            feat = med(lambda: R.mask_features(m, head_dim=w.head_dim, dtype="float16", arch=90,
                                               num_q_heads=4, batch=1), sync)
            sel = med(lambda: R.select_regime(m, arch=90, head_dim=w.head_dim, dtype="float16",
                                              num_q_heads=4, batch=1), sync)
            print(f"{shape} {fam} {label:8}: request {req:.2f} ms, mask_features {feat:.3f} ms,"
                  f" select_regime {sel:.3f} ms", flush=True)
        R.use_table("auto")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(10):
            tessera.attention(q, k, v, m)
            sync()
        pr.disable()
        pstats.Stats(pr).sort_stats("cumulative").print_stats(18)


if __name__ == "__main__":
    main()
