"""Logical masks of video sparse-attention methods, as :class:`~tessera.BlockMask` values.

Each generator returns a :class:`VideoMask`: the logical block mask, the token permutation it
is expressed in, the family name and the parameters used. Tessera never changes these masks;
they are what callers (and our benchmarks) hand to the runtime.

Token order
    Video tokens are frame-major: token ``(t, h, w)`` of a ``T x H x W`` latent has index
    ``(t * H + h) * W + w``. Text tokens, if any, follow the ``T*H*W`` video tokens.

Permutations
    Several methods regroup tokens so that their blocks are contiguous (3D tiles, 4x4x4 cubes,
    token-major order, k-means clusters). ``VideoMask.permutation[p]`` is the original index of
    the token at position ``p`` of the permuted sequence (so ``x_perm = x[..., perm, :]``).
    Text tokens are never moved: the permutation is the identity on them. ``None`` means the
    identity. Only :func:`semantic_clusters` orders keys differently from queries
    (``kv_permutation``); elsewhere keys and values use ``permutation`` too.

Text tokens (every family takes ``text_tokens`` and ``text_valid``)
    The last ``text_tokens`` positions are text, as up to two extra blocks at the end of both
    axes: a block of the ``text_valid`` valid prompt tokens (omitted if 0), then a block of the
    ``text_tokens - text_valid`` padding slots (omitted if 0). Valid text rows attend every
    video block and the valid text block; every video row also attends the valid text block;
    padding rows attend only the padding block, and no other row attends it. Blocks are
    therefore of variable size at the end, and every mask uses explicit ``q_bounds`` /
    ``kv_bounds``.

Per-head parameters
    Where a parameter may differ per head (STA windows, spatial/temporal head kinds) a list with
    one entry per head gives a mask with ``H = len(list)``; a single value gives one mask for
    all heads (``H = 1``, broadcast). The data-dependent families (:func:`topk_pooled`,
    :func:`semantic_clusters`) give one mask per (batch, query head).

Everything is vectorized numpy on the host, except that :func:`topk_pooled` and
:func:`semantic_clusters` compute on the device with CuPy when given CuPy (or CUDA DLPack)
arrays, and then return a device mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ._array import array_module, as_array, to_numpy
from .mask import BlockMask

__all__ = [
    "VideoMask",
    "apply_permutation",
    "invert_permutation",
    "tile_permutation",
    "temporal_permutation",
    "sliding_tile",
    "spatial_temporal",
    "radial",
    "radial_frame_rule",
    "topk_pooled",
    "semantic_clusters",
    "random_blocks",
]

Latent = tuple[int, int, int]


@dataclass
class VideoMask:
    """A logical mask of one video sparse-attention method.

    Attributes:
        mask: the logical :class:`BlockMask`, over the permuted token order (queries ordered by
            ``permutation``, keys/values by ``kv_permutation`` when given, else by
            ``permutation``).
        permutation: int64 ``[L]`` (host numpy) or ``None`` (identity): position ``p`` of the
            permuted query sequence holds original token ``permutation[p]``.
        family: the generator's name, e.g. ``"sliding_tile"``.
        params: the parameters used (for printing and recording; arrays are not included).
        kv_permutation: int64 ``[L]`` or ``None``: the same for keys and values when they are
            ordered differently from queries (only :func:`semantic_clusters`); ``None`` means
            keys use ``permutation``.

    To run attention in the permuted order and return to the original order::

        qp, kp, vp = vm.permute_q(q), vm.permute_kv(k), vm.permute_kv(v)
        out = vm.unpermute_output(tessera.attention(qp, kp, vp, vm.mask))
    """

    mask: BlockMask
    permutation: np.ndarray | None = field(repr=False)
    family: str
    params: dict
    kv_permutation: np.ndarray | None = field(default=None, repr=False)

    @property
    def key_permutation(self) -> np.ndarray | None:
        """The permutation of keys/values in effect: ``kv_permutation``, else ``permutation``."""
        return self.kv_permutation if self.kv_permutation is not None else self.permutation

    def permute_q(self, x: Any, axis: int = -2) -> Any:
        """Queries (or anything in query order) from original to permuted order along ``axis``."""
        return apply_permutation(x, self.permutation, axis)

    def permute_kv(self, x: Any, axis: int = -2) -> Any:
        """Keys/values from original to permuted order along ``axis``."""
        return apply_permutation(x, self.key_permutation, axis)

    def unpermute_output(self, x: Any, axis: int = -2) -> Any:
        """Attention output (query order) from permuted back to original order along ``axis``."""
        if self.permutation is None:
            return x
        return apply_permutation(x, invert_permutation(self.permutation), axis)


# ---------------------------------------------------------------------------- permutations
def invert_permutation(perm: Any) -> Any:
    """The inverse permutation: ``inv[perm[p]] = p`` (same array module as ``perm``)."""
    xp = array_module(perm)
    perm = xp.asarray(perm)
    inv = xp.empty_like(perm)
    inv[perm] = xp.arange(perm.size, dtype=perm.dtype)
    return inv


def apply_permutation(x: Any, perm: Any, axis: int = -2) -> Any:
    """``x`` reordered along ``axis`` so that position ``p`` holds ``x[..., perm[p], ...]``.

    ``perm=None`` returns ``x`` unchanged. Works on numpy and CuPy (a host permutation is moved
    to the device when ``x`` is a CuPy array).
    """
    if perm is None:
        return x
    xp = array_module(x)
    return xp.take(x, xp.asarray(perm), axis=axis)


def _with_text_identity(perm: np.ndarray | None, text_tokens: int) -> np.ndarray | None:
    """Extend a video permutation by the identity over the text tokens that follow."""
    if perm is None or text_tokens == 0:
        return perm
    n = perm.size
    return np.concatenate([perm, np.arange(n, n + text_tokens, dtype=np.int64)])


def _check_latent(latent: Sequence[int]) -> Latent:
    lat = tuple(int(x) for x in latent)
    if len(lat) != 3 or any(x <= 0 for x in lat):
        raise ValueError(f"latent must be three positive ints (t, h, w), got {latent!r}")
    return lat  # type: ignore[return-value]


def _check_triple(v: Sequence[int], name: str) -> tuple[int, int, int]:
    try:
        t = tuple(int(x) for x in v)
    except TypeError:
        raise TypeError(f"{name} must be three positive ints, got {v!r}") from None
    if len(t) != 3 or any(x <= 0 for x in t):
        raise ValueError(f"{name} must be three positive ints, got {v!r}")
    return t  # type: ignore[return-value]


def tile_permutation(latent: Sequence[int], tile: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Regroup frame-major video tokens so that each 3D tile is contiguous.

    Tiles of ``tile_t x tile_h x tile_w`` tokens are ordered frame-tile-major (tile ``(i, j, k)``
    of the ``ceil(T/tile_t) x ceil(H/tile_h) x ceil(W/tile_w)`` grid is number
    ``(i * nH + j) * nW + k``); within a tile, tokens keep their frame-major order. Edge tiles
    are partial when a dimension does not divide. Returns ``(perm, sizes)``: the permutation of
    the ``T*H*W`` video tokens and the token count of each tile (int64, in tile order).
    """
    T, H, W = _check_latent(latent)
    ct, ch, cw = _check_triple(tile, "tile")
    gt, gh, gw = -(-T // ct), -(-H // ch), -(-W // cw)
    tid = ((np.arange(T)[:, None, None] // ct * gh + np.arange(H)[None, :, None] // ch) * gw
           + np.arange(W)[None, None, :] // cw)
    perm = np.argsort(tid.reshape(-1), kind="stable").astype(np.int64)

    def extents(n: int, c: int, g: int) -> np.ndarray:
        return np.minimum(c, n - np.arange(g) * c)

    sizes = (extents(T, ct, gt)[:, None, None] * extents(H, ch, gh)[None, :, None]
             * extents(W, cw, gw)[None, None, :]).reshape(-1).astype(np.int64)
    return perm, sizes


def temporal_permutation(latent: Sequence[int]) -> np.ndarray:
    """Token-major order: position ``(h * W + w) * T + t`` holds original token ``(t*H + h)*W + w``.

    The ``T`` tokens of each spatial position become contiguous (positions in raster order,
    frames in order within each). Covers the video tokens only; text stays at the end.
    """
    T, H, W = _check_latent(latent)
    return np.arange(T * H * W, dtype=np.int64).reshape(T, H * W).T.reshape(-1).copy()


# ---------------------------------------------------------------------------- building blocks
def _bounds_from_sizes(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _uniform_bounds(n: int, block: int) -> np.ndarray:
    if not isinstance(block, (int, np.integer)) or block <= 0:
        raise ValueError(f"block must be a positive int, got {block!r}")
    nb = -(-n // block)
    return np.minimum(np.arange(nb + 1, dtype=np.int64) * block, n)


def _mark_ranges(n_rows: int, n_cols: int, rows: np.ndarray, lo: np.ndarray,
                 hi: np.ndarray) -> np.ndarray:
    """Bool ``[n_rows, n_cols]`` with ``[lo, hi]`` (inclusive) set in each listed row.

    Intervals may overlap and repeat; empty ones (``hi < lo``) are ignored. A difference array
    built with ``bincount`` then a running sum: linear in the matrix and interval counts.
    """
    rows, lo, hi = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (rows, lo, hi))
    keep = hi >= lo
    rows, lo, hi = rows[keep], lo[keep], hi[keep]
    width = n_cols + 1
    size = n_rows * width
    diff = (np.bincount(rows * width + lo, minlength=size)
            - np.bincount(rows * width + hi + 1, minlength=size))
    return np.cumsum(diff.reshape(n_rows, width), axis=1)[:, :n_cols] > 0


def _frame_segments(bounds: np.ndarray, frame: int) -> tuple[np.ndarray, ...]:
    """Split each block ``[bounds[i], bounds[i+1])`` of frame-major tokens at frame edges.

    Returns ``(block, frame_index, start, stop)`` per segment, ``start``/``stop`` the token range
    inside that frame (``0 <= start < stop <= frame``).
    """
    a, b = bounds[:-1], bounds[1:]
    f_lo, f_hi = a // frame, (b - 1) // frame
    n_seg = f_hi - f_lo + 1
    blk = np.repeat(np.arange(a.size, dtype=np.int64), n_seg)
    first = np.repeat(np.cumsum(n_seg) - n_seg, n_seg)
    f = f_lo[blk] + (np.arange(blk.size, dtype=np.int64) - first)
    start = np.maximum(a[blk], f * frame) - f * frame
    stop = np.minimum(b[blk], (f + 1) * frame) - f * frame
    return blk, f, start, stop


def _text_counts(text_tokens: int, text_valid: int | None) -> tuple[int, int]:
    text_tokens = int(text_tokens)
    if text_tokens < 0:
        raise ValueError(f"text_tokens must be >= 0, got {text_tokens}")
    valid = text_tokens if text_valid is None else int(text_valid)
    if not 0 <= valid <= text_tokens:
        raise ValueError(f"text_valid must be in [0, text_tokens={text_tokens}], got {text_valid}")
    return valid, text_tokens - valid


def _with_text(video: Any, q_bounds: np.ndarray, kv_bounds: np.ndarray, text_tokens: int,
               text_valid: int | None) -> tuple[Any, np.ndarray, np.ndarray]:
    """Append the text blocks (see the module docstring) to a video block mask ``[..., nQ, nK]``.

    Returns ``(mask, q_bounds, kv_bounds)`` over the whole sequence; ``mask`` stays in the
    array module of ``video``.
    """
    valid, pad = _text_counts(text_tokens, text_valid)
    if valid == 0 and pad == 0:
        return video, q_bounds, kv_bounds
    xp = array_module(video)
    sizes = [s for s in (valid, pad) if s]
    n_t = len(sizes)
    nq, nk = video.shape[-2], video.shape[-1]
    out = xp.zeros((*video.shape[:-2], nq + n_t, nk + n_t), dtype=bool)
    out[..., :nq, :nk] = video
    if valid:
        out[..., :nq, nk] = True        # every video row sees the valid text block
        out[..., nq, :nk + 1] = True    # valid text rows: all video + valid text
    if pad:
        out[..., nq + n_t - 1, nk + n_t - 1] = True  # padding sees only padding
    qb = np.concatenate([q_bounds, q_bounds[-1] + np.cumsum(sizes)]).astype(np.int64)
    kb = np.concatenate([kv_bounds, kv_bounds[-1] + np.cumsum(sizes)]).astype(np.int64)
    return out, qb, kb


def _finish(video: Any, q_bounds: np.ndarray, kv_bounds: np.ndarray, text_tokens: int,
            text_valid: int | None) -> BlockMask:
    dense, qb, kb = _with_text(video, q_bounds, kv_bounds, text_tokens, text_valid)
    if dense.ndim == 3 and dense.shape[0] == 1:
        dense = dense[0]
    return BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)


def _per_head(value: Any, is_single) -> tuple[list, bool]:
    """``([values], single)``: a single value, or a non-empty list of per-head values."""
    if is_single(value):
        return [value], True
    vals = list(value)
    if not vals:
        raise ValueError("a per-head list must not be empty")
    return vals, False


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


# ---------------------------------------------------------------------------- 1. sliding tile
def _window_1d(g: int, w: int) -> np.ndarray:
    """``[g, g]`` bool: tile i attends tiles ``[s, s + w')``, ``w' = min(w, g)``, centre clamped.

    ``s = clip(i - w' // 2, 0, g - w')``: odd windows are centred; an even window reaches one
    tile further back than forward.
    """
    w = min(w, g)
    i = np.arange(g)
    s = np.clip(i - w // 2, 0, g - w)
    j = np.arange(g)
    return (j[None, :] >= s[:, None]) & (j[None, :] < s[:, None] + w)


def sliding_tile(latent: Sequence[int], tile: Sequence[int] = (6, 8, 8),
                 window: Any = (3, 3, 3), text_tokens: int = 0,
                 text_valid: int | None = None) -> VideoMask:
    """Sliding tile attention (STA): 3D tiles as blocks, a clamped window of tiles per query tile.

    Tokens are regrouped by :func:`tile_permutation` (blocks = tiles, 384 tokens for 6x8x8;
    edge tiles partial). Query tile ``(i, j, k)`` attends the key tiles in a
    ``wt x wh x ww`` window centred on it along each axis, the window shifted to stay inside
    the tile grid and clipped to the grid size when the grid is smaller (see
    :func:`_window_1d`), so every query tile of a grid at least as large as the window attends
    exactly ``wt * wh * ww`` tiles.

    Args:
        latent: ``(t, h, w)`` of the video latent.
        tile: tile size in tokens along ``(t, h, w)``.
        window: ``(wt, wh, ww)`` in tiles, or a list of them, one per head.
        text_tokens, text_valid: see the module docstring.
    """
    lat = _check_latent(latent)
    tl = _check_triple(tile, "tile")
    windows, single = _per_head(window, lambda v: len(v) > 0 and _is_int(v[0]))
    windows = [_check_triple(w, "window") for w in windows]
    perm, sizes = tile_permutation(lat, tl)
    grid = [-(-n // c) for n, c in zip(lat, tl)]
    n = int(np.prod(grid))
    masks = []
    for wt, wh, ww in windows:
        mt, mh, mw = (_window_1d(g, w) for g, w in zip(grid, (wt, wh, ww)))
        m = (mt[:, None, None, :, None, None] & mh[None, :, None, None, :, None]
             & mw[None, None, :, None, None, :])
        masks.append(m.reshape(n, n))
    bounds = _bounds_from_sizes(sizes)
    mask = _finish(np.stack(masks), bounds, bounds, text_tokens, text_valid)
    params = dict(latent=lat, tile=tl, window=windows[0] if single else windows,
                  text_tokens=text_tokens, text_valid=text_valid)
    return VideoMask(mask, _with_text_identity(perm, text_tokens), "sliding_tile", params)


# ---------------------------------------------------------------------------- 2. spatial / temporal
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
    return _mark_ranges(n, n, np.arange(n), c_lo * chunk // block,
                        ((c_hi + 1) * chunk - 1) // block)


def _token_segments(bounds: np.ndarray, frame: int, per_token: bool) -> tuple[np.ndarray, ...]:
    """:func:`_frame_segments`, optionally split further into single tokens."""
    blk, f, s0, s1 = _frame_segments(bounds, frame)
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
    return _mark_ranges(n, n, rows, (tkb * F + s_lo[ok]) // block, (tkb * F + s_hi[ok]) // block)


def _temporal_position_original(bounds: np.ndarray, frame: int, n_frames: int, width: int,
                                block: int) -> np.ndarray:
    """Frame-major blocks under the token rule "same spatial position, frames within +-width"."""
    blk, f, s0, s1 = _frame_segments(bounds, frame)
    df = np.arange(-width, width + 1)
    fk = f[:, None] + df[None, :]
    ok = (fk >= 0) & (fk < n_frames)
    rows = np.broadcast_to(blk[:, None], fk.shape)[ok]
    fk = fk[ok]
    s0 = np.broadcast_to(s0[:, None], ok.shape)[ok]
    s1 = np.broadcast_to(s1[:, None], ok.shape)[ok]
    n = bounds.size - 1
    return _mark_ranges(n, n, rows, (fk * frame + s0) // block, (fk * frame + s1 - 1) // block)


def _temporal_position_permuted(bounds: np.ndarray, n_frames: int, width: int,
                                block: int) -> np.ndarray:
    """Token-major blocks, rule "same position, +-width frames": a band inside each group of T."""
    a, b = bounds[:-1], bounds[1:]
    lo = np.maximum(a // n_frames * n_frames, a - width)
    hi = np.minimum((b - 1) // n_frames * n_frames + n_frames - 1, b - 1 + width)
    n = a.size
    return _mark_ranges(n, n, np.arange(n), lo // block, hi // block)


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
    T, H, W = lat = _check_latent(latent)
    kinds, single = _per_head(heads, lambda v: isinstance(v, str))
    for k in kinds:
        if k not in _HEAD_KINDS:
            raise ValueError(f"head kind must be one of {_HEAD_KINDS}, got {k!r}")
    if temporal_rule not in _TEMPORAL_RULES:
        raise ValueError(f"temporal_rule must be one of {_TEMPORAL_RULES}, got {temporal_rule!r}")
    if order not in ("auto", "original"):
        raise ValueError(f"order must be 'auto' or 'original', got {order!r}")
    if not _is_int(width) or width < 0:
        raise ValueError(f"width must be an int >= 0, got {width!r}")
    n_video, frame = T * H * W, H * W
    bounds = _uniform_bounds(n_video, block)
    permuted = order == "auto" and all(k == "temporal" for k in kinds)
    if permuted:
        if temporal_rule == "band":
            m = _chunk_band_rows(bounds, frame, T, width, block)
        else:
            m = _temporal_position_permuted(bounds, T, width, block)
        masks = [m] * len(kinds)
        perm = _with_text_identity(temporal_permutation(lat), text_tokens)
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
    mask = _finish(np.stack(masks), bounds, bounds, text_tokens, text_valid)
    params = dict(latent=lat, block=block, heads=kinds[0] if single else kinds, width=width,
                  temporal_rule=temporal_rule,
                  order="token-major" if permuted else "original",
                  text_tokens=text_tokens, text_valid=text_valid)
    return VideoMask(mask, perm, "spatial_temporal", params)


# ---------------------------------------------------------------------------- 3. radial
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
    T, H, W = lat = _check_latent(latent)
    frame, n_video = H * W, T * H * W
    if dense_distance < 0:
        raise ValueError("dense_distance must be >= 0")
    bounds = _uniform_bounds(n_video, block)
    rule = radial_frame_rule(T, frame, block, dense_distance, sink_frame)
    blk, f, s0, s1 = _frame_segments(bounds, frame)
    r = rule[f]                                     # [segments, T key frames]
    tk = np.broadcast_to(np.arange(T)[None, :], r.shape)
    ok = r >= 0
    r, tk = r[ok], tk[ok]
    rows = np.broadcast_to(blk[:, None], ok.shape)[ok]
    lo = np.maximum(np.broadcast_to(s0[:, None], ok.shape)[ok] - r, 0)
    hi = np.minimum(np.broadcast_to(s1[:, None], ok.shape)[ok] - 1 + r, frame - 1)
    n = bounds.size - 1
    video = _mark_ranges(n, n, rows, (tk * frame + lo) // block, (tk * frame + hi) // block)
    mask = _finish(video[None], bounds, bounds, text_tokens, text_valid)
    params = dict(latent=lat, block=block, dense_distance=dense_distance, sink_frame=sink_frame,
                  text_tokens=text_tokens, text_valid=text_valid)
    return VideoMask(mask, None, "radial", params)


# ---------------------------------------------------------------------------- q/k helpers
def _as_bhld(x: Any, name: str) -> Any:
    a = as_array(x, name)
    if a.ndim == 3:
        a = a[None]
    if a.ndim != 4:
        raise ValueError(f"{name} must be [B, H, L, D] or [H, L, D], got shape {tuple(a.shape)}")
    return a


def _check_qk(q: Any, k: Any, n_tokens: int | None) -> tuple[Any, Any, Any]:
    q, k = _as_bhld(q, "q"), _as_bhld(k, "k")
    xp = array_module(q, k)
    if xp is not np:
        q, k = xp.asarray(q), xp.asarray(k)
    B, Hq, L, D = q.shape
    Bk, Hk, Lk, Dk = k.shape
    if (Bk, Lk, Dk) != (B, L, D):
        raise ValueError(f"k shape {tuple(k.shape)} does not match q shape {tuple(q.shape)} "
                         "(batch, length and head dim must agree)")
    if Hq % Hk:
        raise ValueError(f"q heads {Hq} must be a multiple of k heads {Hk}")
    if n_tokens is not None and L != n_tokens:
        raise ValueError(f"q/k have {L} tokens; expected {n_tokens} (video + text)")
    if Hk != Hq:
        k = xp.repeat(k, Hq // Hk, axis=1)
    return q, k, xp


def _sorted_keep(order: Any, keep_sorted: Any, shape: tuple[int, ...], xp) -> Any:
    """Scatter a keep flag given in sorted order (``order`` per row) back to a bool ``shape``."""
    n_rows = int(np.prod(shape[:-1]))
    n = shape[-1]
    base = (xp.arange(n_rows, dtype=np.int64) * n).reshape(*shape[:-1], 1)
    flat = (base + order)[keep_sorted]
    out = xp.zeros(n_rows * n, dtype=bool)
    out[flat] = True
    return out.reshape(shape)


def _top_p_rows(logits: Any, top_p: float, min_keep: int, xp) -> Any:
    """Per row, the smallest set of largest-probability entries with softmax mass >= top_p.

    At least ``min_keep`` entries (and at least one) are kept. ``logits`` ``[..., n]``.
    """
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    p = xp.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    order = xp.argsort(-p, axis=-1)
    ps = xp.take_along_axis(p, order, axis=-1)
    before = xp.cumsum(ps, axis=-1) - ps          # mass of the entries ranked above
    rank = xp.arange(p.shape[-1])
    keep = (before < top_p) | (rank < max(min_keep, 1))
    return _sorted_keep(order, keep, p.shape, xp)


# ---------------------------------------------------------------------------- 4. top-k pooled
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
    return s.reshape(B, H, gt * gh * gw, D) / xp.asarray(sizes, dtype=np.float32)[:, None]


def topk_pooled(q: Any, k: Any, latent: Sequence[int], cube: Sequence[int] = (4, 4, 4),
                topk: int | None = None, top_p: float | None = None, text_tokens: int = 0,
                text_valid: int | None = None) -> VideoMask:
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
    Returns:
        A VideoMask whose mask has ``batch_heads = (B, H)`` (q heads).
    """
    lat = _check_latent(latent)
    cb = _check_triple(cube, "cube")
    n_video = int(np.prod(lat))
    _text_counts(text_tokens, text_valid)
    q, k, xp = _check_qk(q, k, n_video + text_tokens)
    if topk is not None and top_p is not None:
        raise ValueError("give topk or top_p, not both")
    perm, sizes = tile_permutation(lat, cb)
    n = sizes.size
    if top_p is None and topk is None:
        topk = max(1, round(0.1 * n))
    D = q.shape[-1]
    pq = _cube_pool(q[:, :, :n_video], lat, cb, xp)
    pk = _cube_pool(k[:, :, :n_video], lat, cb, xp)
    scores = pq @ pk.swapaxes(-1, -2) / np.float32(math.sqrt(D))
    if topk is not None:
        if not _is_int(topk) or topk <= 0:
            raise ValueError(f"topk must be a positive int, got {topk!r}")
        kk = min(int(topk), n)
        idx = xp.argpartition(-scores, kk - 1, axis=-1)[..., :kk]
        video = _sorted_keep(idx, xp.ones(idx.shape, dtype=bool), scores.shape, xp)
    else:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        video = _top_p_rows(scores, top_p, 1, xp)
    bounds = _bounds_from_sizes(sizes)
    dense, qb, kb = _with_text(video, bounds, bounds, text_tokens, text_valid)
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    params = dict(latent=lat, cube=cb, topk=topk, top_p=top_p, text_tokens=text_tokens,
                  text_valid=text_valid, batch=int(q.shape[0]), heads=int(q.shape[1]))
    return VideoMask(mask, _with_text_identity(perm, text_tokens), "topk_pooled", params)


# ---------------------------------------------------------------------------- 5. semantic clusters
def _segment_sums(x: Any, bounds: np.ndarray, xp) -> Any:
    """Sums of ``x [..., N, D]`` over the token segments ``bounds`` (float64 accumulation)."""
    if xp is np:
        return np.add.reduceat(x.astype(np.float64), bounds[:-1], axis=-2)
    c = xp.cumsum(x.astype(np.float64), axis=-2)
    c = xp.concatenate([xp.zeros_like(c[..., :1, :]), c], axis=-2)
    b = xp.asarray(bounds)
    return c[..., b[1:], :] - c[..., b[:-1], :]


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
        b = _bounds_from_sizes(counts[nz])
        sums = _segment_sums(x[order], b, xp)
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
    q, k, xp = _check_qk(q, k, None)
    B, H, L, D = q.shape
    _text_counts(text_tokens, text_valid)
    n_video = L - text_tokens
    if n_video <= 0:
        raise ValueError(f"q/k have {L} tokens, not more than text_tokens={text_tokens}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not 0.0 <= min_fraction <= 1.0:
        raise ValueError(f"min_fraction must be in [0, 1], got {min_fraction!r}")
    kq, kk = min(int(num_q_clusters), n_video), min(int(num_kv_clusters), n_video)
    if kq <= 0 or kk <= 0:
        raise ValueError("cluster counts must be positive")
    qv, kv = q[:, :, :n_video], k[:, :, :n_video]
    lab_q = _kmeans(qv.astype(np.float32).mean(axis=(0, 1)), kq, iters, seed, xp)
    lab_k = _kmeans(kv.astype(np.float32).mean(axis=(0, 1)), kk, iters, seed + 1, xp)
    perm_q, size_q = _cluster_order(lab_q, kq, xp)
    perm_k, size_k = _cluster_order(lab_k, kk, xp)
    qb, kb = _bounds_from_sizes(size_q), _bounds_from_sizes(size_k)
    cq = _segment_sums(xp.take(qv, xp.asarray(perm_q), axis=2), qb, xp) / xp.asarray(
        size_q, dtype=np.float64)[:, None]
    ck = _segment_sums(xp.take(kv, xp.asarray(perm_k), axis=2), kb, xp) / xp.asarray(
        size_k, dtype=np.float64)[:, None]
    logits = cq @ ck.swapaxes(-1, -2) / math.sqrt(D) + xp.log(
        xp.asarray(size_k, dtype=np.float64))
    min_keep = int(math.ceil(min_fraction * size_k.size - 1e-9))
    video = _top_p_rows(logits, top_p, min_keep, xp)
    dense, qbt, kbt = _with_text(video, qb, kb, text_tokens, text_valid)
    mask = BlockMask.from_dense(dense, q_bounds=qbt, kv_bounds=kbt)
    params = dict(num_q_clusters=int(num_q_clusters), num_kv_clusters=int(num_kv_clusters),
                  q_clusters_nonempty=int(size_q.size), kv_clusters_nonempty=int(size_k.size),
                  top_p=top_p, min_fraction=min_fraction, iters=iters, seed=seed,
                  text_tokens=text_tokens, text_valid=text_valid, batch=B, heads=H)
    return VideoMask(mask, _with_text_identity(perm_q, text_tokens), "semantic_clusters",
                     params, kv_permutation=_with_text_identity(perm_k, text_tokens))


# ---------------------------------------------------------------------------- 6. random
def random_blocks(num_heads: int, seq_len: int, block: int = 128, density: float = 0.1,
                  seed: int = 0, text_tokens: int = 0,
                  text_valid: int | None = None) -> VideoMask:
    """Each (head, query block, key block) selected independently with probability ``density``.

    The stress case, not a model. ``seq_len`` counts all tokens; the last ``text_tokens`` are
    text (text blocks as in the module docstring), the rest cut into ``block``-token blocks (the
    last short). ``num_heads=1`` gives one mask for all heads. Rows may be empty.
    """
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density!r}")
    if num_heads <= 0:
        raise ValueError("num_heads must be positive")
    _text_counts(text_tokens, text_valid)
    n_video = int(seq_len) - int(text_tokens)
    if n_video <= 0:
        raise ValueError(f"seq_len={seq_len} must exceed text_tokens={text_tokens}")
    bounds = _uniform_bounds(n_video, block)
    n = bounds.size - 1
    rng = np.random.default_rng(seed)
    video = rng.random((num_heads, n, n), dtype=np.float32) < density
    mask = _finish(video, bounds, bounds, text_tokens, text_valid)
    params = dict(num_heads=num_heads, seq_len=seq_len, block=block, density=density, seed=seed,
                  text_tokens=text_tokens, text_valid=text_valid)
    return VideoMask(mask, None, "random_blocks", params)
