"""Semantic clusters (SVG2): k-means on q and k, tokens permuted so clusters are contiguous
(variable-size blocks), key clusters kept by top-p of the centroid scores."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._array import to_numpy
from ..checks import check_fraction, check_int
from ..mask import BlockMask
from .common import (bounds_from_sizes, check_qk, segment_sums, text_counts, top_p_rows, with_text,
                     with_text_identity)
from .video import VideoMask


def _kmeans(x: Any, k: int, iters: int, seed: int, xp) -> Any:
    """Lloyd's k-means on ``x [N, D]`` (float32): labels ``[N]`` (int64, same module).

    Initialization (on the host, so numpy and CuPy agree): k-means++ (D^2 sampling) over
    ``min(N, 8k)`` candidate tokens drawn with ``numpy.random.default_rng(seed)``. Each
    iteration then assigns every token to its nearest centroid and moves each non-empty
    cluster's centroid to its mean (an empty cluster keeps its centroid). The labels returned
    are the assignment to the final centroids.
    """
    n = x.shape[0]
    rng = np.random.default_rng(seed)
    cand_idx = np.sort(rng.choice(n, size=min(n, 8 * k), replace=False))
    cand = to_numpy(x[xp.asarray(cand_idx)]).astype(np.float64)
    chosen = [int(rng.integers(cand.shape[0]))]
    d2 = ((cand - cand[chosen[0]]) ** 2).sum(axis=1)
    for _ in range(k - 1):
        cum = np.cumsum(d2)
        total = cum[-1]
        if total > 0:
            j = int(np.searchsorted(cum, rng.random() * total, side="right"))
            j = min(j, cand.shape[0] - 1)
        else:  # fewer distinct points than clusters: any unused candidate
            j = int(np.flatnonzero(~np.isin(np.arange(cand.shape[0]), chosen))[0])
        chosen.append(j)
        d2 = np.minimum(d2, ((cand - cand[j]) ** 2).sum(axis=1))
    c = xp.asarray(cand[chosen].astype(np.float32))

    def assign(c):
        d = (c * c).sum(axis=1)[None, :] - 2.0 * (x @ c.T)
        return d.argmin(axis=1)

    for _ in range(iters):
        lab = assign(c)
        order = xp.argsort(lab, kind="stable")
        counts = to_numpy(xp.bincount(lab, minlength=k))
        nz = counts > 0
        b = bounds_from_sizes(counts[nz])
        sums = segment_sums(x[order], b, xp)
        nz_idx = xp.asarray(np.nonzero(nz)[0])
        c[nz_idx] = (sums / xp.asarray(counts[nz], dtype=np.float64)[:, None]).astype(np.float32)
    return assign(c).astype(np.int64)


def _cluster_order(labels: Any, k: int, xp) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, sizes)``: tokens sorted by cluster (stable), and the non-empty clusters' sizes."""
    perm = to_numpy(xp.argsort(labels, kind="stable")).astype(np.int64)
    counts = to_numpy(xp.bincount(labels, minlength=k)).astype(np.int64)
    return perm, counts[counts > 0]


def semantic_clusters(q: Any, k: Any, num_q_clusters: int, num_kv_clusters: int,
                      top_p: float = 0.9, min_fraction: float = 0.1, iters: int = 10,
                      seed: int = 0, text_tokens: int = 0,
                      text_valid: int | None = None) -> VideoMask:
    """Semantic-aware permutation (SVG2): k-means clusters of q and of k as variable blocks.

    * Clustering: k-means (:func:`_kmeans`, ``iters`` Lloyd iterations, deterministic ``seed``)
      on the video tokens of q and, separately, of k, each averaged over batch and heads first
      (so that the mask has one query order and one key order for all its heads; per-head
      clustering would need a permutation per head). Empty clusters are dropped.
    * Order: queries sorted by q cluster (``permutation``), keys/values by k cluster
      (``kv_permutation``); stable, so tokens keep their original order within a cluster.
      Blocks are the clusters: ``q_bounds`` from q cluster sizes, ``kv_bounds`` from k's.
    * Selection, per (batch, head): centroids are that head's mean q (k) over each cluster;
      ``p_ij = softmax_j(c_q_i . c_k_j / sqrt(D) + log |K_j|)`` estimates the attention mass of
      key cluster ``j`` (each key replaced by its centroid). Query cluster ``i`` keeps key
      clusters in descending ``p_ij`` until the kept mass reaches ``top_p`` (the smallest such
      prefix), and at least ``ceil(min_fraction * num key clusters)`` of them.

    Args:
        q, k: ``[B, H, L, D]`` or ``[H, L, D]`` in original order (video tokens then
            ``text_tokens`` text tokens); k may have fewer heads (GQA). CuPy arrays compute on
            the device (the permutations come back to the host).
        num_q_clusters, num_kv_clusters: k-means cluster counts (capped at the token count).
    """
    num_q_clusters = check_int(num_q_clusters, "num_q_clusters", 1)
    num_kv_clusters = check_int(num_kv_clusters, "num_kv_clusters", 1)
    top_p = check_fraction(top_p, "top_p")
    min_fraction = check_fraction(min_fraction, "min_fraction", zero=True)
    iters = check_int(iters, "iters", 1)
    seed = check_int(seed, "seed", 0)
    text_counts(text_tokens, text_valid)
    q, k, xp = check_qk(q, k, None)
    B, H, L, D = q.shape
    n_video = L - text_tokens
    if n_video <= 0:
        raise ValueError(f"q/k have {L} tokens, not more than text_tokens={text_tokens}")
    kq, kk = min(num_q_clusters, n_video), min(num_kv_clusters, n_video)
    qv, kv = q[:, :, :n_video], k[:, :, :n_video]
    lab_q = _kmeans(qv.astype(np.float32).mean(axis=(0, 1)), kq, iters, seed, xp)
    lab_k = _kmeans(kv.astype(np.float32).mean(axis=(0, 1)), kk, iters, seed + 1, xp)
    perm_q, size_q = _cluster_order(lab_q, kq, xp)
    perm_k, size_k = _cluster_order(lab_k, kk, xp)
    qb, kb = bounds_from_sizes(size_q), bounds_from_sizes(size_k)
    cq = segment_sums(xp.take(qv, xp.asarray(perm_q), axis=2), qb, xp) / xp.asarray(
        size_q, dtype=np.float64)[:, None]
    ck = segment_sums(xp.take(kv, xp.asarray(perm_k), axis=2), kb, xp) / xp.asarray(
        size_k, dtype=np.float64)[:, None]
    logits = cq @ ck.swapaxes(-1, -2) / math.sqrt(D) + xp.log(
        xp.asarray(size_k, dtype=np.float64))
    min_keep = int(math.ceil(min_fraction * size_k.size - 1e-9))
    video = top_p_rows(logits, top_p, min_keep, xp)
    dense, qbt, kbt = with_text(video, qb, kb, text_tokens, text_valid)
    mask = BlockMask.from_dense(dense, q_bounds=qbt, kv_bounds=kbt)
    params = dict(num_q_clusters=int(num_q_clusters), num_kv_clusters=int(num_kv_clusters),
                  q_clusters_nonempty=int(size_q.size), kv_clusters_nonempty=int(size_k.size),
                  top_p=top_p, min_fraction=min_fraction, iters=iters, seed=seed,
                  text_tokens=text_tokens, text_valid=text_valid, batch=B, heads=H)
    return VideoMask(mask, with_text_identity(perm_q, text_tokens), "semantic_clusters",
                     params, kv_permutation=with_text_identity(perm_k, text_tokens))
