"""CPU tests of the float64 reference (tessera.reference.attention).

The reference is checked against a brute-force dense masked softmax written here: a token-level
boolean [Lq, Lkv] mask per (batch, query head), scores -inf outside it, softmax, and rows with no
key giving output 0 and LSE -inf.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import BlockMask
from tessera import reference
from tessera.reference import attention

TOL = dict(rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- brute force
def token_mask(dense4: np.ndarray, qb: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """[Bm, Hm, Lq, Lkv] boolean token mask expanded from a [Bm, Hm, nQB, nKB] block mask."""
    t = np.repeat(dense4, np.diff(qb), axis=-2)
    return np.repeat(t, np.diff(kb), axis=-1)


def masked_softmax_attention(q, k, v, allowed, scale):
    """One (batch, head): q [Lq, D], k [Lkv, D], v [Lkv, Dv], allowed [Lq, Lkv] bool."""
    s = np.where(allowed, (q @ k.T) * scale, -np.inf)
    out = np.zeros((q.shape[0], v.shape[1]))
    lse = np.full(q.shape[0], -np.inf)
    rows = allowed.any(axis=1)
    if rows.any():
        sr = s[rows]
        m = sr.max(axis=1, keepdims=True)
        p = np.exp(sr - m)  # exp(-inf) = 0 outside the mask
        z = p.sum(axis=1, keepdims=True)
        out[rows] = (p / z) @ v
        lse[rows] = (m + np.log(z))[:, 0]
    return out, lse


def brute_attention(q, k, v, mask: BlockMask, scale=None):
    """q/k/v in bhld; the mask's heads are 1 (broadcast), Hq (per query head) or Hkv."""
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    tok = token_mask(np.asarray(mask.to_dense()), mask.q_bounds, mask.kv_bounds)
    bm, hm = tok.shape[:2]
    out = np.zeros((b, hq, q.shape[2], v.shape[3]))
    lse = np.zeros((b, hq, q.shape[2]))
    for bi in range(b):
        for h in range(hq):
            mh = 0 if hm == 1 else (h if hm == hq else h // group)
            allowed = tok[0 if bm == 1 else bi, mh]
            out[bi, h], lse[bi, h] = masked_softmax_attention(
                q[bi, h], k[bi, h // group], v[bi, h // group], allowed, scale)
    return out, lse


# ---------------------------------------------------------------------------- strategies
@st.composite
def geometry(draw):
    """(kwargs for from_dense, nQB, nKB) for uniform, ragged or variable blocks."""
    kind = draw(st.sampled_from(["uniform", "ragged", "variable"]))
    n_q, n_kv = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    if kind == "variable":
        qs = draw(st.lists(st.integers(1, 5), min_size=n_q, max_size=n_q))
        ks = draw(st.lists(st.integers(1, 5), min_size=n_kv, max_size=n_kv))
        return dict(q_bounds=np.cumsum([0, *qs]), kv_bounds=np.cumsum([0, *ks])), n_q, n_kv
    bq, bk = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    kw = dict(block_size=(bq, bk) if bq != bk or draw(st.booleans()) else bq)
    if kind == "ragged":
        kw["seq_len_q"] = n_q * bq - draw(st.integers(0, bq - 1))
        kw["seq_len_kv"] = n_kv * bk - draw(st.integers(0, bk - 1))
    return kw, n_q, n_kv


# ---------------------------------------------------------------------------- properties
@settings(max_examples=200, deadline=None)
@given(st.data())
def test_attention_matches_brute_force(data):
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kw, n_q, n_kv = draw(geometry())
    b = draw(st.integers(1, 2))
    hkv = draw(st.integers(1, 2))
    ratio = draw(st.sampled_from([1, 2, 4]))
    hq = hkv * ratio
    heads = draw(st.sampled_from(["one", "q", "kv"]))
    hm = {"one": 1, "q": hq, "kv": hkv}[heads]
    bm = draw(st.sampled_from([1, b]))
    d = draw(st.integers(1, 8))
    dv = draw(st.sampled_from([d, draw(st.integers(1, 6))]))
    layout = draw(st.sampled_from(["bhld", "blhd"]))
    return_lse = draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.3, 1.7]))

    dense = rng.random((bm, hm, n_q, n_kv)) < draw(st.sampled_from([0.3, 0.6, 1.0]))
    if draw(st.booleans()):  # force some query block rows to select nothing
        dense[..., rng.integers(0, n_q), :] = False
    mask = BlockMask.from_dense(dense, **kw)
    lq, lkv = mask.seq_len_q, mask.seq_len_kv

    q = rng.standard_normal((b, hq, lq, d))
    k = rng.standard_normal((b, hkv, lkv, d))
    v = rng.standard_normal((b, hkv, lkv, dv))
    want_out, want_lse = brute_attention(q, k, v, mask, scale)

    if layout == "blhd":
        args = [x.transpose(0, 2, 1, 3).copy() for x in (q, k, v)]
    else:
        args = [q, k, v]
    kwargs = dict(return_lse=return_lse, layout=layout)
    if scale is not None:
        kwargs["scale"] = scale
    res = attention(*args, mask, **kwargs)
    out, lse = res if return_lse else (res, None)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    if layout == "blhd":
        assert out.shape == (b, lq, hq, dv)
        out = out.transpose(0, 2, 1, 3)
    assert out.shape == (b, hq, lq, dv)
    np.testing.assert_allclose(out, want_out, **TOL)
    if return_lse:
        assert lse.shape == (b, hq, lq)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
        np.testing.assert_allclose(lse, want_lse, **TOL)


def test_empty_rows_and_default_scale_known_values():
    # 2 query blocks of 2 tokens; row 0 selects kv block 1 only, row 1 selects nothing
    mask = BlockMask.from_dense(np.array([[0, 1], [0, 0]], bool), block_size=2)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 1, 4, 4)) for _ in range(3))
    out, lse = attention(q, k, v, mask, return_lse=True)
    s = q[0, 0, :2] @ k[0, 0, 2:].T / 2.0  # default scale 1/sqrt(4)
    p = np.exp(s) / np.exp(s).sum(1, keepdims=True)
    np.testing.assert_allclose(out[0, 0, :2], p @ v[0, 0, 2:], **TOL)
    np.testing.assert_allclose(lse[0, 0, :2], np.log(np.exp(s).sum(1)), **TOL)
    assert np.all(out[0, 0, 2:] == 0)
    assert np.all(np.isneginf(lse[0, 0, 2:]))
    # a different scale gives a different answer (the scale is really used)
    out2 = attention(q, k, v, mask, scale=1.0)
    assert not np.allclose(out2[0, 0, :2], out[0, 0, :2])


def test_inputs_of_other_dtypes_and_lists():
    mask = BlockMask.from_dense(np.ones((1, 1), bool), block_size=3)
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, 3, 2)).astype(np.float32) for _ in range(3))
    out = attention(q, k, v, mask)
    want, _ = brute_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                              mask)
    np.testing.assert_allclose(out, want, **TOL)
    np.testing.assert_allclose(attention(q.tolist(), k.tolist(), v.tolist(), mask), want, **TOL)


# ---------------------------------------------------------------------------- errors
def _qkv(b=1, hq=2, hkv=1, lq=4, lkv=6, d=3, dv=3):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((b, hq, lq, d)), rng.standard_normal((b, hkv, lkv, d)),
            rng.standard_normal((b, hkv, lkv, dv)))


MASK = BlockMask.from_dense(np.ones((2, 3), bool), block_size=2)  # covers (4, 6) tokens


def test_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="layout must be 'bhld' or 'blhd', got 'bshd'"):
        attention(q, k, v, MASK, layout="bshd")
    with pytest.raises(ValueError, match="q must be 4-D"):
        attention(q[0], k, v, MASK)
    with pytest.raises(ValueError, match="k must be 4-D"):
        attention(q, k[0], v, MASK)
    with pytest.raises(ValueError, match="v must be 4-D"):
        attention(q, k, v[None], MASK)
    with pytest.raises(ValueError, match="q must be 4-D"):
        attention(q[0], k, v, MASK, layout="blhd")
    with pytest.raises(ValueError, match="agree between q and k: q 3, k 2"):
        attention(q, k[..., :2], v, MASK)
    with pytest.raises(ValueError, match="k and v must agree in heads and length"):
        attention(q, k, v[:, :, :5], MASK)  # v length differs from k
    with pytest.raises(ValueError, match="batch of k 2 / v 2 must equal batch of q 1"):
        attention(q, np.concatenate([k, k]), np.concatenate([v, v]), MASK)  # batch differs
    with pytest.raises(ValueError, match=r"covers \(4, 6\) tokens but q/k have \(5, 6\)"):
        q5, k5, v5 = _qkv(lq=5)
        attention(q5, k5, v5, MASK)
    with pytest.raises(ValueError, match=r"covers \(4, 6\) tokens but q/k have \(4, 7\)"):
        q7, k7, v7 = _qkv(lkv=7)
        attention(q7, k7, v7, MASK)
    with pytest.raises(ValueError, match="q heads 3 must be a multiple of k/v heads 2"):
        attention(*_qkv(hq=3, hkv=2), MASK)
    with pytest.raises(ValueError, match="q heads 2 must be a multiple of k/v heads 4"):
        attention(*_qkv(hq=2, hkv=4), MASK)
    three_heads = BlockMask.from_dense(np.ones((3, 2, 3), bool), block_size=2)
    with pytest.raises(ValueError, match="block_mask has 3 heads; expected 1, num_q_heads=4 "
                                         "or num_kv_heads=2"):
        attention(*_qkv(hq=4, hkv=2), three_heads)
    two_batch = BlockMask.from_dense(np.ones((2, 1, 2, 3), bool), block_size=2)
    with pytest.raises(ValueError, match="block_mask has batch 2; expected 1 or 3"):
        attention(*_qkv(b=3), two_batch)


# ---------------------------------------------------------------------------- long sequence
def test_long_sequence_stays_block_sparse():
    """32k tokens, 64-token blocks, ~1% density: no L x L matrix (8 GiB in float64)."""
    L, blk, d = 32768, 64, 16
    n = L // blk
    rng = np.random.default_rng(3)
    dense = rng.random((n, n)) < 0.01
    dense[np.arange(n), np.arange(n)] = True  # the diagonal, so most rows select something
    dense[7] = False  # one empty block row
    mask = BlockMask.from_dense(dense, block_size=blk)
    q, k, v = (rng.standard_normal((1, 1, L, d)) for _ in range(3))

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out, lse = attention(q, k, v, mask, return_lse=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - t0
    assert elapsed < 10
    # output + lse + float64 copies of q/k/v are ~17 MiB; a single L x L bool would be 1 GiB
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB: an L x L matrix was built?"

    tok_rows = [0, 1, 7 * blk + 3, 12345, L - 1]
    keys = np.repeat(dense, blk, axis=1)  # [nQB, L] token-level key mask per block row
    for t in tok_rows:
        allowed = keys[t // blk][None, :]
        want_out, want_lse = masked_softmax_attention(q[0, 0, t:t + 1], k[0, 0], v[0, 0],
                                                      allowed, 1.0 / np.sqrt(d))
        np.testing.assert_allclose(out[0, 0, t], want_out[0], **TOL)
        np.testing.assert_allclose(lse[0, 0, t], want_lse[0], **TOL)
    assert np.all(out[0, 0, 7 * blk:8 * blk] == 0)
    assert np.all(np.isneginf(lse[0, 0, 7 * blk:8 * blk]))


def test_attention_rows_matches_full_reference():
    rng = np.random.default_rng(3)
    dense = rng.random((2, 5, 6)) < 0.4
    dense[:, 1] = False
    m = BlockMask.from_dense(dense, block_size=(16, 12), seq_len_q=70, seq_len_kv=66)
    q = rng.standard_normal((1, 4, 70, 8))
    k = rng.standard_normal((1, 2, 66, 8))
    v = rng.standard_normal((1, 2, 66, 5))
    full = reference.attention(q, k, v, m)
    rows = np.array([[0, h, t] for h in range(4) for t in (0, 17, 20, 69)])
    got = reference.attention_rows(q, k, v, m, rows)
    np.testing.assert_allclose(got, full[rows[:, 0], rows[:, 1], rows[:, 2]], atol=1e-12)


def test_scores_that_overflow_once_scaled_give_the_hardest_attention_not_nan():
    """Float64 inputs whose scores overflow once scaled (here by a scale the kernels take): the
    softmax is an argmax, each row the value of its best key -- the maximum is subtracted
    before scaling, as the kernels do -- and nothing is NaN."""
    rng = np.random.default_rng(4)
    q, k = (rng.standard_normal((1, 1, 64, 16)) * 1e136 for _ in range(2))
    v = rng.standard_normal((1, 1, 64, 16))
    mask = BlockMask.from_dense(np.ones((1, 1), bool), block_size=64)
    scale = 1e38
    out = attention(q, k, v, mask, scale=scale)
    scores = q[0, 0] @ k[0, 0].T
    with np.errstate(over="ignore"):
        assert np.isinf(scores * scale).any()
    np.testing.assert_array_equal(out[0, 0], v[0, 0][scores.argmax(axis=1)])
    rows = reference.attention_rows(q, k, v, mask, np.array([[0, 0, 5], [0, 0, 63]]),
                                    scale=scale)
    np.testing.assert_array_equal(rows, v[0, 0][scores[[5, 63]].argmax(axis=1)])


# ---------------------------------------------------------------------------- backward
def _ragged_case(seed: int, hq: int = 4, hkv: int = 2, mask_heads: int = 2, d: int = 8):
    rng = np.random.default_rng(seed)
    qb = np.array([0, 5, 9, 16, 19])   # ragged query blocks
    kb = np.array([0, 3, 10, 12, 20, 23])
    dense = rng.random((1, mask_heads, 4, 5)) < 0.5
    dense[0, 0, 1] = False              # a row that selects nothing
    dense[0, :, :, 2] = False           # a key block no row selects
    dense[0, :, 0, 0] = True
    mask = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    q = rng.standard_normal((1, hq, 19, d))
    k = rng.standard_normal((1, hkv, 23, d))
    v = rng.standard_normal((1, hkv, 23, d + 2))
    dout = rng.standard_normal((1, hq, 19, d + 2))
    return mask, q, k, v, dout


@pytest.mark.parametrize("seed", range(3))
def test_attention_backward_matches_finite_differences(seed):
    """Every entry of dq, dk and dv against central differences of sum(out * dout), float64,
    on ragged blocks, GQA, an empty row and unselected keys."""
    mask, q, k, v, dout = _ragged_case(seed)
    scale = 0.7
    dq, dk, dv = reference.attention_backward(q, k, v, dout, mask, scale=scale)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape

    def loss() -> float:
        return float((attention(q, k, v, mask, scale=scale) * dout).sum())

    rng = np.random.default_rng(seed + 100)
    eps = 1e-6
    for x, grad in ((q, dq), (k, dk), (v, dv)):
        for idx in zip(*(rng.integers(0, n, 12) for n in x.shape)):
            keep = x[idx]
            x[idx] = keep + eps
            up = loss()
            x[idx] = keep - eps
            down = loss()
            x[idx] = keep
            assert abs((up - down) / (2 * eps) - grad[idx]) < 1e-6 * max(1.0, abs(grad[idx]))


def test_attention_backward_zeroes_what_the_mask_leaves_out_and_sums_groups():
    mask, q, k, v, dout = _ragged_case(7)
    dq, dk, dv = reference.attention_backward(q, k, v, dout, mask)
    assert not dq[:, :2, 5:9].any()           # query block 1 selects nothing in mask head 0
    assert np.abs(dq[:, :2, :5]).min() > 0     # ... and block 0 selects block 0
    assert not dk[:, :, 10:12].any() and not dv[:, :, 10:12].any()   # key block 2: unselected
    # GQA: a kv head's gradients are the sum of what its query heads would give alone.
    parts = [reference.attention_backward(q[:, h:h + 1], k[:, h // 2:h // 2 + 1],
                                          v[:, h // 2:h // 2 + 1], dout[:, h:h + 1],
                                          BlockMask.from_dense(
                                              mask.to_dense()[:, h // 2:h // 2 + 1],
                                              q_bounds=mask.q_bounds, kv_bounds=mask.kv_bounds))
             for h in range(4)]
    np.testing.assert_allclose(dk[:, 0], parts[0][1][:, 0] + parts[1][1][:, 0], rtol=1e-12)
    np.testing.assert_allclose(dv[:, 1], parts[2][2][:, 0] + parts[3][2][:, 0], rtol=1e-12)
    np.testing.assert_allclose(dq[:, 3], parts[3][0][:, 0], rtol=1e-12)


def test_attention_backward_dense_equals_the_closed_form_and_layouts_agree():
    rng = np.random.default_rng(3)
    q, k, v, dout = (rng.standard_normal((2, 2, 12, 4)) for _ in range(4))
    mask = BlockMask.from_dense(np.ones((3, 2), bool), block_size=(4, 6), seq_len_q=12,
                                seq_len_kv=12)
    dq, dk, dv = reference.attention_backward(q, k, v, dout, mask, scale=0.5)
    s = 0.5 * q @ k.swapaxes(-1, -2)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = dout @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    np.testing.assert_allclose(dv, p.swapaxes(-1, -2) @ dout, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dq, 0.5 * ds @ k, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dk, 0.5 * ds.swapaxes(-1, -2) @ q, rtol=1e-12, atol=1e-13)
    t = [x.transpose(0, 2, 1, 3) for x in (q, k, v, dout)]
    for got, want in zip(reference.attention_backward(*t, mask, scale=0.5, layout="blhd"),
                         (dq, dk, dv)):
        np.testing.assert_allclose(got, want.transpose(0, 2, 1, 3), rtol=1e-12)


def test_attention_backward_checks_dout():
    mask, q, k, v, dout = _ragged_case(0)
    with pytest.raises(ValueError, match=r"dout must have the output's shape \(1, 4, 19, 10\)"):
        reference.attention_backward(q, k, v, dout[:, :, :-1], mask)
    with pytest.raises(TypeError, match="dout must be an array"):
        reference.attention_backward(q, k, v, None, mask)
    with pytest.raises(TypeError, match="dout must hold real floating-point values"):
        reference.attention_backward(q, k, v, dout.astype(np.int32), mask)
