"""Every launch of the planner kernels (``tessera/cuda/plan.cu``) but the fused device
planner's own (``device_planner.py``), in one place: the physical mapping (``mapping.py``) and
the regime selection's mask measures call these and never launch a kernel themselves.

Each function takes the mask's dense block rows on the device (uint8 ``[rows, nKB]``) and the
arrays to fill, or returns the few numbers it reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._array import Workspace, to_numpy
from ..capture import device_copy
from ..cuda import loader
from ..cuda.variants import Variant
from ..mask import BlockMask

__all__ = ["RowStats", "device_bounds", "launch_row_stats", "row_stats", "write_group_spans",
           "mask_pairs", "tiling_pairs", "key_walk_chunks"]

_THREADS = 256


def _grid(warps: int) -> tuple[int]:
    """A warp per item, 256 threads a block."""
    return ((warps * 32 + _THREADS - 1) // _THREADS,)


def device_bounds(bounds: np.ndarray, xp) -> Any:
    """A mask's token bounds (host int64) in ``xp``, copied to the device once per geometry."""
    if xp is np or not isinstance(bounds, np.ndarray):
        return xp.asarray(bounds)
    return device_copy(("bounds", bounds.tobytes()), lambda: xp.asarray(bounds), xp)


def launch_row_stats(mask: BlockMask, dense: Any, block_n: int, count: Any, nspans: Any,
                     key_tokens: Any, overlap_tokens: Any, chunks: Any, identical: Any,
                     pack_keys: bool = False, walk_chunks: Any = None,
                     tile_rows: int = 0) -> None:
    """Launch plan_row_stats over ``dense`` (uint8 [rows, nKB]) into the given arrays or raw
    device pointers (np.uint64; 0 for count and the token sums leaves them uncomputed); chunks
    of each row's keys end to end with ``pack_keys``. ``walk_chunks`` (uint64 [2], zeroed):
    both key walks' chunks over ``tile_rows``-row tiles added into it (:func:`key_walk_chunks`)."""
    n_rows, n_kv = dense.shape
    i32 = np.int32
    xp = mask.xp
    walk = (np.uint64(0), i32(0), np.uint64(0)) if walk_chunks is None else (
        device_bounds(mask.q_bounds, xp), i32(tile_rows), walk_chunks)
    loader.load_kernel(Variant("plan.cu", "plan_row_stats"))(
        _grid(n_rows), (_THREADS,),
        (dense, i32(n_rows), i32(n_kv), i32(mask.num_q_blocks),
         device_bounds(mask.kv_bounds, xp), i32(block_n), count, nspans, key_tokens,
         overlap_tokens, chunks, identical, i32(pack_keys), *walk))


@dataclass
class RowStats:
    """plan_row_stats' outputs, one entry a mask row (device arrays).

    Attributes:
        count: selected key blocks (int32).
        key_tokens: selected key tokens (int64).
        overlap_tokens: key tokens shared with the row before it in its head (int64).
        nspans: key spans: maximal runs of adjacent selected blocks (int32).
        chunks: BN-key chunks of its spans, or of its keys end to end with ``pack_keys``.
        identical: uint8, the row equals the row before it in its head.
    """

    count: Any
    key_tokens: Any
    overlap_tokens: Any
    nspans: Any
    chunks: Any
    identical: Any


def row_stats(mask: BlockMask, dense: Any, block_n: int, pack_keys: bool = False) -> RowStats:
    """Per-row statistics of ``dense`` by plan_row_stats (:class:`RowStats`)."""
    n_rows = dense.shape[0]
    ws = Workspace(mask.xp, (("key_tokens", np.int64, n_rows),
                             ("overlap_tokens", np.int64, n_rows),
                             ("count", np.int32, n_rows), ("nspans", np.int32, n_rows),
                             ("chunks", np.int32, n_rows), ("identical", np.uint8, n_rows)))
    out = RowStats(**{f: ws.view(f) for f in ("count", "key_tokens", "overlap_tokens",
                                               "nspans", "chunks", "identical")})
    launch_row_stats(mask, dense, block_n, out.count, out.nspans, out.key_tokens,
                     out.overlap_tokens, out.chunks, out.identical, pack_keys)
    return out


def write_group_spans(mask: BlockMask, dense: Any, span_dst: Any, nspans: Any, row_q0: Any,
                      row_q1: Any, spans: Any) -> None:
    """plan_write_spans: the ``nspans[r]`` key spans of every row ``r`` with ``span_dst[r] >= 0``
    written at ``span_dst[r]``, restricted to query tokens ``[row_q0[r], row_q1[r])``."""
    n_rows, n_kv = dense.shape
    loader.load_kernel(Variant("plan.cu", "plan_write_spans"))(
        _grid(n_rows), (_THREADS,),
        (dense, np.int32(n_rows), np.int32(n_kv), device_bounds(mask.kv_bounds, mask.xp),
         span_dst, nspans, row_q0, row_q1, spans))


def mask_pairs(mask: BlockMask, dense: Any) -> tuple[int, int]:
    """(total, heaviest row) selected token pairs, by the mask_pairs kernel: one launch and one
    16-byte copy (the regime table's features, runtime/regime/features.py; with the array
    operations before it, plans that looked up the table took ~0.5 ms longer on the H200,
    docs/decisions.md)."""
    xp = mask.xp
    n_rows, n_kv = dense.shape
    out = xp.zeros(2, dtype=np.uint64)
    loader.load_kernel(Variant("plan.cu", "mask_pairs"))(
        _grid(n_rows), (_THREADS,),
        (dense, np.int32(n_rows), np.int32(n_kv), np.int32(mask.num_q_blocks),
         device_bounds(mask.q_bounds, xp), device_bounds(mask.kv_bounds, xp), out))
    total, heaviest = (int(x) for x in to_numpy(out))
    return total, heaviest


def tiling_pairs(mask: BlockMask, dense: Any, per_bh: int, lo: Any, hi: Any,
                 tile_rows: int) -> tuple[int, int]:
    """(plain, aligned) pair estimates of ``mapping.tiling_pairs`` by the tiling_pairs kernel:
    one launch and one 16-byte copy back (as array operations, ~15 launches, the estimate cost
    ~1 ms of a request on the H200, docs/decisions.md). ``per_bh``, ``lo``, ``hi``: the aligned
    tiles of each mask head and the query blocks each meets."""
    xp = mask.xp
    n_rows, n_kv = dense.shape
    out = xp.zeros(2, dtype=np.uint64)
    warps = n_rows + n_rows // mask.num_q_blocks * per_bh
    loader.load_kernel(Variant("plan.cu", "tiling_pairs"))(
        _grid(warps), (_THREADS,),
        (dense, np.int32(n_rows), np.int32(n_kv), np.int32(mask.num_q_blocks),
         np.int32(per_bh), device_bounds(mask.q_bounds, xp),
         device_bounds(mask.kv_bounds, xp), lo, hi, np.int32(tile_rows), out))
    plain, aligned = (int(x) for x in to_numpy(out))
    return plain, aligned


def key_walk_chunks(mask: BlockMask, dense: Any, block_n: int,
                    tile_rows: int) -> tuple[int, int]:
    """(span by span, packed) key chunks of ``mapping.key_walk_chunks``: one launch of
    plan_row_stats summing both walks' weighted chunks, one 16-byte copy back (array operations
    over its per-row outputs cost ~0.5 ms of a request on the H200)."""
    xp = mask.xp
    n_rows = dense.shape[0]
    ws = Workspace(xp, (("nspans", np.int32, n_rows), ("chunks", np.int32, n_rows),
                        ("identical", np.uint8, n_rows)))
    out = xp.zeros(2, dtype=np.uint64)
    null = np.uint64(0)
    launch_row_stats(mask, dense, block_n, null, ws.view("nspans"), null, null,
                     ws.view("chunks"), ws.view("identical"), walk_chunks=out,
                     tile_rows=tile_rows)
    span, packed = (int(c) for c in to_numpy(out))
    return span, packed
