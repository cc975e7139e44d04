"""Sliding tile attention (STA): 3D tiles of tokens, each attending a window of tiles around it."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .common import (
    bounds_from_sizes,
    check_latent,
    check_triple,
    finish,
    per_head,
    text_counts,
    with_text_identity,
)
from .video import VideoMask, tile_permutation


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
    lat = check_latent(latent)
    tl = check_triple(tile, "tile")
    windows, single = per_head(window, lambda v: isinstance(v, (list, tuple)) and len(v) > 0
                               and not isinstance(v[0], (list, tuple)), "window")
    windows = [check_triple(w, "window") for w in windows]
    text_counts(text_tokens, text_valid)
    perm, sizes = tile_permutation(lat, tl)
    grid = [-(-n // c) for n, c in zip(lat, tl)]
    n = int(np.prod(grid))
    masks = []
    for wt, wh, ww in windows:
        mt, mh, mw = (_window_1d(g, w) for g, w in zip(grid, (wt, wh, ww)))
        m = (mt[:, None, None, :, None, None] & mh[None, :, None, None, :, None]
             & mw[None, None, :, None, None, :])
        masks.append(m.reshape(n, n))
    bounds = bounds_from_sizes(sizes)
    mask = finish(np.stack(masks), bounds, bounds, text_tokens, text_valid)
    params = dict(latent=lat, tile=tl, window=windows[0] if single else windows,
                  text_tokens=text_tokens, text_valid=text_valid)
    return VideoMask(mask, with_text_identity(perm, text_tokens), "sliding_tile", params)
