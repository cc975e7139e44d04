"""The logical block mask: what the caller means, never changed by Tessera.

A :class:`BlockMask` says which query blocks attend to which key blocks. Its geometry is two
lists of token offsets (``q_bounds``, ``kv_bounds``); blocks may be uniform, ragged at the end,
or of any size. Its selection is one CSR matrix per (batch, head), stored as a single CSR matrix
whose rows are ``(batch, head, query block)`` in that order, so a whole mask is three flat arrays
that live on the host (numpy) or on the device (CuPy).

Semantics: query token ``t`` in block ``i`` attends to the union of the key tokens of the blocks
selected in row ``i``, with the softmax over exactly those keys. A row that selects nothing gives
output 0 and log-sum-exp ``-inf``.

Indices within a row are kept sorted and unique: constructors sort them, and reject duplicates
(a duplicate usually means the caller built the mask wrongly, so silently merging would hide it).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from ._array import array_module, cupy_or_none, is_cupy, private_copy, segment_ids, to_numpy
from .capture import stream_capturing
from .checks import check_int
from .cuda import device
from .interop import as_array, torch_private_copy
from .streams import StreamMark, hold_while_read, on_producer_stream, stream_identity

__all__ = ["BlockMask"]

BlockSize = int | tuple[int, int]
# Token offsets are int32 in the task queue and the kernels.
MAX_TOKENS = 2**31 - 1


def _is_torch_cuda(a: Any) -> bool:
    return type(a).__module__.startswith("torch") and bool(getattr(a, "is_cuda", False))


def _check_bounds(bounds: Any, name: str) -> np.ndarray:
    """Validate token offsets of blocks: 1-D integers, starting at 0, strictly increasing."""
    if isinstance(bounds, np.ndarray):
        if not bounds.flags.writeable and _validated.raw_of(bounds) is not None:
            return bounds  # one of the validated arrays masks of its geometry share
        if bounds.ndim == 1 and np.issubdtype(bounds.dtype, np.integer):
            # Requests bring the same few geometries again and again: validated once each.
            return _validated.get(bounds.astype(np.int64, copy=False).tobytes(), name)
    return _validate_bounds(bounds, name)


class _ValidatedBounds:
    """Validated bound arrays by their bytes, and the bytes of each by the array's identity:
    a request's mask validates its geometry by one lookup, and the kept plans and the regime
    selection key on the bytes without converting the array again (``bounds_key``). The arrays
    are read-only, shared by every mask of their geometry; the ``size`` most recently used are
    kept."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._by_raw: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._raw_of: dict[int, tuple[np.ndarray, bytes]] = {}
        self._lock = threading.Lock()

    def get(self, raw: bytes, name: str) -> np.ndarray:
        with self._lock:
            b = self._by_raw.get(raw)
            if b is not None:
                self._by_raw.move_to_end(raw)
                return b
        b = _validate_bounds(np.frombuffer(raw, dtype=np.int64).copy(), name)
        b.flags.writeable = False
        with self._lock:
            if raw in self._by_raw:  # another thread validated it meanwhile
                return self._by_raw[raw]
            self._by_raw[raw] = b
            self._raw_of[id(b)] = (b, raw)
            while len(self._by_raw) > self._size:
                _, old = self._by_raw.popitem(last=False)
                del self._raw_of[id(old)]
        return b

    def raw_of(self, b: np.ndarray) -> bytes | None:
        """The bytes of ``b`` when it is one of the validated arrays, else None."""
        hit = self._raw_of.get(id(b))
        return hit[1] if hit is not None and hit[0] is b else None


_validated = _ValidatedBounds(64)


def bounds_key(bounds: np.ndarray) -> bytes:
    """The int64 bytes of a geometry's bounds, for keys of caches over geometries (the stored
    bytes of a mask's validated bounds: no conversion)."""
    raw = _validated.raw_of(bounds)
    return raw if raw is not None else np.asarray(bounds, dtype=np.int64).tobytes()


def _validate_bounds(bounds: Any, name: str) -> np.ndarray:
    b = to_numpy(as_array(bounds, name))
    if b.ndim != 1 or b.size < 2:
        raise ValueError(f"{name} must be a 1-D array of at least 2 offsets, got shape {b.shape}")
    if not np.issubdtype(b.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {b.dtype}")
    b = b.astype(np.int64)
    if b[0] != 0:
        raise ValueError(f"{name} must start at 0, got {int(b[0])}")
    if np.any(np.diff(b) <= 0):
        bad = int(np.argmax(np.diff(b) <= 0))
        raise ValueError(f"{name} must be strictly increasing: {name}[{bad}]={int(b[bad])} "
                         f">= {name}[{bad + 1}]={int(b[bad + 1])}")
    if b[-1] > MAX_TOKENS:
        raise ValueError(f"{name}: sequence length {int(b[-1])} does not fit in int32 "
                         f"(at most {MAX_TOKENS} tokens)")
    return b


def _uniform_bounds(n_blocks: int, block: int, seq_len: int | None, which: str) -> np.ndarray:
    """Offsets of ``n_blocks`` blocks of ``block`` tokens, the last one short if ``seq_len`` says
    so."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block <= 0:
        raise ValueError(f"block_size must be a positive int or a (q, kv) pair of them, got "
                         f"{block!r} for {which}")
    if n_blocks < 1:
        raise ValueError(f"the mask needs at least one {which} block, got {n_blocks}")
    full = n_blocks * int(block)
    if seq_len is None:
        seq_len = full
    if not isinstance(seq_len, (int, np.integer)):
        raise TypeError(f"seq_len_{which} must be an int, got {type(seq_len).__name__}")
    if not (full - block < seq_len <= full):
        raise ValueError(f"seq_len_{which}={seq_len} does not fit {n_blocks} blocks of {block} "
                         f"tokens (must be in ({full - block}, {full}])")
    if seq_len > MAX_TOKENS:
        raise ValueError(f"block_size: {n_blocks} {which} blocks of {block} tokens make "
                         f"{seq_len} tokens; token offsets are int32 (at most {MAX_TOKENS})")
    return _uniform_offsets(int(n_blocks), int(block), int(seq_len))


@functools.lru_cache(maxsize=64)  # every request of a model builds masks of the same geometry
def _uniform_offsets(n_blocks: int, block: int, seq_len: int) -> np.ndarray:
    """The validated, shared offsets of ``n_blocks`` blocks of ``block`` tokens ending at
    ``seq_len``."""
    b = np.minimum(np.arange(n_blocks + 1, dtype=np.int64) * block, seq_len)
    return _validated.get(b.tobytes(), "bounds")


def _geometry(n_q: int, n_kv: int, block_size: BlockSize | None, q_bounds: Any, kv_bounds: Any,
              seq_len_q: int | None, seq_len_kv: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Resolve the two bound arrays from either a block size or explicit bounds."""
    if block_size is not None:
        if q_bounds is not None or kv_bounds is not None:
            raise ValueError("give either block_size or q_bounds/kv_bounds, not both")
        if np.isscalar(block_size):
            bq = bk = block_size
        elif isinstance(block_size, (tuple, list)) and len(block_size) == 2:
            bq, bk = block_size
        else:
            raise ValueError(f"block_size must be an int or a (q, kv) pair of ints, got "
                             f"{block_size!r}")
        return (_uniform_bounds(n_q, bq, seq_len_q, "q"),
                _uniform_bounds(n_kv, bk, seq_len_kv, "kv"))
    if q_bounds is None or kv_bounds is None:
        raise ValueError("give block_size, or both q_bounds and kv_bounds")
    if seq_len_q is not None or seq_len_kv is not None:
        raise ValueError("seq_len_q/seq_len_kv only apply with block_size; "
                         "explicit bounds already end at the sequence length")
    qb = _check_bounds(q_bounds, "q_bounds")
    kb = _check_bounds(kv_bounds, "kv_bounds")
    if qb.size - 1 != n_q:
        raise ValueError(f"q_bounds has {qb.size - 1} blocks but the mask has {n_q} query blocks")
    if kb.size - 1 != n_kv:
        raise ValueError(f"kv_bounds has {kb.size - 1} blocks but the mask has {n_kv} key blocks")
    return qb, kb


def _lead_shape(ndim_lead: int, shape: tuple[int, ...], name: str,
                layout: str = "nQB, nKB") -> tuple[int, int]:
    if ndim_lead == 0:
        return 1, 1
    if ndim_lead == 1:
        return 1, shape[0]
    if ndim_lead == 2:
        return shape[0], shape[1]
    raise ValueError(f"{name} must be [{layout}], [H, {layout}] or [B, H, {layout}]; "
                     f"got {len(shape) + len(layout.split(','))} dimensions")


_trusted = threading.local()
_trusted.depth = 0


@contextlib.contextmanager
def _trusting():
    """Masks made inside skip the CSR contents check (a factory checked them already)."""
    _trusted.depth = getattr(_trusted, "depth", 0) + 1
    try:
        yield
    finally:
        _trusted.depth -= 1


def _checked_csr(indptr: Any, indices: Any, n_rows: int, n_kv: int,
                 contents: bool) -> tuple[Any, Any]:
    """``indptr`` (int64) and ``indices`` (int32) of a CSR selection of ``n_rows`` rows of
    ``n_kv`` key blocks, checked (with ``contents``, what they hold too); ValueError or TypeError
    naming the argument otherwise."""
    arrays = []
    for a, name in ((indptr, "indptr"), (indices, "indices")):
        if isinstance(a, (list, tuple)):
            a = np.asarray(a, dtype=np.int64) if len(a) == 0 else np.asarray(a)
        if not (isinstance(a, np.ndarray) or is_cupy(a)):
            raise TypeError(f"{name} must be a 1-D numpy or CuPy integer array, got "
                            f"{type(a).__name__}")
        if not np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
            raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(a.shape)}")
        arrays.append(a)
    indptr, indices = arrays
    if is_cupy(indptr) != is_cupy(indices):
        raise ValueError("indptr and indices must both be numpy or both CuPy arrays")
    if tuple(indptr.shape) != (n_rows + 1,):
        raise ValueError(f"indptr must have B*H*nQB + 1 = {n_rows + 1} entries, got shape "
                         f"{tuple(indptr.shape)}")
    indptr = indptr.astype(np.int64, copy=False)
    if contents:
        _check_csr_contents(indptr, indices, n_kv)
    return indptr, indices.astype(np.int32, copy=False)


def _check_csr_contents(indptr: Any, indices: Any, n_kv: int) -> None:
    """ValueError naming what is wrong in a CSR selection. On the device, one readback of
    whether anything is (none while CuPy's stream is captured); the message is then made on
    the host."""
    xp = array_module(indptr, indices)
    if xp is not np:
        if stream_capturing(int(xp.cuda.get_current_stream().ptr)):
            return
        nnz = indices.size
        bad = (indptr[0] != 0) | (indptr[-1] != nnz) | xp.any(indptr[1:] < indptr[:-1])
        if nnz:
            bad |= xp.any((indices < 0) | (indices >= n_kv))
            rows = xp.searchsorted(indptr[1:], xp.arange(nnz), side="right")
            bad |= xp.any((rows[1:] == rows[:-1]) & (indices[1:] <= indices[:-1]))
        if not bool(bad):
            return
        indptr, indices = indptr.get(), indices.get()
    nnz = indices.size
    if indptr[0] != 0:
        raise ValueError(f"indptr must start at 0, got indptr[0]={int(indptr[0])}")
    step = np.diff(indptr)
    if np.any(step < 0):
        i = int(np.argmax(step < 0))
        raise ValueError(f"indptr must not decrease: indptr[{i}]={int(indptr[i])} > "
                         f"indptr[{i + 1}]={int(indptr[i + 1])}")
    if indptr[-1] != nnz:
        raise ValueError(f"indptr[-1] must equal the number of indices ({nnz}), got "
                         f"{int(indptr[-1])}")
    out = (indices < 0) | (indices >= n_kv)
    if np.any(out):
        j = int(np.argmax(out))
        raise ValueError(f"indices must be key blocks in [0, {n_kv}): indices[{j}]="
                         f"{int(indices[j])}")
    rows = np.repeat(np.arange(step.size), step)
    disorder = (rows[1:] == rows[:-1]) & (indices[1:] <= indices[:-1])
    if np.any(disorder):
        j = int(np.argmax(disorder)) + 1
        raise ValueError(f"indices must be sorted and unique within each row: row "
                         f"{int(rows[j])} has {int(indices[j - 1])} before {int(indices[j])}")


@dataclass(frozen=True, eq=False)
class BlockMask:
    """A logical block mask: geometry plus a batched CSR selection.

    Attributes:
        q_bounds: int64 numpy ``[nQB + 1]``, token offsets of the query blocks (read-only:
            masks of one geometry share it).
        kv_bounds: int64 numpy ``[nKB + 1]``, token offsets of the key blocks (read-only).
        indptr: int64 ``[B * H * nQB + 1]`` (numpy or CuPy); row ``(b, h, i)`` is
            ``(b * H + h) * nQB + i``.
        indices: int32 ``[nnz]``, selected key blocks, sorted and unique within each row.
        (Both are derived from ``dense_rows`` on first use when the mask came from a dense
        matrix.)
        batch_heads: ``(B, H)``; each is 1 (broadcast) or the real count. H counts query heads
            or key/value heads; :meth:`head_index` resolves which at attention time.
    """

    q_bounds: np.ndarray
    kv_bounds: np.ndarray
    _indptr: Any
    _indices: Any
    batch_heads: tuple[int, int]
    # A private copy of the dense block matrix [B*H*nQB, nKB] when the mask was built from one:
    # the mapping reads it for O(1) "is key block j selected in row r" lookups, and the device
    # planner plans from it directly. The CSR arrays are then derived only when first read.
    dense_rows: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Checks every field and names the one at fault: the geometry, ``(B, H)``, and the
        selection -- dense rows' dtype and shape; CSR offsets that start at 0, never decrease
        and end at the number of indices, key blocks in range, sorted and unique within each
        row. A device CSR selection is checked with one readback, except while CuPy's stream is
        captured into a CUDA graph (no readback possible): its planning then stays in bounds
        whatever the arrays hold (``to_dense`` clamps)."""
        object.__setattr__(self, "q_bounds", _check_bounds(self.q_bounds, "q_bounds"))
        object.__setattr__(self, "kv_bounds", _check_bounds(self.kv_bounds, "kv_bounds"))
        bh = self.batch_heads
        if (not isinstance(bh, tuple) or len(bh) != 2 or any(
                isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 for x in bh)):
            raise ValueError(f"batch_heads must be a (B, H) pair of positive ints, got {bh!r}")
        object.__setattr__(self, "batch_heads", (int(bh[0]), int(bh[1])))
        rows = self.batch_heads[0] * self.batch_heads[1] * (self.q_bounds.size - 1)
        n_kv = self.kv_bounds.size - 1
        if self.dense_rows is not None:
            d = self.dense_rows
            if not (isinstance(d, np.ndarray) or is_cupy(d)):
                raise TypeError(f"dense_rows must be a numpy or CuPy bool array, got "
                                f"{type(d).__name__}")
            if d.dtype != np.bool_ or tuple(d.shape) != (rows, n_kv):
                raise ValueError(f"dense_rows must be bool [{rows}, {n_kv}] (B*H*nQB, nKB), got "
                                 f"{d.dtype} {tuple(d.shape)}")
        elif self._indptr is None or self._indices is None:
            raise ValueError("a BlockMask needs dense_rows or both indptr and indices (build "
                             "one with BlockMask.from_dense, from_scipy or from_indices)")
        if self._indptr is not None or self._indices is not None:
            indptr, indices = _checked_csr(self._indptr, self._indices, rows, n_kv,
                                           contents=not getattr(_trusted, "depth", 0))
            object.__setattr__(self, "_indptr", indptr)
            object.__setattr__(self, "_indices", indices)
        if self._in_cupy:
            # Where the selection's arrays were written: readers on other streams wait for it.
            with self.device_context():
                mark = StreamMark.here()
            object.__setattr__(self, "_written", mark)
            object.__setattr__(self, "_made_on", mark.on)  # whose memory pool holds them

    @property
    def indptr(self) -> Any:
        """int64 ``[B * H * nQB + 1]`` row offsets into :attr:`indices`."""
        if self._indptr is None:
            self._derive_csr()
        return self._indptr

    @property
    def indices(self) -> Any:
        """int32 ``[nnz]`` selected key blocks, sorted and unique within each row."""
        if self._indices is None:
            self._derive_csr()
        return self._indices

    def _derive_csr(self) -> None:
        with self.reading() as mark:
            flat = self.dense_rows
            xp = array_module(flat)
            counts = flat.sum(axis=1, dtype=np.int64)
            indptr = xp.zeros(flat.shape[0] + 1, dtype=np.int64)
            xp.cumsum(counts, out=indptr[1:])
            indices = xp.nonzero(flat)[1].astype(np.int32)  # row-major: sorted within each row
            object.__setattr__(self, "_indptr", indptr)  # a cache on a frozen value
            object.__setattr__(self, "_indices", indices)
            if mark is not None:  # the new arrays are this stream's writes (and memory)
                mark.again()

    def reading(self) -> "_Reading":
        """A context for work that reads the selection's device arrays on CuPy's current stream
        of the mask's device: the stream first waits for the arrays' writes when another stream
        made them (a mask made on a PyTorch side stream, planned on the caller's), and when the
        work is enqueued the mask is held until that stream has run it (its memory belongs to
        the other stream's pool). Enters as the mask's :class:`~tessera.streams.StreamMark`
        (None for a host mask). Planning and every method that reads the arrays use it."""
        return _Reading(self)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dense(cls, mask: Any, *, block_size: BlockSize | None = None, q_bounds: Any = None,
                   kv_bounds: Any = None, seq_len_q: int | None = None,
                   seq_len_kv: int | None = None) -> "BlockMask":
        """Build from a boolean block matrix ``[nQB, nKB]``, ``[H, nQB, nKB]`` or
        ``[B, H, nQB, nKB]``.

        Accepts numpy, CuPy or any DLPack tensor; a device tensor gives a device mask (no copy to
        the host). Geometry is ``block_size`` (int or ``(q, kv)``, the last block may be short when
        ``seq_len_q``/``seq_len_kv`` say so) or explicit ``q_bounds``/``kv_bounds``.
        """
        # A torch tensor's copy goes on torch's current stream, after whatever wrote the tensor
        # (and into a CUDA graph's memory while that stream is captured).
        with on_producer_stream(mask):
            return cls._from_dense(mask, block_size, q_bounds, kv_bounds, seq_len_q, seq_len_kv)

    @classmethod
    def _from_dense(cls, mask: Any, block_size: BlockSize | None, q_bounds: Any, kv_bounds: Any,
                    seq_len_q: int | None, seq_len_kv: int | None) -> "BlockMask":
        # A CUDA torch tensor is copied straight from its memory where it can be (the common
        # request: a block matrix computed by the model, on its current stream).
        if mask is None or sp.issparse(mask):
            raise TypeError("mask must be a boolean block matrix (numpy, CuPy or a DLPack "
                            f"tensor), got {type(mask).__name__}"
                            + ("; use BlockMask.from_scipy for scipy sparse matrices"
                               if mask is not None else ""))
        copied = torch_private_copy(mask) if _is_torch_cuda(mask) else None
        m = copied if copied is not None else as_array(mask, "mask")
        if m.dtype != np.bool_:
            raise TypeError(f"mask must be boolean, got dtype {m.dtype}")
        if m.ndim < 2:
            raise ValueError(f"mask must have at least 2 dimensions [nQB, nKB], got {m.ndim}")
        bm, hm = _lead_shape(m.ndim - 2, m.shape[:-2], "mask")
        n_q, n_kv = m.shape[-2], m.shape[-1]
        if bm * hm == 0:
            raise ValueError(f"mask must have at least one batch and one head, got shape "
                             f"{tuple(m.shape)}")
        qb, kb = _geometry(n_q, n_kv, block_size, q_bounds, kv_bounds, seq_len_q, seq_len_kv)
        flat = m.reshape(bm * hm * n_q, n_kv)
        # CSR is derived on first use: a device mask planned by the device planner never needs it.
        return cls(qb, kb, None, None, (bm, hm),
                   dense_rows=flat if copied is not None else private_copy(flat))

    @classmethod
    def from_scipy(cls, matrices: Any, *, block_size: BlockSize | None = None,
                   q_bounds: Any = None, kv_bounds: Any = None, seq_len_q: int | None = None,
                   seq_len_kv: int | None = None) -> "BlockMask":
        """Build from a scipy sparse matrix, a list of them per head, or a list of lists ``[B][H]``.

        A CSR/COO/any sparse matrix is the block matrix ``[nQB, nKB]`` (stored entries that are
        zero or False are not selected). A ``bsr_array`` is read as the token-level matrix: its
        block size is the geometry and its stored blocks are the selection.
        """

        if sp.issparse(matrices):
            grid = [[matrices]]
        elif isinstance(matrices, Sequence) and len(matrices) > 0:
            if all(sp.issparse(x) for x in matrices):
                grid = [list(matrices)]
            elif all(isinstance(r, Sequence) and r and all(sp.issparse(x) for x in r)
                     for r in matrices):
                grid = [list(r) for r in matrices]
                if len({len(r) for r in grid}) != 1:
                    raise ValueError("matrices: every batch must list the same number of heads")
            else:
                raise TypeError("matrices must be a scipy sparse matrix, a list of them, "
                                "or a list of lists of them")
        else:
            raise TypeError("matrices must be a scipy sparse matrix, a list of them, "
                            "or a list of lists of them")

        flat = [x for row in grid for x in row]
        is_bsr = [x.format == "bsr" for x in flat]
        if any(is_bsr):
            if not all(is_bsr):
                raise ValueError("matrices: do not mix bsr with other formats")
            blocks = {x.blocksize for x in flat}
            if len(blocks) != 1:
                raise ValueError(f"matrices: all bsr blocksizes must agree, got {sorted(blocks)}")
            if (block_size is not None or q_bounds is not None or kv_bounds is not None
                    or seq_len_q is not None or seq_len_kv is not None):
                raise ValueError("block_size/bounds/seq_len come from the bsr blocksize and "
                                 "shape; do not pass them")
            (bq, bk), = blocks
            lq, lk = flat[0].shape
            block_size = (bq, bk)
            seq_len_q, seq_len_kv = lq, lk
            csrs = [sp.csr_array((np.ones(x.indices.size, bool), x.indices, x.indptr),
                                 shape=(lq // bq, lk // bk)) for x in flat]
        else:
            csrs = []
            for i, x in enumerate(flat):
                c = sp.coo_array(x)
                keep = c.data != 0  # stored zeros / False are not selected
                rows, cols = c.row[keep].astype(np.int64), c.col[keep].astype(np.int64)
                key = rows * max(c.shape[1], 1) + cols
                if np.unique(key).size != key.size:
                    raise ValueError(f"matrices[{i}]: an entry is stored twice (duplicates are "
                                     "refused: summing them could drop or add a block)")
                csrs.append(sp.csr_array((np.ones(rows.size, bool), (rows, cols)),
                                         shape=c.shape))
        shapes = {c.shape for c in csrs}
        if len(shapes) != 1:
            raise ValueError("matrices: all block matrices must have one shape, got "
                             f"{sorted(shapes)}")
        (n_q, n_kv), = shapes
        qb, kb = _geometry(n_q, n_kv, block_size, q_bounds, kv_bounds, seq_len_q, seq_len_kv)
        counts = np.concatenate([np.diff(c.indptr) for c in csrs]).astype(np.int64)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        indices = np.concatenate([c.indices for c in csrs]).astype(np.int32)
        # Indices are sorted (and checked for range and duplicates) per row below.
        mask = cls._sorted_checked(qb, kb, indptr, indices, (len(grid), len(grid[0])),
                                   "matrices")
        return mask

    @classmethod
    def from_indices(cls, kv_num_blocks: Any, kv_indices: Any, *,
                     block_size: BlockSize | None = None, q_bounds: Any = None,
                     kv_bounds: Any = None, seq_len_q: int | None = None,
                     seq_len_kv: int | None = None, num_kv_blocks: int | None = None
                     ) -> "BlockMask":
        """Build from FlexAttention's layout: ``kv_num_blocks [..., nQB]`` and ``kv_indices
        [..., nQB, K]``, the first ``kv_num_blocks`` entries of each row valid, in any order.

        ``num_kv_blocks`` (nKB) defaults to ``kv_indices.shape[-1]``, as in FlexAttention, unless
        ``kv_bounds`` gives it. Rows are sorted; a duplicate or out-of-range index is an error.
        """
        counts = as_array(kv_num_blocks, "kv_num_blocks")
        idx = as_array(kv_indices, "kv_indices")
        for a, name in ((counts, "kv_num_blocks"), (idx, "kv_indices")):
            if not np.issubdtype(a.dtype, np.integer):
                raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
        if idx.ndim != counts.ndim + 1 or idx.shape[:-1] != counts.shape:
            raise ValueError(f"kv_indices shape {tuple(idx.shape)} must be kv_num_blocks shape "
                             f"{tuple(counts.shape)} plus one trailing dimension")
        if counts.ndim < 1:
            raise ValueError("kv_num_blocks must have at least 1 dimension [nQB]")
        bm, hm = _lead_shape(counts.ndim - 1, counts.shape[:-1], "kv_num_blocks", "nQB")
        n_q, width = counts.shape[-1], idx.shape[-1]
        if num_kv_blocks is None:
            num_kv_blocks = (len(kv_bounds) - 1) if kv_bounds is not None else width
            if num_kv_blocks == 0:
                raise ValueError("kv_indices has width 0: pass num_kv_blocks (the number of key "
                                 "blocks) or kv_bounds")
        if isinstance(num_kv_blocks, bool) or not isinstance(num_kv_blocks, (int, np.integer)) \
                or num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be a positive int, got {num_kv_blocks!r}")
        if bm * hm * n_q == 0:
            raise ValueError(f"kv_num_blocks must have at least one batch, head and query "
                             f"block, got shape {tuple(counts.shape)}")
        qb, kb = _geometry(n_q, num_kv_blocks, block_size, q_bounds, kv_bounds, seq_len_q,
                           seq_len_kv)
        xp = array_module(counts, idx)
        counts = xp.asarray(counts).reshape(-1).astype(np.int64)
        idx = xp.asarray(idx).reshape(counts.size, width)
        if counts.size and bool(((counts < 0) | (counts > width)).any()):
            raise ValueError(f"kv_num_blocks must be in [0, {width}] (the width of kv_indices)")
        valid = xp.arange(width)[None, :] < counts[:, None]
        indptr = xp.zeros(counts.size + 1, dtype=np.int64)
        xp.cumsum(counts, out=indptr[1:])
        indices = idx[valid].astype(np.int64)  # int32 only after the range check
        return cls._sorted_checked(qb, kb, indptr, indices, (bm, hm), "kv_indices")

    @classmethod
    def _sorted_checked(cls, qb: np.ndarray, kb: np.ndarray, indptr: Any, indices: Any,
                        batch_heads: tuple[int, int], name: str) -> "BlockMask":
        """Sort indices within rows, then reject out-of-range and duplicate entries."""
        xp = array_module(indptr, indices)
        n_kv = kb.size - 1
        if indices.size:
            if bool(((indices < 0) | (indices >= n_kv)).any()):
                raise ValueError(f"{name}: block index out of range [0, {n_kv})")
            rows = segment_ids(indptr, indices.size, xp)
            key = rows.astype(np.int64) * n_kv + indices
            order = xp.argsort(key, kind="stable")
            key = key[order]
            indices = indices[order]
            if bool((key[1:] == key[:-1]).any()):
                raise ValueError(f"{name}: a row selects the same key block twice")
        with _trusting():  # checked just above
            return cls(qb, kb, indptr, indices.astype(np.int32, copy=False), batch_heads)

    # ------------------------------------------------------------------ geometry
    @property
    def num_q_blocks(self) -> int:
        return self.q_bounds.size - 1

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_bounds.size - 1

    @property
    def seq_len_q(self) -> int:
        return int(self.q_bounds[-1])

    @property
    def seq_len_kv(self) -> int:
        return int(self.kv_bounds[-1])

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, H, nQB, nKB)`` with B and H as stored (1 where broadcast)."""
        return (*self.batch_heads, self.num_q_blocks, self.num_kv_blocks)

    # Where the selection lives is read a dozen times a request and never changes: computed
    # once (a cached_property writes the instance's __dict__, which a frozen dataclass allows;
    # __getstate__ leaves the cached values out of a pickle or a deep copy).
    _CACHED = ("_in_cupy", "device_id", "_dense_nnz", "_written", "_made_on")

    @property
    def xp(self):
        """The array module (numpy or CuPy) the selection lives in."""
        return cupy_or_none() if self._in_cupy else np

    @functools.cached_property
    def _in_cupy(self) -> bool:
        if self.dense_rows is not None:
            return array_module(self.dense_rows) is not np
        return array_module(self._indptr, self._indices) is not np

    @property
    def on_device(self) -> bool:
        return self.xp is not np

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._CACHED}

    @functools.cached_property
    def device_id(self) -> int | None:
        """The CUDA device the selection lives on (None on the host)."""
        if self.xp is np:
            return None
        a = self.dense_rows if self.dense_rows is not None else self._indptr
        return int(a.device.id)

    def device_context(self) -> Any:
        """A context making the mask's device current (nothing for a host mask): planning
        launches its kernels and allocates its arrays where the mask lives."""
        if self.xp is np or self.xp.cuda.get_device_id() == self.device_id:
            return contextlib.nullcontext()  # (a request has made it current already)
        return self.xp.cuda.Device(self.device_id)

    @property
    def nnz(self) -> int:
        """Number of selected (query block, key block) pairs, over the stored batch and heads."""
        if self._indptr is None:
            return self._dense_nnz
        with self.reading():
            return int(self._indptr[-1])

    @functools.cached_property
    def _dense_nnz(self) -> int:
        # A plan asks for the count several times (of a device mask: a readback each); the rows
        # are the mask's own copy, so it never changes.
        with self.reading():
            return int(self.dense_rows.sum())

    @property
    def density(self) -> float:
        """Fraction of block pairs selected (blocks counted, not tokens)."""
        total = np.prod(self.shape, dtype=np.int64)
        return self.nnz / total if total else 0.0

    def uniform_block_size(self) -> tuple[int, int] | None:
        """``(q, kv)`` block size when every block but possibly the last has that size."""
        def uniform(b: np.ndarray) -> int | None:
            d = np.diff(b)
            return int(d[0]) if np.all(d[:-1] == d[0]) and d[-1] <= d[0] else None
        q, k = uniform(self.q_bounds), uniform(self.kv_bounds)
        return (q, k) if q is not None and k is not None else None

    def head_index(self, num_q_heads: int, num_kv_heads: int) -> np.ndarray:
        """For each query head, the mask head it reads: broadcast, per query head or per kv head."""
        h = self.batch_heads[1]
        check_int(num_q_heads, "num_q_heads", 1)
        check_int(num_kv_heads, "num_kv_heads", 1)
        if num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads={num_q_heads} must be a multiple of "
                             f"num_kv_heads={num_kv_heads}")
        hq = np.arange(num_q_heads)
        if h == 1:
            return np.zeros(num_q_heads, dtype=np.int64)
        if h == num_q_heads:
            return hq
        if h == num_kv_heads:
            return hq // (num_q_heads // num_kv_heads)
        raise ValueError(f"block_mask has {h} heads; expected 1, num_q_heads={num_q_heads} "
                         f"or num_kv_heads={num_kv_heads}")

    def batch_index(self, batch: int) -> np.ndarray:
        """For each batch entry, the mask batch it reads."""
        check_int(batch, "batch", 1)
        b = self.batch_heads[0]
        if b == 1:
            return np.zeros(batch, dtype=np.int64)
        if b == batch:
            return np.arange(batch)
        raise ValueError(f"block_mask has batch {b}; expected 1 or {batch}")

    # ------------------------------------------------------------------ views
    def to_dense(self) -> Any:
        """The boolean block matrix ``[B, H, nQB, nKB]`` in the mask's array module."""
        xp = self.xp
        with self.reading():
            if self.dense_rows is not None:
                return self.dense_rows.reshape(self.shape).copy()
            n_rows = self.indptr.size - 1
            out = xp.zeros((n_rows, self.num_kv_blocks), dtype=bool)
            # Each stored entry's row by a search of the offsets: unlike segment_ids on CuPy, it
            # reads nothing back (the device planner plans a CSR mask from these rows without a
            # synchronization, also while a CUDA graph is captured).
            rows = xp.searchsorted(self.indptr[1:], xp.arange(self.indices.size), side="right")
            cols = self.indices
            if xp is not np:  # unchecked only when made during a capture: stay in bounds
                rows = xp.minimum(rows, n_rows - 1)
                cols = xp.clip(cols, 0, self.num_kv_blocks - 1)
            out[rows, cols] = True
            return out.reshape(self.shape)

    def transposed(self) -> "BlockMask":
        """The mask's transpose: for each key block, the query blocks that select it, with the
        two geometries exchanged (``[B, H, nKB, nQB]``; a device mask stays on the device, no
        synchronization). The backward pass walks keys this way (``runtime.mode.Direction``)."""
        dense = self.to_dense()
        return BlockMask.from_dense(self.xp.ascontiguousarray(dense.swapaxes(-1, -2)),
                                    q_bounds=self.kv_bounds, kv_bounds=self.q_bounds)

    def to_host(self) -> "BlockMask":
        """The same mask with its selection on the host."""
        if not self.on_device:
            return self
        with self.reading(), _trusting():  # (a mask's arrays were checked when it was made)
            return BlockMask(self.q_bounds, self.kv_bounds, self.indptr.get(),
                             self.indices.get(), self.batch_heads,
                             None if self.dense_rows is None else self.dense_rows.get())

    def to_device(self) -> "BlockMask":
        """The same mask with its selection on the current CUDA device (needs CuPy)."""
        device.require_gpu("BlockMask.to_device")
        cp = cupy_or_none()
        with self.reading(), _trusting():
            return BlockMask(self.q_bounds, self.kv_bounds, cp.asarray(self.indptr),
                             cp.asarray(self.indices), self.batch_heads,
                             None if self.dense_rows is None else cp.asarray(self.dense_rows))

    def row_pairs(self) -> Any:
        """Per CSR row, the number of (query token, key token) pairs selected (int64, in ``xp``)."""
        xp = self.xp
        with self.reading():
            klen = xp.asarray(np.diff(self.kv_bounds))
            qlen = xp.asarray(np.diff(self.q_bounds))
            per_entry = klen[self.indices]
            csum = xp.zeros(per_entry.size + 1, dtype=np.int64)
            xp.cumsum(per_entry, out=csum[1:])
            keys_per_row = csum[self.indptr[1:]] - csum[self.indptr[:-1]]
            n_bh = self.batch_heads[0] * self.batch_heads[1]
            return keys_per_row * xp.tile(qlen, n_bh)

    def selected_pairs(self, batch: int | None = None, num_heads: int | None = None) -> np.ndarray:
        """(query token, key token) pairs the mask selects, per (batch, head), as int64 numpy.

        With ``batch``/``num_heads`` the broadcast dimensions are expanded (``num_heads`` must be
        1, or a multiple handled by :meth:`head_index` as query heads); ``.sum()`` is the useful
        work every benchmark divides by (useful FLOPs = 4 * D * pairs).
        """
        for value, name in ((batch, "batch"), (num_heads, "num_heads")):
            if value is not None:
                check_int(value, name, 1)
        per_bh = to_numpy(self.row_pairs()).reshape(*self.batch_heads, -1).sum(-1)
        if batch is not None:
            per_bh = per_bh[self.batch_index(batch)]
        if num_heads is not None:
            h = self.batch_heads[1]
            if h not in (1, num_heads) and num_heads % h:
                raise ValueError(f"num_heads={num_heads} does not broadcast from {h} mask heads")
            idx = (np.zeros(num_heads, dtype=np.int64) if h == 1 else
                   np.arange(num_heads) // (num_heads // h))
            per_bh = per_bh[:, idx]
        return per_bh

    def __repr__(self) -> str:
        bs = self.uniform_block_size()
        geo = (f"block_size={bs[0] if bs[0] == bs[1] else bs}" if bs else
               f"variable blocks q {int(np.diff(self.q_bounds).min())}.."
               f"{int(np.diff(self.q_bounds).max())}, kv {int(np.diff(self.kv_bounds).min())}.."
               f"{int(np.diff(self.kv_bounds).max())}")
        where = "device" if self.on_device else "host"
        return (f"BlockMask(batch_heads={self.batch_heads}, blocks={self.num_q_blocks}x"
                f"{self.num_kv_blocks}, seq_len=({self.seq_len_q}, {self.seq_len_kv}), {geo}, "
                f"nnz={self.nnz}, density={self.density:.3f}, {where})")


class _Reading:
    """:meth:`BlockMask.reading`: CuPy's current stream of the mask's device waits for the
    selection's writes; on exit, the mask is held while that stream runs the reads when its
    arrays belong to another stream's memory."""

    __slots__ = ("_mask", "_ptr", "_here")

    def __init__(self, mask: BlockMask) -> None:
        self._mask = mask
        self._ptr = None

    def __enter__(self) -> StreamMark | None:
        mark = self._mask.__dict__.get("_written")
        if mark is None:  # a host mask (or one unpickled: its arrays were copied synchronously)
            return None
        xp = self._mask.xp
        with self._mask.device_context():
            self._ptr = int(xp.cuda.get_current_stream().ptr)
            self._here = stream_identity(self._ptr)
            mark.order(self._ptr, self._here)
        return mark

    def __exit__(self, *exc: Any) -> None:
        if self._ptr is None:
            return
        mask = self._mask
        if not (self._here == mask.__dict__["_made_on"] == mask.__dict__["_written"].on):
            with mask.device_context():
                hold_while_read(self._ptr, mask)
