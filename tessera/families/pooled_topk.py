"""Top-k (or top-p) key cubes per query cube from mean-pooled q and k (VSA-style 4x4x4 cubes)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..mask import BlockMask
from .common import (
    Latent,
    bounds_from_sizes,
    check_latent,
    check_qk,
    check_triple,
    device_copy,
    is_int,
    segment_sums,
    sorted_keep,
    text_counts,
    top_p_rows,
    with_text,
    with_text_identity,
)
from .video import VideoMask, tile_permutation


def _cube_pool(x: Any, lat: Latent, cube: tuple[int, int, int], xp) -> Any:
    """Mean of ``x [B, H, T*H*W, D]`` (frame-major video tokens) over each cube, in cube order."""
    T, Hh, W = lat
    ct, ch, cw = cube
    gt, gh, gw = -(-T // ct), -(-Hh // ch), -(-W // cw)
    B, H, _, D = x.shape
    v = x.reshape(B, H, T, Hh, W, D).astype(np.float32)
    pad = ((0, 0), (0, 0), (0, gt * ct - T), (0, gh * ch - Hh), (0, gw * cw - W), (0, 0))
    if any(p[1] for p in pad):
        v = xp.pad(v, pad)
    s = v.reshape(B, H, gt, ct, gh, ch, gw, cw, D).sum(axis=(3, 5, 7))
    _, sizes = tile_permutation(lat, cube)
    return s.reshape(B, H, gt * gh * gw, D) / device_copy(sizes, xp).astype(np.float32)[:, None]


def topk_pooled(q: Any, k: Any, latent: Sequence[int], cube: Sequence[int] = (4, 4, 4),
                topk: int | None = None, top_p: float | None = None, text_tokens: int = 0,
                text_valid: int | None = None, ordered: bool = False) -> VideoMask:
    """Top-k (or top-p) key cubes per query cube from mean-pooled q and k (VSA, SpargeAttn).

    Tokens are regrouped by :func:`tile_permutation` into ``cube`` (default 4x4x4 = 64 tokens;
    edge cubes partly empty, so blocks have variable sizes). Per (batch, head), q and k are
    mean-pooled over each cube's tokens and ``scores = pooled_q @ pooled_k.T / sqrt(D)``; each
    query cube keeps

    * ``topk``: its ``topk`` highest-scoring key cubes (exactly, ties broken arbitrarily), or
    * ``top_p``: the smallest set of highest-scoring key cubes whose softmax mass over the row
      reaches ``top_p`` (at least one).

    With neither given, ``topk = max(1, round(0.1 * cubes))`` (about 10% density). Text tokens
    (the last ``text_tokens`` of q/k) are not pooled; they get the text blocks.

    Args:
        q, k: ``[B, H, L, D]`` or ``[H, L, D]``, original token order, ``L = t*h*w +
            text_tokens``; k may have fewer heads (GQA: ``H`` a multiple of k's heads). numpy
            gives a host mask; CuPy (or a CUDA DLPack tensor) computes on the device and gives a
            device mask (``permutation`` is always host numpy).
        latent: ``(t, h, w)``.
        ordered: q and k are already in the cube order (``permutation`` applied, as when a
            pipeline keeps its tokens in that order): each cube is a contiguous run of tokens.
    Returns:
        A VideoMask whose mask has ``batch_heads = (B, H)`` (q heads).
    """
    lat = check_latent(latent)
    cb = check_triple(cube, "cube")
    n_video = int(np.prod(lat))
    text_counts(text_tokens, text_valid)
    q, k, xp = check_qk(q, k, n_video + text_tokens)
    if topk is not None and top_p is not None:
        raise ValueError("give topk or top_p, not both")
    perm, sizes = tile_permutation(lat, cb)
    n = sizes.size
    if top_p is None and topk is None:
        topk = max(1, round(0.1 * n))
    D = q.shape[-1]
    if ordered:
        dev_sizes = device_copy(sizes, xp)
        bounds = xp.concatenate([xp.zeros(1, dtype=dev_sizes.dtype), xp.cumsum(dev_sizes)])
        inv = (1.0 / dev_sizes)[:, None]
        pq, pk = ((segment_sums(x[:, :, :n_video], bounds, xp) * inv).astype(np.float32)
                  for x in (q, k))
    else:
        pq = _cube_pool(q[:, :, :n_video], lat, cb, xp)
        pk = _cube_pool(k[:, :, :n_video], lat, cb, xp)
    scores = pq @ pk.swapaxes(-1, -2) / np.float32(math.sqrt(D))
    if topk is not None:
        if not is_int(topk) or topk <= 0:
            raise ValueError(f"topk must be a positive int, got {topk!r}")
        kk = min(int(topk), n)
        idx = xp.argpartition(-scores, kk - 1, axis=-1)[..., :kk]
        video = sorted_keep(idx, xp.ones(idx.shape, dtype=bool), scores.shape, xp)
    else:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        video = top_p_rows(scores, top_p, 1, xp)
    bounds = bounds_from_sizes(sizes)
    dense, qb, kb = with_text(video, bounds, bounds, text_tokens, text_valid)
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    params = dict(latent=lat, cube=cb, topk=topk, top_p=top_p, text_tokens=text_tokens,
                  text_valid=text_valid, batch=int(q.shape[0]), heads=int(q.shape[1]),
                  ordered=ordered)
    return VideoMask(mask, with_text_identity(perm, text_tokens), "topk_pooled", params)
