"""What every mask family returns (:class:`VideoMask`: a logical mask and the token order it is
expressed in) and the token permutations the families regroup tokens by."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .._array import array_module
from ..mask import BlockMask
from .common import check_latent, check_triple


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
    """The inverse permutation: ``inv[perm[p]] = p`` (same array module as ``perm``).
    ValueError unless ``perm`` holds each of 0 .. n-1 once (checked with one readback on the
    device): an inverse of anything else would leave entries unwritten."""
    xp = array_module(perm)
    perm = xp.asarray(perm)
    if perm.ndim != 1 or not np.issubdtype(perm.dtype, np.integer) or perm.dtype == np.bool_:
        raise ValueError(f"perm must be a 1-D integer array, got {perm.dtype} of shape "
                         f"{tuple(perm.shape)}")
    n = perm.size
    inside = (perm >= 0) & (perm < n)
    if not bool(inside.all()) or not bool(
            (xp.bincount(xp.where(inside, perm, 0), minlength=n) == 1).all()):
        raise ValueError(f"perm must hold each of 0 .. {n - 1} exactly once")
    inv = xp.empty_like(perm)
    inv[perm] = xp.arange(n, dtype=perm.dtype)
    return inv


def apply_permutation(x: Any, perm: Any, axis: int = -2) -> Any:
    """``x`` reordered along ``axis`` so that position ``p`` holds ``x[..., perm[p], ...]``.

    ``perm=None`` returns ``x`` unchanged. Works on numpy and CuPy (a host permutation is moved
    to the device when ``x`` is a CuPy array).
    """
    if perm is None:
        return x
    xp = array_module(x)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or \
            not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be an int in [{-x.ndim}, {x.ndim}) for an array of "
                         f"{x.ndim} dimensions, got {axis!r}")
    perm = xp.asarray(perm)
    n = x.shape[axis]
    if perm.ndim != 1 or perm.size != n or not np.issubdtype(perm.dtype, np.integer):
        raise ValueError(f"perm must be a 1-D int array of the {n} positions along axis "
                         f"{axis}, got {perm.dtype} of shape {tuple(perm.shape)}")
    if n and not bool(((perm >= 0) & (perm < n)).all()):
        raise ValueError(f"perm must hold positions in [0, {n})")
    return xp.take(x, perm, axis=axis)


def tile_permutation(latent: Sequence[int], tile: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Regroup frame-major video tokens so that each 3D tile is contiguous.

    Tiles of ``tile_t x tile_h x tile_w`` tokens are ordered frame-tile-major (tile ``(i, j, k)``
    of the ``ceil(T/tile_t) x ceil(H/tile_h) x ceil(W/tile_w)`` grid is number
    ``(i * nH + j) * nW + k``); within a tile, tokens keep their frame-major order. Edge tiles
    are partial when a dimension does not divide. Returns ``(perm, sizes)``: the permutation of
    the ``T*H*W`` video tokens and the token count of each tile (int64, in tile order).
    """
    return _tile_permutation(check_latent(latent), check_triple(tile, "tile"))


@functools.lru_cache(maxsize=64)  # every layer of every step asks again: made once, read-only
def _tile_permutation(latent: tuple[int, int, int],
                      tile: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    T, H, W = latent
    ct, ch, cw = tile
    gt, gh, gw = -(-T // ct), -(-H // ch), -(-W // cw)
    tid = ((np.arange(T)[:, None, None] // ct * gh + np.arange(H)[None, :, None] // ch) * gw
           + np.arange(W)[None, None, :] // cw)
    perm = np.argsort(tid.reshape(-1), kind="stable").astype(np.int64)

    def extents(n: int, c: int, g: int) -> np.ndarray:
        return np.minimum(c, n - np.arange(g) * c)

    sizes = (extents(T, ct, gt)[:, None, None] * extents(H, ch, gh)[None, :, None]
             * extents(W, cw, gw)[None, None, :]).reshape(-1).astype(np.int64)
    perm.flags.writeable = sizes.flags.writeable = False
    return perm, sizes


def temporal_permutation(latent: Sequence[int]) -> np.ndarray:
    """Token-major order: position ``(h * W + w) * T + t`` holds original token ``(t*H + h)*W + w``.

    The ``T`` tokens of each spatial position become contiguous (positions in raster order,
    frames in order within each). Covers the video tokens only; text stays at the end.
    """
    T, H, W = check_latent(latent)
    return np.arange(T * H * W, dtype=np.int64).reshape(T, H * W).T.reshape(-1).copy()
