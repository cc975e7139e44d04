"""Random blocks at a given density (one for all heads, or one a head): a stress case, not a
model -- with per-head densities, the spread of a model's spatial and temporal heads."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..checks import check_fraction, check_int, is_int
from ..mask import MAX_TOKENS
from .common import finish, text_counts, uniform_bounds, variable_bounds
from .video import VideoMask


# Per-head densities of a mixed-density mask: as spread as a video model's heads, which run
# from temporal heads at a few percent to spatial heads at over half the blocks.
MIXED_DENSITIES = (0.02, 0.60)


def mixed_densities(num_heads: int, seed: int = 0, spread: tuple[float, float] = MIXED_DENSITIES
                    ) -> list[float]:
    """``num_heads`` densities evenly spread over ``spread`` (2%-60% by default), in a random
    order of the heads (``seed``): the per-head densities of a mixed-density mask."""
    num_heads = check_int(num_heads, "num_heads", 1)
    lo, hi = spread
    check_fraction(lo, "spread[0]", zero=True)
    check_fraction(hi, "spread[1]", zero=True)
    if lo > hi:
        raise ValueError(f"spread must be (lo, hi) with lo <= hi, got {spread!r}")
    levels = np.linspace(lo, hi, num_heads)
    return [float(x) for x in np.random.default_rng(seed).permutation(levels)]


def random_blocks(num_heads: int, seq_len: int, block: int = 128,
                  density: float | Sequence[float] = 0.1,
                  seed: int = 0, text_tokens: int = 0,
                  text_valid: int | None = None,
                  sizes: tuple[int, int] | None = None) -> VideoMask:
    """Each (head, query block, key block) selected independently with probability ``density``.

    The stress case, not a model. ``seq_len`` counts all tokens; the last ``text_tokens`` are
    text (text blocks as in the module docstring), the rest cut into ``block``-token blocks (the
    last short), or, with ``sizes=(lo, hi)``, into blocks of sizes drawn uniformly from
    [lo, hi] (the same blocks for queries and keys, as clusters give; ``block`` unused): the
    variable geometry physical mapping is for. ``num_heads=1`` gives one mask for all heads.
    Rows may be empty. ``density`` may be one value a head (``num_heads`` of them: the
    mixed-density case, :func:`mixed_densities`).
    """
    num_heads = check_int(num_heads, "num_heads", 1)
    if isinstance(density, (list, tuple, np.ndarray)):
        if len(density) != num_heads:
            raise ValueError(f"density: {len(density)} per-head densities for num_heads="
                             f"{num_heads}; give one value, or one a head")
        for d in density:
            check_fraction(d, "density", zero=True)
        density = [float(d) for d in density]
    else:
        check_fraction(density, "density", zero=True)
    seq_len = check_int(seq_len, "seq_len", 1)
    if seq_len > MAX_TOKENS:
        raise ValueError(f"seq_len={seq_len}: token offsets are int32 (at most {MAX_TOKENS})")
    check_int(seed, "seed", 0)
    if sizes is not None and (not isinstance(sizes, (tuple, list)) or len(sizes) != 2
                              or not all(is_int(x) for x in sizes)
                              or not 0 < sizes[0] <= sizes[1]):
        raise ValueError(f"sizes must be (lo, hi) ints with 0 < lo <= hi, or None, "
                         f"got {sizes!r}")
    text_counts(text_tokens, text_valid)
    n_video = seq_len - int(text_tokens)
    if n_video <= 0:
        raise ValueError(f"seq_len={seq_len} must exceed text_tokens={text_tokens}")
    rng = np.random.default_rng(seed)
    if sizes is None:
        bounds = uniform_bounds(n_video, block)
    else:
        bounds = variable_bounds(rng, n_video, int(sizes[0]), int(sizes[1]))
    n = bounds.size - 1
    per_head = np.asarray(density, dtype=np.float32).reshape(-1, 1, 1)
    video = rng.random((num_heads, n, n), dtype=np.float32) < per_head
    mask = finish(video, bounds, bounds, text_tokens, text_valid)
    params = dict(num_heads=num_heads, seq_len=seq_len, block=block, density=density, seed=seed,
                  text_tokens=text_tokens, text_valid=text_valid, sizes=sizes)
    return VideoMask(mask, None, "random_blocks", params)
