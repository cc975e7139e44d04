"""Radial attention: dense near frames, bands that narrow with the frame distance."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..checks import check_int
from .common import check_latent, finish, frame_segments, mark_ranges, text_counts, uniform_bounds
from .video import VideoMask


def radial_frame_rule(n_frames: int, frame: int, block: int = 128, dense_distance: int = 1,
                      sink_frame: bool = True) -> np.ndarray:
    """Per (query frame, key frame), the half-width of the spatial band; ``-1``: pair skipped.

    A value ``>= frame`` means the pair is dense. See :func:`radial` for the rule.
    """
    tq = np.arange(n_frames)[:, None]
    tk = np.arange(n_frames)[None, :]
    d = np.abs(tq - tk)
    k = np.floor(np.log2(np.maximum(d, 1))).astype(np.int64)  # d in [2^k, 2^(k+1))
    # k0: first octave whose half-width frame >> (k + 1) is below one block.
    k0 = 1
    while (frame >> (k0 + 1)) >= block:
        k0 += 1
    r = np.where(k < k0, frame >> np.minimum(k + 1, 62), frame >> k0)
    stride = np.left_shift(1, np.maximum(k - k0 + 1, 0))
    kept = (k < k0) | (tk % stride == 0)
    out = np.where(kept, r, -1)
    out = np.where(d <= dense_distance, frame, out)
    if sink_frame:
        out[:, 0] = frame
    return out.astype(np.int64)


def radial(latent: Sequence[int], block: int = 128, dense_distance: int = 1,
           sink_frame: bool = True, text_tokens: int = 0,
           text_valid: int | None = None) -> VideoMask:
    """Radial attention: compute decaying with frame distance, at ``block``-token blocks.

    Exact token rule, for query ``(t_q, s_q)`` and key ``(t_k, s_k)`` (``s = h * W + w`` the
    raster position in the frame, ``F = h * w`` tokens per frame), ``d = |t_q - t_k|``:

    * ``d <= dense_distance``: selected (dense frame pair).
    * otherwise, with octave ``k = floor(log2 d)`` (``d`` in ``[2^k, 2^(k+1))``) and half-width
      ``r_k = F >> (k + 1)`` (for ``d`` in ``[2, 4)`` a band of half the frame, half-width
      ``F/4``; ``F/8`` for ``[4, 8)``, ...): let ``k0`` be the first octave ``>= 1`` with
      ``r_k0 < block`` (the band would be narrower than one block).

      - ``k < k0``: selected iff ``|s_q - s_k| <= r_k``;
      - ``k >= k0``: key frames are subsampled instead of narrowing further: selected iff
        ``t_k % 2^(k - k0 + 1) == 0`` and ``|s_q - s_k| <= r_(k0-1)`` (the last band of at least
        one block). Work per frame pair thus keeps halving with each doubling of ``d``.
    * ``sink_frame``: key frame 0 is selected densely for every query (attention sink).

    The rule is symmetric in ``q``/``k`` except for the subsampled octaves and the sink column.
    Block pair ``(i, j)`` is selected when any token pair in it is; this is computed per
    (query-block segment within one frame, key frame) interval, never as an ``L x L`` matrix.
    Block density with 128-token blocks: Wan-1.3B 0.46, Wan-14B 0.42, HunyuanVideo 0.32
    (the any-token rule widens each band by up to a block on both sides; with 12 blocks per
    frame, Wan-1.3B's bands inflate most).
    """
    T, H, W = lat = check_latent(latent)
    frame, n_video = H * W, T * H * W
    dense_distance = check_int(dense_distance, "dense_distance", 0)
    if not isinstance(sink_frame, bool):
        raise TypeError(f"sink_frame must be True or False, got {sink_frame!r}")
    text_counts(text_tokens, text_valid)
    bounds = uniform_bounds(n_video, block)
    rule = radial_frame_rule(T, frame, block, dense_distance, sink_frame)
    blk, f, s0, s1 = frame_segments(bounds, frame)
    r = rule[f]                                     # [segments, T key frames]
    tk = np.broadcast_to(np.arange(T)[None, :], r.shape)
    ok = r >= 0
    r, tk = r[ok], tk[ok]
    rows = np.broadcast_to(blk[:, None], ok.shape)[ok]
    lo = np.maximum(np.broadcast_to(s0[:, None], ok.shape)[ok] - r, 0)
    hi = np.minimum(np.broadcast_to(s1[:, None], ok.shape)[ok] - 1 + r, frame - 1)
    n = bounds.size - 1
    video = mark_ranges(n, n, rows, (tk * frame + lo) // block, (tk * frame + hi) // block)
    mask = finish(video[None], bounds, bounds, text_tokens, text_valid)
    params = dict(latent=lat, block=block, dense_distance=dense_distance, sink_frame=sink_frame,
                  text_tokens=text_tokens, text_valid=text_valid)
    return VideoMask(mask, None, "radial", params)
