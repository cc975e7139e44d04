"""CPU tests of the logical block mask (tessera.mask.BlockMask).

Every constructor must round-trip to the same dense block matrix; sizes and counts are checked
against a brute-force token-level boolean matrix built by expanding the block mask.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import BlockMask
from tessera._array import segment_ids

SETTINGS = settings(max_examples=150, deadline=None)


# ---------------------------------------------------------------------------- helpers
def expand_tokens(dense: np.ndarray, qb: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """Token-level boolean matrix [..., Lq, Lkv] from a block matrix [..., nQB, nKB]."""
    t = np.repeat(dense, np.diff(qb), axis=-2)
    return np.repeat(t, np.diff(kb), axis=-1)


def brute_uniform(bounds: np.ndarray) -> int | None:
    """Block size when every block but the last has it and the last is not larger."""
    sizes = np.diff(bounds).tolist()
    first = sizes[0]
    if all(s == first for s in sizes[:-1]) and sizes[-1] <= first:
        return first
    return None


@st.composite
def geometries(draw, kinds=("int", "tuple", "ragged", "variable")):
    """(constructor kwargs, expected q_bounds, expected kv_bounds, nQB, nKB)."""
    kind = draw(st.sampled_from(kinds))
    n_q = draw(st.integers(1, 6))
    n_kv = draw(st.integers(1, 6))
    if kind == "variable":
        qs = draw(st.lists(st.integers(1, 5), min_size=n_q, max_size=n_q))
        ks = draw(st.lists(st.integers(1, 5), min_size=n_kv, max_size=n_kv))
        qb = np.concatenate([[0], np.cumsum(qs)]).astype(np.int64)
        kb = np.concatenate([[0], np.cumsum(ks)]).astype(np.int64)
        as_list = draw(st.booleans())
        kw = dict(q_bounds=qb.tolist() if as_list else qb.astype(np.int32),
                  kv_bounds=kb.tolist() if as_list else kb)
        return kw, qb, kb, n_q, n_kv
    if kind == "int":
        bq = bk = draw(st.integers(1, 5))
        kw = dict(block_size=bq)
    else:
        bq, bk = draw(st.integers(1, 5)), draw(st.integers(1, 5))
        kw = dict(block_size=(bq, bk))
    lq, lk = n_q * bq, n_kv * bk
    if kind == "ragged":
        lq -= draw(st.integers(0, bq - 1))
        lk -= draw(st.integers(0, bk - 1))
        kw.update(seq_len_q=lq, seq_len_kv=lk)
    qb = np.minimum(np.arange(n_q + 1) * bq, lq).astype(np.int64)
    kb = np.minimum(np.arange(n_kv + 1) * bk, lk).astype(np.int64)
    return kw, qb, kb, n_q, n_kv


@st.composite
def lead_shapes(draw):
    """Leading dims of a dense mask: (), (H,), or (B, H); B or H may be 1 (broadcast)."""
    nd = draw(st.integers(0, 2))
    return tuple(draw(st.integers(1, 3)) for _ in range(nd))


def random_dense(draw, shape) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    p = draw(st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]))
    return np.random.default_rng(seed).random(shape) < p


def to4(dense: np.ndarray) -> np.ndarray:
    while dense.ndim < 4:
        dense = dense[None]
    return dense


def check_mask(m: BlockMask, dense4: np.ndarray, qb: np.ndarray, kb: np.ndarray) -> None:
    """Everything a mask reports, checked against the dense block matrix it should hold."""
    b, h, n_q, n_kv = dense4.shape
    assert m.batch_heads == (b, h)
    assert m.shape == (b, h, n_q, n_kv)
    assert (m.num_q_blocks, m.num_kv_blocks) == (n_q, n_kv)
    np.testing.assert_array_equal(m.q_bounds, qb)
    np.testing.assert_array_equal(m.kv_bounds, kb)
    assert (m.seq_len_q, m.seq_len_kv) == (int(qb[-1]), int(kb[-1]))
    assert m.q_bounds.dtype == np.int64 and m.kv_bounds.dtype == np.int64
    assert m.indptr.dtype == np.int64 and m.indices.dtype == np.int32
    assert m.indptr.shape == (b * h * n_q + 1,)
    assert not m.on_device and m.to_host() is m

    got = m.to_dense()
    assert isinstance(got, np.ndarray) and got.dtype == np.bool_
    np.testing.assert_array_equal(got, dense4)

    # CSR invariants: rows sorted and unique
    for r in range(m.indptr.size - 1):
        row = m.indices[m.indptr[r]:m.indptr[r + 1]]
        assert np.all(np.diff(row) > 0)

    assert m.nnz == int(dense4.sum())
    assert m.density == pytest.approx(dense4.mean())

    tokens = expand_tokens(dense4, qb, kb)
    pairs = m.selected_pairs()
    assert pairs.dtype == np.int64 and pairs.shape == (b, h)
    np.testing.assert_array_equal(pairs, tokens.sum(axis=(-2, -1)))
    np.testing.assert_array_equal(np.asarray(m.row_pairs()).reshape(b, h, n_q),
                                  np.add.reduceat(tokens.sum(axis=-1), qb[:-1], axis=-1))

    uq, uk = brute_uniform(qb), brute_uniform(kb)
    assert m.uniform_block_size() == (None if uq is None or uk is None else (uq, uk))

    r = repr(m)
    assert f"batch_heads=({b}, {h})" in r
    assert f"blocks={n_q}x{n_kv}" in r
    assert f"seq_len=({int(qb[-1])}, {int(kb[-1])})" in r
    assert f"nnz={m.nnz}" in r


# ---------------------------------------------------------------------------- from_dense
@SETTINGS
@given(st.data())
def test_from_dense_roundtrip(data):
    kw, qb, kb, n_q, n_kv = data.draw(geometries())
    lead = data.draw(lead_shapes())
    dense = random_dense(data.draw, (*lead, n_q, n_kv))
    m = BlockMask.from_dense(dense, **kw)
    check_mask(m, to4(dense), qb, kb)


@SETTINGS
@given(st.data())
def test_transposed_exchanges_queries_and_keys(data):
    """The transpose (the backward pass's key-major direction): geometry exchanged, block
    matrix transposed per head, and the transpose of the transpose is the mask."""
    kw, qb, kb, n_q, n_kv = data.draw(geometries())
    lead = data.draw(lead_shapes())
    dense = random_dense(data.draw, (*lead, n_q, n_kv))
    m = BlockMask.from_dense(dense, **kw)
    check_mask(m.transposed(), to4(dense).swapaxes(-1, -2), kb, qb)
    check_mask(m.transposed().transposed(), to4(dense), qb, kb)


def test_from_dense_noncontiguous_and_dlpack_input():
    rng = np.random.default_rng(0)
    base = rng.random((2, 3, 5, 4)) < 0.4
    view = base.transpose(1, 0, 3, 2)  # [3, 2, 4, 5], not C-contiguous
    m = BlockMask.from_dense(view, block_size=2)
    check_mask(m, view, np.arange(5) * 2, np.arange(6) * 2)

    class DLPackOnly:  # a foreign host tensor exposing only the DLPack protocol
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    dense = rng.random((3, 4)) < 0.5
    m = BlockMask.from_dense(DLPackOnly(dense), block_size=(3, 2))
    check_mask(m, to4(dense), np.arange(4) * 3, np.arange(5) * 2)


# ---------------------------------------------------------------------------- from_scipy
@SETTINGS
@given(st.data())
def test_from_scipy_csr_roundtrip(data):
    kw, qb, kb, n_q, n_kv = data.draw(geometries())
    lead = data.draw(lead_shapes())
    dense = random_dense(data.draw, (*lead, n_q, n_kv))
    fmt = data.draw(st.sampled_from(["csr_array", "csr_matrix", "coo_array"]))
    conv = getattr(sp, fmt)
    if len(lead) == 0:
        arg = conv(dense)
    elif len(lead) == 1:
        arg = [conv(x) for x in dense]
    else:
        arg = [[conv(x) for x in row] for row in dense]
    m = BlockMask.from_scipy(arg, **kw)
    expect = dense.reshape((1,) * (4 - dense.ndim) + dense.shape)
    check_mask(m, expect, qb, kb)


def test_from_scipy_drops_stored_zeros():
    # explicit stored zero / False entries are not selected; unsorted coo input is sorted
    coo = sp.coo_array((np.array([1.0, 0.0, 2.0, 3.0]),
                        (np.array([1, 0, 0, 1]), np.array([2, 1, 3, 0]))), shape=(2, 4))
    m = BlockMask.from_scipy(coo, block_size=2)
    expect = np.array([[0, 0, 0, 1], [1, 0, 1, 0]], bool)
    check_mask(m, to4(expect), np.arange(3) * 2, np.arange(5) * 2)
    csr = sp.csr_array((np.array([True, False]), np.array([1, 0]), np.array([0, 2])),
                       shape=(1, 3))
    m = BlockMask.from_scipy(csr, block_size=1)
    np.testing.assert_array_equal(m.to_dense()[0, 0], [[False, True, False]])


@SETTINGS
@given(st.data())
def test_from_scipy_bsr_roundtrip(data):
    """A bsr_array is the token-level matrix; its blocksize is the geometry."""
    n_q, n_kv = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    bq, bk = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    lead = data.draw(lead_shapes())
    dense = random_dense(data.draw, (*lead, n_q, n_kv))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))

    def to_bsr(block: np.ndarray):
        # stored blocks in shuffled order within each block row, arbitrary nonzero values
        indptr, indices = [0], []
        for row in block:
            cols = rng.permutation(np.flatnonzero(row))
            indices.extend(cols.tolist())
            indptr.append(len(indices))
        vals = rng.random((len(indices), bq, bk)) + 0.5
        return sp.bsr_array((vals, np.array(indices, np.int32), np.array(indptr, np.int32)),
                            shape=(n_q * bq, n_kv * bk), blocksize=(bq, bk))

    if len(lead) == 0:
        arg = to_bsr(dense)
    elif len(lead) == 1:
        arg = [to_bsr(x) for x in dense]
    else:
        arg = [[to_bsr(x) for x in row] for row in dense]
    m = BlockMask.from_scipy(arg)
    qb, kb = np.arange(n_q + 1) * bq, np.arange(n_kv + 1) * bk
    check_mask(m, dense.reshape((1,) * (4 - dense.ndim) + dense.shape), qb, kb)
    # the token-level view of the bsr and our expansion agree
    tok = expand_tokens(to4(dense), qb, kb).reshape(-1, n_q * bq, n_kv * bk)
    first = arg if len(lead) == 0 else (arg[0] if len(lead) == 1 else arg[0][0])
    np.testing.assert_array_equal(first.toarray() != 0, tok[0])


def test_from_scipy_bsr_from_dense_tokens():
    tokens = np.zeros((6, 8), bool)
    tokens[0:2, 4:8] = True
    tokens[4, 1] = True  # one token selects its whole (2, 4) block
    m = BlockMask.from_scipy(sp.bsr_array(tokens, blocksize=(2, 4)))
    check_mask(m, to4(np.array([[0, 1], [0, 0], [1, 0]], bool)), np.array([0, 2, 4, 6]),
               np.array([0, 4, 8]))


# ---------------------------------------------------------------------------- from_indices
@SETTINGS
@given(st.data())
def test_from_indices_roundtrip(data):
    kw, qb, kb, n_q, n_kv = data.draw(geometries())
    lead = data.draw(lead_shapes())
    dense = random_dense(data.draw, (*lead, n_q, n_kv))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    extra = data.draw(st.integers(0, 3))  # kv_indices may be wider than nKB
    width = n_kv + extra
    dtype = data.draw(st.sampled_from([np.int32, np.int64, np.uint8]))
    flat = dense.reshape(-1, n_q, n_kv)
    counts = flat.sum(-1)
    idx = np.empty((*flat.shape[:2], width), np.int64)
    lo = 0 if dtype == np.uint8 else -5
    for r in np.ndindex(*flat.shape[:2]):
        cols = rng.permutation(np.flatnonzero(flat[r]))
        junk = rng.integers(lo, n_kv + 5, width - cols.size)  # out of range / duplicates
        idx[r] = np.concatenate([cols, junk])
    counts = counts.reshape(*lead, n_q).astype(dtype)
    idx = idx.reshape(*lead, n_q, width).astype(dtype)
    if "kv_bounds" not in kw and (extra or data.draw(st.booleans())):
        kw = dict(kw, num_kv_blocks=n_kv)
    m = BlockMask.from_indices(counts, idx, **kw)
    check_mask(m, to4(dense), qb, kb)


def test_from_indices_flexattention_defaults():
    # FlexAttention: nKB is kv_indices.shape[-1]; padding after the count is ignored
    counts = np.array([[[2, 0, 3]]], np.int32)
    idx = np.array([[[[2, 0, 0], [1, 1, 1], [1, 2, 0]]]], np.int32)
    m = BlockMask.from_indices(counts, idx, block_size=128)
    expect = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1]], bool)
    check_mask(m, to4(expect), np.arange(4) * 128, np.arange(4) * 128)
    np.testing.assert_array_equal(m.indices, [0, 2, 0, 1, 2])


def test_from_indices_empty_width():
    m = BlockMask.from_indices(np.zeros(2, np.int64), np.zeros((2, 0), np.int64),
                               block_size=4, num_kv_blocks=3)
    check_mask(m, np.zeros((1, 1, 2, 3), bool), np.arange(3) * 4, np.arange(4) * 4)


# ---------------------------------------------------------------------------- views
@SETTINGS
@given(st.data())
def test_selected_pairs_broadcast(data):
    kw, qb, kb, n_q, n_kv = data.draw(geometries())
    b, h = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    dense = random_dense(data.draw, (b, h, n_q, n_kv))
    m = BlockMask.from_dense(dense, **kw)
    per = expand_tokens(dense, qb, kb).sum(axis=(-2, -1))  # [b, h]
    batch = b if b > 1 else data.draw(st.integers(1, 4))
    num_heads = h * data.draw(st.integers(1, 3)) if h > 1 else data.draw(st.integers(1, 5))
    group = num_heads // h
    expect = np.empty((batch, num_heads), np.int64)
    for bi in range(batch):
        for hi in range(num_heads):
            expect[bi, hi] = per[bi if b > 1 else 0, hi // group if h > 1 else 0]
    got = m.selected_pairs(batch, num_heads)
    assert got.shape == (batch, num_heads)
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(m.selected_pairs(batch), per[[bi if b > 1 else 0
                                                                 for bi in range(batch)]])
    np.testing.assert_array_equal(m.selected_pairs(num_heads=num_heads), expect[:1]
                                  if b == 1 else expect[:b])
    if h > 1 and num_heads % h == 0:  # per-kv-head reading, the same map as head_index
        np.testing.assert_array_equal(expect[0], per[0, m.head_index(num_heads, h)])
    if h > 1:
        with pytest.raises(ValueError, match="num_heads"):
            m.selected_pairs(num_heads=h + 1 if (h + 1) % h else h + 2)
    if b > 1:
        with pytest.raises(ValueError, match="batch"):
            m.selected_pairs(b + 1)


def test_selected_pairs_known_values():
    # ragged: q blocks (4, 4, 2), kv blocks (3, 1)
    dense = np.array([[1, 1], [0, 1], [1, 0]], bool)
    m = BlockMask.from_dense(dense, block_size=(4, 3), seq_len_q=10, seq_len_kv=4)
    assert m.selected_pairs().tolist() == [[4 * 4 + 4 * 1 + 2 * 3]]
    assert m.selected_pairs(2, 3).tolist() == [[26, 26, 26]] * 2
    assert m.uniform_block_size() == (4, 3)
    assert "block_size=(4, 3)" in repr(m)
    m = BlockMask.from_dense(dense, q_bounds=[0, 1, 3, 6], kv_bounds=[0, 5, 6])
    assert m.selected_pairs().tolist() == [[1 * 6 + 2 * 1 + 3 * 5]]
    assert m.uniform_block_size() is None
    assert "variable" in repr(m)
    assert BlockMask.from_dense(dense, block_size=8).uniform_block_size() == (8, 8)


def test_head_index():
    d = np.ones((1, 2), bool)
    one = BlockMask.from_dense(d, block_size=2)
    np.testing.assert_array_equal(one.head_index(8, 2), np.zeros(8))
    per_q = BlockMask.from_dense(np.ones((8, 1, 2), bool), block_size=2)
    np.testing.assert_array_equal(per_q.head_index(8, 2), np.arange(8))
    per_kv = BlockMask.from_dense(np.ones((2, 1, 2), bool), block_size=2)
    np.testing.assert_array_equal(per_kv.head_index(8, 2), [0, 0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(per_kv.head_index(2, 2), [0, 1])
    with pytest.raises(ValueError, match="block_mask has 2 heads"):
        per_kv.head_index(4, 1)  # MQA: 2 mask heads match neither Hq=4 nor Hkv=1
    with pytest.raises(ValueError, match="block_mask has 2 heads"):
        per_kv.head_index(3, 3)
    with pytest.raises(ValueError, match="block_mask has 8 heads"):
        per_q.head_index(4, 2)
    with pytest.raises(ValueError, match="num_q_heads=6 must be a multiple of num_kv_heads=4"):
        one.head_index(6, 4)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive int, got 0"):
        one.head_index(4, 0)
    np.testing.assert_array_equal(one.batch_index(3), [0, 0, 0])
    two = BlockMask.from_dense(np.ones((2, 1, 1, 2), bool), block_size=2)
    np.testing.assert_array_equal(two.batch_index(2), [0, 1])
    with pytest.raises(ValueError, match="batch 2"):
        two.batch_index(3)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=12))
def test_segment_ids(counts):
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    got = segment_ids(offsets, int(offsets[-1]), np)
    expect = np.repeat(np.arange(len(counts)), counts)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expect)


# ---------------------------------------------------------------------------- validation
D2 = np.ones((2, 3), bool)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(q_bounds=[1, 2, 4], kv_bounds=[0, 1, 2, 3]), ValueError, "q_bounds must start at 0"),
    (dict(q_bounds=[0, 2, 4], kv_bounds=[2, 3, 4, 5]), ValueError, "kv_bounds must start at 0"),
    (dict(q_bounds=[0, 2, 2], kv_bounds=[0, 1, 2, 3]), ValueError,
     r"q_bounds must be strictly increasing: q_bounds\[1\]=2"),
    (dict(q_bounds=[0, 2, 4], kv_bounds=[0, 3, 2, 5]), ValueError,
     r"kv_bounds must be strictly increasing: kv_bounds\[1\]=3"),
    (dict(q_bounds=[0.0, 2.0, 4.0], kv_bounds=[0, 1, 2, 3]), TypeError, "q_bounds must hold int"),
    (dict(q_bounds=[0, 2, 4], kv_bounds=np.array([0, 1, 2, 3.5])), TypeError,
     "kv_bounds must hold int"),
    (dict(q_bounds=[0, 2], kv_bounds=[0, 1, 2, 3]), ValueError, "q_bounds has 1 blocks"),
    (dict(q_bounds=[0, 2, 4], kv_bounds=[0, 1, 2]), ValueError, "kv_bounds has 2 blocks"),
    (dict(q_bounds=[[0, 2, 4]], kv_bounds=[0, 1, 2, 3]), ValueError, "q_bounds must be a 1-D"),
    (dict(q_bounds=[0], kv_bounds=[0, 1, 2, 3]), ValueError, "q_bounds must be a 1-D"),
    (dict(q_bounds=[0, 2, 2**31], kv_bounds=[0, 1, 2, 3]), ValueError, "q_bounds.*int32"),
    (dict(block_size=2, q_bounds=[0, 2, 4]), ValueError, "block_size or q_bounds"),
    (dict(block_size=2, kv_bounds=[0, 1, 2, 3]), ValueError, "block_size or q_bounds"),
    (dict(q_bounds=[0, 2, 4]), ValueError, "q_bounds and kv_bounds"),
    (dict(), ValueError, "block_size"),
    (dict(q_bounds=[0, 2, 4], kv_bounds=[0, 1, 2, 3], seq_len_q=4), ValueError, "seq_len_q"),
    (dict(block_size=4, seq_len_q=4), ValueError, r"seq_len_q=4 does not fit 2 blocks of 4"),
    (dict(block_size=4, seq_len_q=9), ValueError, "seq_len_q=9"),
    (dict(block_size=(4, 2), seq_len_kv=7), ValueError, "seq_len_kv=7"),
    (dict(block_size=(4, 2), seq_len_kv=4), ValueError, "seq_len_kv=4"),
    (dict(block_size=4, seq_len_q=7.0), TypeError, "seq_len_q must be an int"),
    (dict(block_size=0), ValueError, "block_size"),
    (dict(block_size=(2, -1)), ValueError, "block_size"),
])
def test_geometry_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        BlockMask.from_dense(D2, **kw)
    counts, idx = np.zeros((2,), np.int32), np.zeros((2, 3), np.int32)
    kw = dict(kw, num_kv_blocks=3)  # nKB of D2, so bad kv_bounds are caught here too
    with pytest.raises(exc, match=match):
        BlockMask.from_indices(counts, idx, **kw)
    with pytest.raises(exc, match=match):
        BlockMask.from_scipy(sp.csr_array(D2), **{k: v for k, v in kw.items()
                                                   if k != "num_kv_blocks"})


def test_numpy_bounds_are_validated_once_per_geometry_and_kept_read_only():
    """Explicit numpy bounds take a per-geometry cache (requests repeat a few geometries): bad
    ones still raise every time, good ones are shared read-only, and the caller's array stays
    the caller's (changing it later changes no mask)."""
    bad = np.array([0, 4, 4], dtype=np.int64)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"q_bounds must be strictly increasing"):
            BlockMask.from_dense(D2, q_bounds=bad, kv_bounds=np.array([0, 1, 2, 3]))
    qb, kb = np.array([0, 4, 6], dtype=np.uint32), np.array([0, 2, 5, 9], dtype=np.int32)
    m1 = BlockMask.from_dense(D2, q_bounds=qb, kv_bounds=kb)
    m2 = BlockMask.from_dense(D2, q_bounds=qb.copy(), kv_bounds=kb.copy())
    assert m1.q_bounds.dtype == np.int64 and m1.q_bounds is m2.q_bounds
    assert not m1.q_bounds.flags.writeable and not m1.kv_bounds.flags.writeable
    qb[1] = 5
    np.testing.assert_array_equal(m1.q_bounds, [0, 4, 6])
    u = BlockMask.from_dense(D2, block_size=4, seq_len_q=5, seq_len_kv=9)
    assert not u.q_bounds.flags.writeable


def test_validated_bounds_are_found_by_identity_and_keyed_by_their_bytes(monkeypatch):
    """A mask's own (validated, read-only) bounds pass a later check by identity, and
    bounds_key gives their stored int64 bytes without converting them; any other array --
    the caller's, or a validated one made writable again -- is converted and looked up by its
    contents. Beyond the cache's size the least recently used geometry goes, identity and all."""
    from tessera import mask as mask_module

    monkeypatch.setattr(mask_module, "_validated", mask_module._ValidatedBounds(2))
    qb = np.array([0, 4, 6], dtype=np.int32)
    m = BlockMask.from_dense(D2, q_bounds=qb, kv_bounds=np.array([0, 2, 5, 9]))
    assert mask_module._check_bounds(m.q_bounds, "q_bounds") is m.q_bounds
    assert mask_module.bounds_key(m.q_bounds) == np.array([0, 4, 6], np.int64).tobytes()
    assert mask_module.bounds_key(qb) == np.array([0, 4, 6], np.int64).tobytes()
    copy = m.q_bounds.copy()  # writable: not trusted by identity, found by its contents
    assert mask_module._check_bounds(copy, "q_bounds") is m.q_bounds
    for n in (7, 8):  # two more geometries evict the first
        BlockMask.from_dense(D2, q_bounds=np.array([0, 4, n]), kv_bounds=np.array([0, 2, 5, 9]))
    assert mask_module._validated.raw_of(m.q_bounds) is None
    assert mask_module.bounds_key(m.q_bounds) == copy.tobytes()  # converted, same bytes
    again = BlockMask.from_dense(D2, q_bounds=qb, kv_bounds=np.array([0, 2, 5, 9]))
    assert again.q_bounds is not m.q_bounds  # validated anew
    np.testing.assert_array_equal(again.q_bounds, m.q_bounds)
    with pytest.raises(ValueError, match="strictly increasing"):
        mask_module._check_bounds(np.array([0, 4, 4]), "q_bounds")


def test_a_mask_pickles_and_deep_copies_after_its_location_was_read():
    """Where a mask lives is cached on it once read (requests read it a dozen times); the cache
    stays out of pickles and deep copies, which carry the selection and geometry only."""
    import copy
    import pickle

    m = BlockMask.from_dense(D2, q_bounds=np.array([0, 4, 6]), kv_bounds=np.array([0, 2, 5, 9]))
    assert m.xp is np and not m.on_device and m.device_id is None
    for other in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert other.xp is np and other.device_id is None
        np.testing.assert_array_equal(other.to_dense(), m.to_dense())
        np.testing.assert_array_equal(other.q_bounds, m.q_bounds)


def test_ragged_bounds_are_accepted():
    m = BlockMask.from_dense(D2, block_size=4, seq_len_q=5, seq_len_kv=9)
    np.testing.assert_array_equal(m.q_bounds, [0, 4, 5])
    np.testing.assert_array_equal(m.kv_bounds, [0, 4, 8, 9])


@pytest.mark.parametrize("mask, exc, match", [
    (np.ones((2, 3), np.int8), TypeError, "mask must be boolean"),
    (np.ones((2, 3)), TypeError, "mask must be boolean"),
    (np.ones(3, bool), ValueError, "mask must have at least 2 dimensions"),
    (np.bool_(True), ValueError, "mask must have at least 2 dimensions"),
    (np.ones((1, 1, 1, 2, 3), bool), ValueError, "mask must be .*got 5 dimensions"),
])
def test_from_dense_errors(mask, exc, match):
    with pytest.raises(exc, match=match):
        BlockMask.from_dense(mask, block_size=2)


@pytest.mark.parametrize("counts, idx, kw, exc, match", [
    ([1, 1], [[3, 0], [1, 0]], {}, ValueError, r"kv_indices: block index out of range \[0, 2\)"),
    ([1, 1], [[0, 3], [-1, 0]], {}, ValueError, "kv_indices: block index out of range"),
    ([1], [[2**32 + 1, 0]], {}, ValueError, "kv_indices: block index out of range"),
    ([1, 2], [[0, 3], [1, 1]], {}, ValueError, "kv_indices: a row selects the same key block"),
    ([3, 1], [[0, 1], [1, 0]], {}, ValueError, r"kv_num_blocks must be in \[0, 2\]"),
    ([-1, 1], [[0, 1], [1, 0]], {}, ValueError, r"kv_num_blocks must be in \[0, 2\]"),
    ([1, 1], [[0, 1], [1, 0], [1, 0]], {}, ValueError, "kv_indices shape"),
    ([1, 1], [0, 1], {}, ValueError, "kv_indices shape"),
    ([[1, 1]], [[0, 1], [1, 0]], {}, ValueError, "kv_indices shape"),
    ([1, 1], [[0.0, 1.0], [1.0, 0.0]], {}, TypeError, "kv_indices must hold integers"),
    ([1.0, 1.0], [[0, 1], [1, 0]], {}, TypeError, "kv_num_blocks must hold integers"),
    ([True, True], [[0, 1], [1, 0]], {}, TypeError, "kv_num_blocks must hold integers"),
    (1, [0, 1], {}, ValueError, "kv_num_blocks must have at least 1 dimension"),
    (np.ones((1, 1, 1, 2), int), np.zeros((1, 1, 1, 2, 2), int), {}, ValueError,
     r"kv_num_blocks must be \[nQB\].*got 4 dimensions"),
    ([1, 1], [[0, 1], [2, 0]], dict(num_kv_blocks=4, block_size=None,
                                    q_bounds=[0, 1, 2], kv_bounds=[0, 1, 2, 3]),
     ValueError, "kv_bounds has 3 blocks but the mask has 4"),
])
def test_from_indices_errors(counts, idx, kw, exc, match):
    kw = {"block_size": 2, **kw}
    with pytest.raises(exc, match=match):
        BlockMask.from_indices(np.asarray(counts), np.asarray(idx), **kw)


def test_from_indices_duplicates_and_range_after_count_are_ignored():
    # index 5 and the duplicate 0 sit after the count: padding, not an error
    m = BlockMask.from_indices(np.array([1, 2]), np.array([[1, 5, 0], [2, 0, 0]]),
                               block_size=2)
    np.testing.assert_array_equal(m.to_dense()[0, 0], [[0, 1, 0], [1, 0, 1]])


def test_from_scipy_errors():
    a, b = sp.csr_array(np.ones((2, 3), bool)), sp.csr_array(np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="matrices: all block matrices must have one shape"):
        BlockMask.from_scipy([a, b], block_size=2)
    with pytest.raises(ValueError, match="matrices: all block matrices must have one shape"):
        BlockMask.from_scipy([[a, a], [a, b]], block_size=2)
    with pytest.raises(ValueError, match="matrices: every batch must list the same number"):
        BlockMask.from_scipy([[a, a], [a]], block_size=2)
    bsr = sp.bsr_array(np.ones((4, 6), bool), blocksize=(2, 3))
    with pytest.raises(ValueError, match="matrices: do not mix bsr"):
        BlockMask.from_scipy([bsr, a])
    with pytest.raises(ValueError, match="matrices: do not mix bsr"):
        BlockMask.from_scipy([[a], [bsr]], block_size=2)
    bsr2 = sp.bsr_array(np.ones((4, 6), bool), blocksize=(2, 2))
    with pytest.raises(ValueError, match="matrices: all bsr blocksizes must agree"):
        BlockMask.from_scipy([bsr, bsr2])
    for kw in (dict(block_size=2), dict(q_bounds=[0, 2, 4], kv_bounds=[0, 3, 6]),
               dict(seq_len_q=3), dict(seq_len_kv=5)):
        with pytest.raises(ValueError, match="come from the bsr blocksize"):
            BlockMask.from_scipy(bsr, **kw)
    dup = sp.bsr_array((np.ones((2, 2, 3)), np.array([1, 1]), np.array([0, 2, 2])),
                       shape=(4, 6), blocksize=(2, 3))
    with pytest.raises(ValueError, match="matrices: a row selects the same key block twice"):
        BlockMask.from_scipy(dup)
    for bad in ([], np.ones((2, 2), bool), [a, np.ones((2, 3), bool)], [[a], []], "csr"):
        with pytest.raises(TypeError, match="matrices must be a scipy sparse matrix"):
            BlockMask.from_scipy(bad, block_size=2)


# ---- inputs refused at construction --------------------------------------------------------
@pytest.mark.parametrize("block", [2**30, 2**31, 2**40])
def test_block_sizes_past_int32_tokens_refused_before_building(block):
    """Offsets past int32 used to overflow in planning (task ends of -2**31, "0 pairs")."""
    with pytest.raises(ValueError, match="token offsets are int32"):
        BlockMask.from_dense(np.ones((4, 4), bool), block_size=block)
    with pytest.raises(ValueError, match="does not fit in int32"):
        BlockMask.from_dense(np.ones((1, 1), bool), q_bounds=[0, 2**31], kv_bounds=[0, 64])


@pytest.mark.parametrize("shape, words", [
    ((0, 3), "at least one q block"), ((3, 0), "at least one kv block"),
    ((0, 2, 2), "at least one batch and one head"), ((2, 0, 2, 2), "at least one batch")])
def test_zero_size_masks_refused(shape, words):
    """Masks without blocks or heads are refused when built (they used to crash in repr())."""
    with pytest.raises(ValueError, match=words):
        BlockMask.from_dense(np.ones(shape, bool), block_size=64)


def test_from_indices_without_blocks_or_width():
    with pytest.raises(ValueError, match="pass num_kv_blocks"):
        BlockMask.from_indices(np.zeros((2,), np.int32), np.zeros((2, 0), np.int32),
                               block_size=64)
    m = BlockMask.from_indices(np.zeros((2,), np.int32), np.zeros((2, 0), np.int32),
                               block_size=64, num_kv_blocks=3)
    assert m.shape == (1, 1, 2, 3) and m.nnz == 0 and "BlockMask" in repr(m)
    with pytest.raises(ValueError, match="num_kv_blocks must be a positive int"):
        BlockMask.from_indices(np.zeros((2,), np.int32), np.zeros((2, 1), np.int32),
                               block_size=64, num_kv_blocks=0)
    with pytest.raises(ValueError, match="at least one batch, head and query block"):
        BlockMask.from_indices(np.zeros((0,), np.int32), np.zeros((0, 1), np.int32),
                               block_size=64)


def test_the_constructor_validates_like_the_factories():
    good = BlockMask.from_dense(np.eye(3, dtype=bool), block_size=64)
    assert BlockMask(good.q_bounds, good.kv_bounds, good.indptr, good.indices, (1, 1)).nnz == 3
    with pytest.raises(ValueError, match="must start at 0"):
        BlockMask(np.array([1, 64]), good.kv_bounds, good.indptr, good.indices, (1, 1))
    with pytest.raises(ValueError, match="batch_heads must be a"):
        BlockMask(good.q_bounds, good.kv_bounds, good.indptr, good.indices, (0, 1))
    with pytest.raises(ValueError, match="indptr must have"):
        BlockMask(good.q_bounds, good.kv_bounds, good.indptr[:-1], good.indices, (1, 1))
    with pytest.raises(ValueError, match="needs dense_rows or both indptr and indices"):
        BlockMask(good.q_bounds, good.kv_bounds, None, None, (1, 1))
    with pytest.raises(ValueError, match="dense_rows must be bool"):
        BlockMask(good.q_bounds, good.kv_bounds, None, None, (1, 1),
                  dense_rows=np.ones((2, 3), bool))


# Two rows of three key blocks; (indptr, indices) and the message each corruption gives.
@pytest.mark.parametrize("indptr, indices, kind, words", [
    ([1, 2, 3], [0, 1, 2], ValueError, r"indptr must start at 0, got indptr\[0\]=1"),
    ([0, 2, 1], [0, 1], ValueError, r"indptr must not decrease: indptr\[1\]=2 > indptr\[2\]=1"),
    ([0, 1, 2], [0, 1, 2], ValueError, r"indptr\[-1\] must equal the number of indices \(3\)"),
    ([0, 1, 3], [0, 1], ValueError, r"indptr\[-1\] must equal the number of indices \(2\)"),
    ([0, 1, 2], [-1, 0], ValueError, r"indices must be key blocks in \[0, 3\): indices\[0\]=-1"),
    ([0, 1, 2], [0, 3], ValueError, r"indices must be key blocks in \[0, 3\): indices\[1\]=3"),
    ([0, 2, 2], [1, 1], ValueError, "sorted and unique within each row: row 0 has 1 before 1"),
    ([0, 2, 2], [2, 0], ValueError, "sorted and unique within each row: row 0 has 2 before 0"),
    ([0, 1, 2], [0.0, 1.0], TypeError, "indices must hold integers, got dtype float64"),
    ([0.0, 1.0, 2.0], [0, 1], TypeError, "indptr must hold integers"),
    ([0, 1, 2], "01", TypeError, "indices must be a 1-D numpy or CuPy integer array"),
    ([[0, 1, 2]], [0, 1], ValueError, "indptr must be 1-D"),
])
def test_the_constructor_checks_the_selection(indptr, indices, kind, words):
    """A CSR selection given to the constructor is checked for what the factories guarantee:
    the reference and the planner read exactly these arrays."""
    geo = BlockMask.from_dense(np.eye(2, 3, dtype=bool), block_size=64)
    with pytest.raises(kind, match=words):
        BlockMask(geo.q_bounds, geo.kv_bounds, indptr, indices, (1, 1))


def test_the_constructor_takes_lists_and_numpy_integers():
    """Python lists and any integer dtype are accepted (held as int64 offsets and int32
    indices), and an empty selection as empty lists."""
    geo = BlockMask.from_dense(np.eye(2, 3, dtype=bool), block_size=64)
    m = BlockMask(geo.q_bounds, geo.kv_bounds, [0, 1, 3], np.array([2, 0, 1], np.uint8),
                  (np.int64(1), 1))
    assert m.indptr.dtype == np.int64 and m.indices.dtype == np.int32
    assert m.to_dense()[0, 0].tolist() == [[False, False, True], [True, True, False]]
    assert m.batch_heads == (1, 1) and type(m.batch_heads[0]) is int
    empty = BlockMask(geo.q_bounds, geo.kv_bounds, [0, 0, 0], [], (1, 1))
    assert empty.nnz == 0


def test_from_scipy_refuses_duplicate_entries():
    """1 + -1 stored twice used to sum to 0 and drop the block silently."""
    dup = sp.coo_array((np.array([1, -1, 1]), (np.array([0, 0, 1]), np.array([1, 1, 0]))),
                       shape=(2, 2))
    with pytest.raises(ValueError, match="stored twice"):
        BlockMask.from_scipy(dup, block_size=64)
    zero = sp.coo_array((np.array([0, 1]), (np.array([0, 1]), np.array([1, 0]))), shape=(2, 2))
    assert BlockMask.from_scipy(zero, block_size=64).to_dense()[0, 0].tolist() == [
        [False, False], [True, False]]


@pytest.mark.parametrize("mask, kind, words", [
    (None, TypeError, "mask must be a boolean block matrix"),
    (sp.csr_array(np.eye(2)), TypeError, "use BlockMask.from_scipy"),
])
def test_from_dense_names_wrong_kinds(mask, kind, words):
    with pytest.raises(kind, match=words):
        BlockMask.from_dense(mask, block_size=64)


@pytest.mark.parametrize("block", [(64,), (64, 64, 64), "64", (64, 0), 0, -64, 1.5])
def test_bad_block_sizes_say_what_is_accepted(block):
    with pytest.raises(ValueError, match="block_size must be"):
        BlockMask.from_dense(np.ones((2, 2), bool), block_size=block)
