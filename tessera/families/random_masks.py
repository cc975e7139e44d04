"""Random blocks at a given density: a stress case, not a model."""

from __future__ import annotations

import numpy as np

from .common import finish, text_counts, uniform_bounds
from .video import VideoMask


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
    text_counts(text_tokens, text_valid)
    n_video = int(seq_len) - int(text_tokens)
    if n_video <= 0:
        raise ValueError(f"seq_len={seq_len} must exceed text_tokens={text_tokens}")
    bounds = uniform_bounds(n_video, block)
    n = bounds.size - 1
    rng = np.random.default_rng(seed)
    video = rng.random((num_heads, n, n), dtype=np.float32) < density
    mask = finish(video, bounds, bounds, text_tokens, text_valid)
    params = dict(num_heads=num_heads, seq_len=seq_len, block=block, density=density, seed=seed,
                  text_tokens=text_tokens, text_valid=text_valid)
    return VideoMask(mask, None, "random_blocks", params)
