"""Pieces the mask families share: argument checks, block bounds, text-token blocks, top-p rows."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._array import array_module
from ..checks import check_int, is_int
from ..interop import as_array
from ..mask import MAX_TOKENS, BlockMask

Latent = tuple[int, int, int]


def with_text_identity(perm: np.ndarray | None, text_tokens: int) -> np.ndarray | None:
    """Extend a video permutation by the identity over the text tokens that follow."""
    if perm is None or text_tokens == 0:
        return perm
    n = perm.size
    return np.concatenate([perm, np.arange(n, n + text_tokens, dtype=np.int64)])


def _positive_ints(v: Any, name: str, what: str) -> tuple[int, int, int]:
    try:
        items = tuple(v)
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {v!r}") from None
    if isinstance(v, (str, bytes)) or not all(is_int(x) for x in items):
        raise TypeError(f"{name} must be {what}, got {v!r}")
    if len(items) != 3 or any(x <= 0 for x in items):
        raise ValueError(f"{name} must be {what}, got {v!r}")
    return tuple(int(x) for x in items)  # type: ignore[return-value]


def check_latent(latent: Sequence[int]) -> Latent:
    lat = _positive_ints(latent, "latent", "three positive ints (t, h, w)")
    if lat[0] * lat[1] * lat[2] > MAX_TOKENS:
        raise ValueError(f"latent {lat} makes {lat[0] * lat[1] * lat[2]} tokens; token offsets "
                         f"are int32 (at most {MAX_TOKENS})")
    return lat


def check_triple(v: Sequence[int], name: str) -> tuple[int, int, int]:
    return _positive_ints(v, name, "three positive ints")


def bounds_from_sizes(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def uniform_bounds(n: int, block: int) -> np.ndarray:
    block = check_int(block, "block", 1)
    nb = -(-n // block)
    return np.minimum(np.arange(nb + 1, dtype=np.int64) * block, n)


def variable_bounds(rng: np.random.Generator, n: int, lo: int, hi: int) -> np.ndarray:
    """Block bounds over ``n`` tokens, each block's size drawn uniformly from [lo, hi] by
    ``rng`` (the last block cut short)."""
    sizes = rng.integers(lo, hi + 1, size=n // lo + 1)
    bounds = np.r_[0, np.cumsum(sizes)]
    cut = int(np.searchsorted(bounds, n))
    return np.r_[bounds[:cut], n].astype(np.int64)


def mark_ranges(n_rows: int, n_cols: int, rows: np.ndarray, lo: np.ndarray,
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


def frame_segments(bounds: np.ndarray, frame: int) -> tuple[np.ndarray, ...]:
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


def text_counts(text_tokens: int, text_valid: int | None) -> tuple[int, int]:
    """(valid text tokens, padding slots), checked."""
    text_tokens = check_int(text_tokens, "text_tokens", 0)
    if text_valid is None:
        return text_tokens, 0
    valid = check_int(text_valid, "text_valid", 0)
    if valid > text_tokens:
        raise ValueError(f"text_valid must be None or an int in [0, text_tokens={text_tokens}], "
                         f"got {text_valid!r}")
    return valid, text_tokens - valid


def with_text(video: Any, q_bounds: np.ndarray, kv_bounds: np.ndarray, text_tokens: int,
               text_valid: int | None,
               text_first: bool = False) -> tuple[Any, np.ndarray, np.ndarray]:
    """Append the text blocks (see the module docstring) to a video block mask ``[..., nQ, nK]``
    -- or, with ``text_first``, put them before it (valid text, then padding), for sequences
    whose text precedes the video.

    Returns ``(mask, q_bounds, kv_bounds)`` over the whole sequence; ``mask`` stays in the
    array module of ``video``.
    """
    valid, pad = text_counts(text_tokens, text_valid)
    if valid == 0 and pad == 0:
        return video, q_bounds, kv_bounds
    if int(q_bounds[-1]) + valid + pad > MAX_TOKENS:
        raise ValueError(f"text_tokens={text_tokens}: video and text make "
                         f"{int(q_bounds[-1]) + valid + pad} tokens; token offsets are int32 "
                         f"(at most {MAX_TOKENS})")
    xp = array_module(video)
    sizes = [s for s in (valid, pad) if s]
    n_t = len(sizes)
    nq, nk = video.shape[-2], video.shape[-1]
    out = xp.zeros((*video.shape[:-2], nq + n_t, nk + n_t), dtype=bool)
    # where the video's blocks and the valid and padding text blocks sit
    v0, t_valid, t_pad = (n_t, 0, n_t - 1) if text_first else (0, nq, nq + n_t - 1)
    k_valid, k_pad = (0, n_t - 1) if text_first else (nk, nk + n_t - 1)
    out[..., v0:v0 + nq, v0:v0 + nk] = video
    if valid:
        out[..., v0:v0 + nq, k_valid] = True    # every video row sees the valid text block
        out[..., t_valid, v0:v0 + nk] = True    # valid text rows: all video + valid text
        out[..., t_valid, k_valid] = True
    if pad:
        out[..., t_pad, k_pad] = True  # padding sees only padding
    text = np.cumsum(sizes).astype(np.int64)
    if text_first:
        qb = np.concatenate([[0], text, text[-1] + q_bounds[1:]]).astype(np.int64)
        kb = np.concatenate([[0], text, text[-1] + kv_bounds[1:]]).astype(np.int64)
    else:
        qb = np.concatenate([q_bounds, q_bounds[-1] + text]).astype(np.int64)
        kb = np.concatenate([kv_bounds, kv_bounds[-1] + text]).astype(np.int64)
    return out, qb, kb


def finish(video: Any, q_bounds: np.ndarray, kv_bounds: np.ndarray, text_tokens: int,
            text_valid: int | None) -> BlockMask:
    dense, qb, kb = with_text(video, q_bounds, kv_bounds, text_tokens, text_valid)
    if dense.ndim == 3 and dense.shape[0] == 1:
        dense = dense[0]
    return BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)


def per_head(value: Any, is_single, name: str) -> tuple[list, bool]:
    """``([values], single)``: a single value, or a non-empty list of per-head values; a
    TypeError or ValueError naming ``name`` for anything else."""
    if is_single(value):
        return [value], True
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be one value or a list of them, one per head; got "
                        f"{value!r}")
    vals = list(value)
    if not vals:
        raise ValueError(f"{name}: a per-head list must not be empty")
    return vals, False


# ---------------------------------------------------------------------------- q/k helpers
def as_bhld(x: Any, name: str) -> Any:
    a = as_array(x, name)
    if a.ndim == 3:
        a = a[None]
    if a.ndim != 4:
        raise ValueError(f"{name} must be [B, H, L, D] or [H, L, D], got shape {tuple(a.shape)}")
    return a


def check_qk(q: Any, k: Any, n_tokens: int | None,
             repeat_kv: bool = True) -> tuple[Any, Any, Any]:
    """q and k as ``[B, H, L, D]`` arrays of one array module (and that module), checked
    against each other and ``n_tokens``; k repeated to q's heads (GQA) unless ``repeat_kv`` is
    False (the caller then maps heads itself)."""
    q, k = as_bhld(q, "q"), as_bhld(k, "k")
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
    if Hk != Hq and repeat_kv:
        k = xp.repeat(k, Hq // Hk, axis=1)
    return q, k, xp


def sorted_keep(order: Any, keep_sorted: Any, shape: tuple[int, ...], xp) -> Any:
    """Scatter a keep flag given in sorted order (``order`` per row) back to a bool ``shape``.
    A scatter of the flags (not boolean indexing, whose result size CuPy reads back): no host
    synchronization on the device."""
    n_rows = int(np.prod(shape[:-1]))
    n = shape[-1]
    order = order.reshape(n_rows, -1)
    out = xp.zeros((n_rows, n), dtype=bool)
    out[xp.arange(n_rows)[:, None], order] = keep_sorted.reshape(n_rows, -1)
    return out.reshape(shape)


_device_copies: dict[tuple[int, int], tuple[np.ndarray, Any]] = {}


def device_copy(a: np.ndarray, xp) -> Any:
    """``a`` on the current device, copied once: for the read-only host arrays the families
    cache (cube sizes), so that a mask made on the GPU copies nothing from the host -- which a
    CUDA graph being captured does not allow. ``xp`` numpy returns ``a``."""
    if xp is np:
        return a
    key = (id(a), int(xp.cuda.Device().id))
    got = _device_copies.get(key)
    if got is None or got[0] is not a:
        if len(_device_copies) > 256:
            _device_copies.clear()
        got = _device_copies[key] = (a, xp.asarray(a))
    return got[1]


def segment_sums(x: Any, bounds: np.ndarray, xp) -> Any:
    """Sums of ``x [..., N, D]`` over the token segments ``bounds`` (float64 accumulation; on
    the device by prefix sums, with no host synchronization)."""
    if xp is np:
        return np.add.reduceat(x.astype(np.float64), bounds[:-1], axis=-2)
    c = xp.cumsum(x.astype(np.float64), axis=-2)
    c = xp.concatenate([xp.zeros_like(c[..., :1, :]), c], axis=-2)
    b = xp.asarray(bounds)
    return c[..., b[1:], :] - c[..., b[:-1], :]


def top_p_rows(logits: Any, top_p: float, min_keep: int, xp) -> Any:
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
    return sorted_keep(order, keep, p.shape, xp)
