"""Top-k (or top-p) key cubes per query cube from mean-pooled q and k (VSA-style 4x4x4 cubes)."""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import numpy as np

from ..checks import check_fraction, check_int
from ..cuda import loader
from ..cuda.variants import Variant
from ..mask import BlockMask
from .common import (Latent, bounds_from_sizes, check_latent, check_qk, check_triple, device_copy,
                     segment_sums, sorted_keep, text_counts, top_p_rows, with_text,
                     with_text_identity)
from .video import VideoMask, tile_permutation

__all__ = ["topk_pooled"]


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


@functools.lru_cache(maxsize=64)  # every layer of every step asks again: made once, read-only
def _cube_bounds(latent: Latent, cube: tuple[int, int, int]) -> np.ndarray:
    """Token offsets of the cubes in the cube order (int64, cubes + 1)."""
    b = bounds_from_sizes(tile_permutation(latent, cube)[1])
    b.flags.writeable = False
    return b


@functools.lru_cache(maxsize=64)  # (the same array every call of a layout)
def _sequence_permutation(latent: Latent, cube: tuple[int, int, int], text_tokens: int,
                          text_first: bool) -> np.ndarray:
    """The whole sequence's permutation of a cube-ordered mask: the cube order of the video
    with the text's identity after it, or before it (``text_first``)."""
    perm = tile_permutation(latent, cube)[0]
    if text_first and text_tokens:
        out = np.concatenate([np.arange(text_tokens, dtype=np.int64), perm + text_tokens])
    else:
        out = with_text_identity(perm, text_tokens)
    out.flags.writeable = False
    return out


def _pool_kernel(x: Any) -> tuple[Any, Any]:
    """The cube_pool kernel for ``x``'s element type, and ``x`` as it reads it (a float32 copy
    of other float types; a copy where the head dim is not contiguous)."""
    name = x.dtype.name
    if name not in ("bfloat16", "float16", "float32"):
        x = x.astype(np.float32)
        name = "float32"
    if x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        x = x.copy()
    return loader.load_kernel(Variant.pooled_topk("cube_pool", name)), x


def _device_pool(x: Any, tokens: Any, bounds: Any, cubes: int, xp) -> Any:
    """Mean of ``x [B, H, L, D]`` (CuPy) over each cube's tokens (``tokens``: their indices in
    the cube order, or None where ``x`` already is in it), float32 ``[B, H, cubes, D]``."""
    B, H, _, D = x.shape
    if D > 256:
        raise ValueError(f"pooled top-k on the device takes head dims up to 256, got {D}")
    fn, x = _pool_kernel(x)
    out = xp.empty((B, H, cubes, D), dtype=np.float32)
    sb, sh, sl, _ = (st // x.itemsize for st in x.strides)
    fn((cubes, B * H), (D,), (x, np.int64(sb), np.int64(sh), np.int64(sl), np.int32(H),
                              np.int32(D), tokens if tokens is not None else np.uint64(0),
                              bounds, np.int32(cubes), out))
    return out


def _device_scores(pq: Any, pk: Any, scale: float, xp) -> Any:
    """``scale * pq @ pk^T`` per (batch, q head) on the device, k's heads shared by ``H / Hk``
    query heads each (GQA), float32 ``[B, H, n_q, n_k]``: one kernel, no library call."""
    B, H, nq, D = pq.shape
    Hk, nk = pk.shape[1], pk.shape[2]
    out = xp.empty((B, H, nq, nk), dtype=np.float32)
    fn = loader.load_kernel(Variant.pooled_topk("cube_scores"))
    fn((-(-nk // 64), -(-nq // 64), B * H), (256,),
       (pq, pk, np.int32(H), np.int32(H // Hk), np.int32(nq), np.int32(nk), np.int32(D),
        np.float32(scale), out))
    return out


def _device_topk(scores: Any, keep: int, xp) -> Any:
    """Per row of ``scores [..., n_q, n_k]`` its ``keep`` highest entries (ties at the threshold
    in column order, NaN last) as a bool mask of the same shape: one kernel."""
    *lead, nq, nk = scores.shape
    out = xp.empty(scores.shape, dtype=bool)
    rows = int(np.prod(lead)) * nq
    fn = loader.load_kernel(Variant.pooled_topk("topk_rows"))
    fn((rows,), (256,), (scores, np.int32(nk), np.int32(keep), np.int32(nq),
                         np.int64(nq * nk), np.int64(nk), out))
    return out


def topk_pooled(q: Any, k: Any, latent: Sequence[int], cube: Sequence[int] = (4, 4, 4),
                topk: int | None = None, top_p: float | None = None, text_tokens: int = 0,
                text_valid: int | None = None, ordered: bool = False,
                text_first: bool = False) -> VideoMask:
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
        text_first: the text tokens come first (``L = text_tokens + t*h*w``, as CogVideoX
            orders them), and so do the text blocks of the mask and the permutation's text
            identity: the video is read where it is, with no reordered copy of q and k.
    Returns:
        A VideoMask whose mask has ``batch_heads = (B, H)`` (q heads).
    """
    lat = check_latent(latent)
    cb = check_triple(cube, "cube")
    n_video = int(np.prod(lat))
    text_counts(text_tokens, text_valid)
    q, k, xp = check_qk(q, k, n_video + text_tokens, repeat_kv=False)
    if not isinstance(text_first, bool):
        raise TypeError(f"text_first must be True or False, got {text_first!r}")
    if topk is not None and top_p is not None:
        raise ValueError("give topk or top_p, not both")
    if topk is not None:
        topk = check_int(topk, "topk", 1)
    if top_p is not None:
        top_p = check_fraction(top_p, "top_p")
    if not isinstance(ordered, bool):
        raise TypeError(f"ordered must be True or False, got {ordered!r}")
    perm, sizes = tile_permutation(lat, cb)
    n = sizes.size
    if top_p is None and topk is None:
        topk = max(1, round(0.1 * n))
    D = q.shape[-1]
    video = slice(text_tokens, text_tokens + n_video) if text_first else slice(0, n_video)
    if xp is not np:
        # On the device: three kernels (pool, score, select), no library call and no float32
        # copy of q or k -- a mask made inside a CUDA graph capture.
        bounds = device_copy(_cube_bounds(lat, cb), xp)
        tokens = None if ordered else device_copy(perm, xp)
        pq, pk = (_device_pool(x[:, :, video], tokens, bounds, n, xp) for x in (q, k))
        scores = _device_scores(pq, pk, 1.0 / math.sqrt(D), xp)
        chosen = (_device_topk(scores, min(int(topk), n), xp) if topk is not None
                  else top_p_rows(scores, top_p, 1, xp))
        return _video_mask(chosen, lat, cb, topk, top_p, text_tokens, text_valid, q.shape,
                           ordered, text_first)
    if k.shape[1] != q.shape[1]:
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    if ordered:
        dev_sizes = device_copy(sizes, xp)
        bounds = xp.concatenate([xp.zeros(1, dtype=dev_sizes.dtype), xp.cumsum(dev_sizes)])
        inv = (1.0 / dev_sizes)[:, None]
        pq, pk = ((segment_sums(x[:, :, video], bounds, xp) * inv).astype(np.float32)
                  for x in (q, k))
    else:
        pq = _cube_pool(q[:, :, video], lat, cb, xp)
        pk = _cube_pool(k[:, :, video], lat, cb, xp)
    scores = pq @ pk.swapaxes(-1, -2) / np.float32(math.sqrt(D))
    if topk is not None:
        kk = min(int(topk), n)
        idx = xp.argpartition(-scores, kk - 1, axis=-1)[..., :kk]
        chosen = sorted_keep(idx, xp.ones(idx.shape, dtype=bool), scores.shape, xp)
    else:
        chosen = top_p_rows(scores, top_p, 1, xp)
    return _video_mask(chosen, lat, cb, topk, top_p, text_tokens, text_valid, q.shape,
                       ordered, text_first)


def _video_mask(chosen: Any, lat: Latent, cb: tuple[int, int, int], topk: int | None,
                top_p: float | None, text_tokens: int, text_valid: int | None, q_shape: tuple,
                ordered: bool, text_first: bool) -> VideoMask:
    """The selected cubes ``chosen [B, H, n, n]`` with the text blocks, as topk_pooled's
    result."""
    bounds = _cube_bounds(lat, cb)
    dense, qb, kb = with_text(chosen, bounds, bounds, text_tokens, text_valid, text_first)
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    params = dict(latent=lat, cube=cb, topk=topk, top_p=top_p, text_tokens=text_tokens,
                  text_valid=text_valid, batch=int(q_shape[0]), heads=int(q_shape[1]),
                  ordered=ordered, text_first=text_first)
    return VideoMask(mask, _sequence_permutation(lat, cb, text_tokens, text_first),
                     "topk_pooled", params)
