"""Shared by the family tests (not a test module)."""

from __future__ import annotations

import numpy as np

from tessera import families as M


def dense(vm: M.VideoMask) -> np.ndarray:
    """[B, H, nQB, nKB] host bool."""
    return np.asarray(vm.mask.to_dense())


def is_permutation(p, n):
    return p.dtype == np.int64 and p.shape == (n,) and np.array_equal(np.sort(p), np.arange(n))


def separated_qk(rng, n_heads=2, d=8):
    """q tokens around 3 well-separated points, k tokens around 4 (same for every head)."""
    L = 60
    cq = 10 * np.eye(d)[:3]
    ck = 10 * np.eye(d)[3:7]
    lq = rng.integers(0, 3, L)
    lk = rng.integers(0, 4, L)
    lq[:3] = [0, 1, 2]
    lk[:4] = [0, 1, 2, 3]
    q = cq[lq] + 0.01 * rng.standard_normal((L, d))
    k = ck[lk] + 0.01 * rng.standard_normal((L, d))
    scale = np.linspace(0.5, 1.5, n_heads)[:, None, None]
    return (scale * q).astype(np.float32), (scale * k).astype(np.float32), lq, lk
