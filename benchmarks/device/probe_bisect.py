"""Device smoke probe: tessera.attention from the package dir in argv[1] on small cases, each
printed as it finishes (a hang shows where), against the float64 reference."""
import sys
import time
sys.path.insert(0, sys.argv[1])
import cupy as cp
import numpy as np
import tessera
from tessera import reference
print("tessera from", tessera.__file__, flush=True)
rng = np.random.default_rng(0)
for name, d, blk, dev in [("d64_host", 64, 128, False), ("d64_dev", 64, 128, True),
                          ("d128_dev", 128, 128, True), ("d64_b64_dev", 64, 64, True),
                          ("d96_dev", 96, 128, True)]:
    L, H = 2048, 2
    nb = L // blk
    m = rng.random((H, nb, nb)) < 0.3
    m[:, np.arange(nb), np.arange(nb)] = True
    q, k, v = (cp.asarray(rng.standard_normal((1, H, L, d)), dtype=cp.float16) for _ in range(3))
    bm = tessera.BlockMask.from_dense(cp.asarray(m) if dev else m, block_size=blk)
    t = time.time()
    o = tessera.attention(q, k, v, bm)
    cp.cuda.Device().synchronize()
    t1 = time.time()
    ref = reference.attention(q, k, v, tessera.BlockMask.from_dense(m, block_size=blk))
    err = np.abs(cp.asnumpy(o).astype(np.float64) - ref).max() / np.abs(ref).max()
    print(f"{name}: rel err {err:.2e} nan {bool(cp.isnan(o).any())} first call {t1 - t:.1f}s",
          flush=True)
