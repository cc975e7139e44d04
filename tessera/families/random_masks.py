"""Random blocks at a given density: a stress case, not a model."""

from __future__ import annotations

import numpy as np

from ..checks import check_fraction, check_int, is_int
from ..mask import MAX_TOKENS
from .common import finish, text_counts, uniform_bounds, variable_bounds
from .video import VideoMask


def random_blocks(num_heads: int, seq_len: int, block: int = 128, density: float = 0.1,
                  seed: int = 0, text_tokens: int = 0,
                  text_valid: int | None = None,
                  sizes: tuple[int, int] | None = None) -> VideoMask:
    """Each (head, query block, key block) selected independently with probability ``density``.

    The stress case, not a model. ``seq_len`` counts all tokens; the last ``text_tokens`` are
    text (text blocks as in the module docstring), the rest cut into ``block``-token blocks (the
    last short), or, with ``sizes=(lo, hi)``, into blocks of sizes drawn uniformly from
    [lo, hi] (the same blocks for queries and keys, as clusters give; ``block`` unused): the
    variable geometry physical mapping is for. ``num_heads=1`` gives one mask for all heads.
    Rows may be empty.
    """
    check_fraction(density, "density", zero=True)
    num_heads = check_int(num_heads, "num_heads", 1)
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
    video = rng.random((num_heads, n, n), dtype=np.float32) < density
    mask = finish(video, bounds, bounds, text_tokens, text_valid)
    params = dict(num_heads=num_heads, seq_len=seq_len, block=block, density=density, seed=seed,
                  text_tokens=text_tokens, text_valid=text_valid, sizes=sizes)
    return VideoMask(mask, None, "random_blocks", params)
