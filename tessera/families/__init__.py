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

from .clusters import semantic_clusters
from .frame_bands import spatial_temporal
from .pooled_topk import topk_pooled
from .radial_decay import radial, radial_frame_rule
from .random_masks import mixed_densities, random_blocks
from .tile_windows import sliding_tile
from .video import (
                    VideoMask,
                    apply_permutation,
                    invert_permutation,
                    temporal_permutation,
                    tile_permutation,
)

__all__ = ["VideoMask", "apply_permutation", "invert_permutation", "tile_permutation",
           "temporal_permutation", "sliding_tile", "spatial_temporal", "radial",
           "radial_frame_rule", "topk_pooled", "semantic_clusters", "random_blocks",
           "mixed_densities"]
