"""Spatial and temporal heads (SVG): bands of frames, in frame-major or token-major order."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..checks import check_int
from .common import (check_latent, finish, frame_segments, mark_ranges, per_head, text_counts,
                     uniform_bounds, with_text_identity)
from .video import VideoMask, temporal_permutation

_HEAD_KINDS = ("spatial", "temporal")
_TEMPORAL_RULES = ("band", "position")


def _chunk_band_rows(bounds: np.ndarray, chunk: int, n_chunks: int, width: int,
                     block: int) -> np.ndarray:
    """Block i attends the blocks covering the ``chunk``-token chunks within +-width of its own.

    In frame-major order with ``chunk = h*w`` this is the spatial head (chunks are frames); in
    token-major order, the SVG temporal head.
    """
    a, b = bounds[:-1], bounds[1:]
    c_lo = np.maximum(a // chunk - width, 0)
    c_hi = np.minimum((b - 1) // chunk + width, n_chunks - 1)
    n = a.size
    return mark_ranges(n, n, np.arange(n), c_lo * chunk // block,
                        ((c_hi + 1) * chunk - 1) // block)


def _token_segments(bounds: np.ndarray, frame: int, per_token: bool) -> tuple[np.ndarray, ...]:
    """:func:`frame_segments`, optionally split further into single tokens."""
    blk, f, s0, s1 = frame_segments(bounds, frame)
    if not per_token:
        return blk, f, s0, s1
    n = s1 - s0
    first = np.repeat(np.cumsum(n) - n, n)
    off = np.arange(int(n.sum()), dtype=np.int64) - first
    s = np.repeat(s0, n) + off
    return np.repeat(blk, n), np.repeat(f, n), s, s + 1


def _temporal_band_original(bounds: np.ndarray, frame: int, n_frames: int, width: int,
                            block: int) -> np.ndarray:
    """Frame-major blocks under the token-major chunk band (SVG temporal head, original order).

    Query ``(t, s)`` sits at token-major index ``p = s*T + t`` in chunk ``p // F``; it selects
    every key whose token-major chunk is within +-width. For a query segment (one frame ``t``,
    positions ``[s0, s1)``) the selected token-major range is ``[P0, P1)`` and, in key frame
    ``t'``, the positions ``s'`` with ``P0 <= s'*T + t' < P1``: one interval per key frame.
    The union over a segment's positions is one range when ``T <= F`` (consecutive positions
    step by ``T`` tokens, at most one chunk); otherwise queries are taken one token at a time.
    """
    T, F = n_frames, frame
    blk, f, s0, s1 = _token_segments(bounds, F, per_token=T > F)
    c_lo = np.maximum((s0 * T + f) // F - width, 0)
    c_hi = np.minimum(((s1 - 1) * T + f) // F + width, T - 1)
    p0, p1 = (c_lo * F)[:, None], ((c_hi + 1) * F)[:, None]
    tk = np.arange(T)[None, :]
    s_lo = np.maximum((p0 - tk + T - 1) // T, 0)
    s_hi = np.minimum((p1 - 1 - tk) // T, F - 1)
    ok = s_hi >= s_lo
    tkb = np.broadcast_to(tk, ok.shape)[ok]
    rows = np.broadcast_to(blk[:, None], ok.shape)[ok]
    n = bounds.size - 1
    return mark_ranges(n, n, rows, (tkb * F + s_lo[ok]) // block, (tkb * F + s_hi[ok]) // block)


def _temporal_position_original(bounds: np.ndarray, frame: int, n_frames: int, width: int,
                                block: int) -> np.ndarray:
    """Frame-major blocks under the token rule "same spatial position, frames within +-width"."""
    blk, f, s0, s1 = frame_segments(bounds, frame)
    df = np.arange(-width, width + 1)
    fk = f[:, None] + df[None, :]
    ok = (fk >= 0) & (fk < n_frames)
    rows = np.broadcast_to(blk[:, None], fk.shape)[ok]
    fk = fk[ok]
    s0 = np.broadcast_to(s0[:, None], ok.shape)[ok]
    s1 = np.broadcast_to(s1[:, None], ok.shape)[ok]
    n = bounds.size - 1
    return mark_ranges(n, n, rows, (fk * frame + s0) // block, (fk * frame + s1 - 1) // block)


def _temporal_position_permuted(bounds: np.ndarray, n_frames: int, width: int,
                                block: int) -> np.ndarray:
    """Token-major blocks, rule "same position, +-width frames": a band inside each group of T."""
    a, b = bounds[:-1], bounds[1:]
    lo = np.maximum(a // n_frames * n_frames, a - width)
    hi = np.minimum((b - 1) // n_frames * n_frames + n_frames - 1, b - 1 + width)
    n = a.size
    return mark_ranges(n, n, np.arange(n), lo // block, hi // block)


def spatial_temporal(latent: Sequence[int], block: int = 128, heads: Any = "spatial",
                     width: int = 1, temporal_rule: str = "band", order: str = "auto",
                     text_tokens: int = 0, text_valid: int | None = None) -> VideoMask:
    """Sparse VideoGen (SVG) spatial and temporal heads, at ``block``-token blocks.

    Token rules, with ``F = h*w`` tokens per frame, frame-major index ``i = t*F + s`` and
    token-major index ``p = s*T + t`` (``s = h_pos*w + w_pos``, see
    :func:`temporal_permutation`):

    * spatial head: ``|i_q // F - i_k // F| <= width``, i.e. key frames within ``+-width``
      (any position): in frame-major order a diagonal band of frames.
    * temporal head, ``temporal_rule="band"`` (default; SVG's layout): the same rule on the
      token-major index, ``|p_q // F - p_k // F| <= width``. In token-major order it is the same
      diagonal band (the block matrix equals the spatial head's); in the original order it is
      the strided pattern "nearby spatial positions (about ``width * F / T`` either side, in
      raster order), every frame".
    * temporal head, ``temporal_rule="position"``: ``s_q == s_k`` and ``|t_q - t_k| <=
      width`` ("same spatial position, nearby frames"); in token-major order a band of
      ``+-width`` tokens inside each position's group of ``T``. Much sparser than "band".

    A block pair is selected when any token pair in it satisfies the rule (computed per block
    or per (block, frame) segment, never as an ``L x L`` matrix). Blocks are ``block`` tokens
    (the last video block short), then the text blocks.

    Order: a BlockMask has one token order for all its heads. With ``order="auto"`` a mask
    whose heads are all temporal is built in token-major order (``permutation`` =
    :func:`temporal_permutation` plus the identity on text: SVG's efficient layout). Any
    spatial head, or ``order="original"``, keeps the original frame-major order
    (``permutation=None``); the temporal heads are then the strided pattern converted to
    ``block``-token blocks in that order, which selects more token pairs than the rule needs
    (about twice as many for "band" on the Wan shapes).

    Args:
        latent: ``(t, h, w)``.
        block: block size in tokens.
        heads: ``"spatial"`` or ``"temporal"`` (one mask for all heads), or a list of them, one
            per head.
        width: half-width of the band (in frames, or in ``F``-token chunks of the token-major
            order; in frames for the "position" rule).
        temporal_rule: ``"band"`` or ``"position"``.
        order: ``"auto"`` or ``"original"``.
        text_tokens, text_valid: see the module docstring.
    """
    T, H, W = lat = check_latent(latent)
    kinds, single = per_head(heads, lambda v: isinstance(v, str), "heads")
    for k in kinds:
        if k not in _HEAD_KINDS:
            raise ValueError(f"heads must be 'spatial', 'temporal' or a list of them, one per "
                             f"head; got {k!r}")
    if temporal_rule not in _TEMPORAL_RULES:
        raise ValueError(f"temporal_rule must be one of {_TEMPORAL_RULES}, got {temporal_rule!r}")
    if order not in ("auto", "original"):
        raise ValueError(f"order must be 'auto' or 'original', got {order!r}")
    width = check_int(width, "width", 0)
    text_counts(text_tokens, text_valid)
    n_video, frame = T * H * W, H * W
    bounds = uniform_bounds(n_video, block)
    permuted = order == "auto" and all(k == "temporal" for k in kinds)
    if permuted:
        if temporal_rule == "band":
            m = _chunk_band_rows(bounds, frame, T, width, block)
        else:
            m = _temporal_position_permuted(bounds, T, width, block)
        masks = [m] * len(kinds)
        perm = with_text_identity(temporal_permutation(lat), text_tokens)
    else:
        cache: dict[str, np.ndarray] = {}
        if "spatial" in kinds:
            cache["spatial"] = _chunk_band_rows(bounds, frame, T, width, block)
        if "temporal" in kinds:
            fn = (_temporal_band_original if temporal_rule == "band"
                  else _temporal_position_original)
            cache["temporal"] = fn(bounds, frame, T, width, block)
        masks = [cache[k] for k in kinds]
        perm = None
    mask = finish(np.stack(masks), bounds, bounds, text_tokens, text_valid)
    params = dict(latent=lat, block=block, heads=kinds[0] if single else kinds, width=width,
                  temporal_rule=temporal_rule,
                  order="token-major" if permuted else "original",
                  text_tokens=text_tokens, text_valid=text_valid)
    return VideoMask(mask, perm, "spatial_temporal", params)
