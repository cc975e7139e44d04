"""GPU: seeded random cases over geometry x dtype x head dim x layout x GQA x score range against
the float64 reference (worst row included, outputs poisoned first), the forward's and the
backward's, non-finite inputs, and one run past 2**31 elements. ``TESSERA_FUZZ_CASES`` sets how
many random cases run (default 24); the whole file also runs under compute-sanitizer
(docs/benchmarking.md)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tessera
from tessera import reference
from tessera.runtime import emulate
from tests.gpu.test_attention import TOL, _inputs, _to_numpy, assert_rows_close

pytestmark = pytest.mark.gpu

CASES = int(os.environ.get("TESSERA_FUZZ_CASES", "24"))


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(tessera.config, "poison_outputs", True)


def _random_geometry(rng):
    """Uniform blocks of 32-256 tokens with a ragged end, or variable blocks of 16-300."""
    if rng.random() < 0.5:
        bq, bk = (int(x) for x in rng.choice([32, 64, 128, 256], size=2))
        nq, nk = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        lq = nq * bq - int(rng.integers(0, bq))
        lk = nk * bk - int(rng.integers(0, bk))
        return dict(block_size=(bq, bk), seq_len_q=lq, seq_len_kv=lk), nq, nk
    qs, ks = rng.integers(16, 300, size=int(rng.integers(1, 8))), rng.integers(
        16, 300, size=int(rng.integers(1, 8)))
    return dict(q_bounds=np.r_[0, np.cumsum(qs)], kv_bounds=np.r_[0, np.cumsum(ks)]), qs.size, \
        ks.size


def _random_case(rng):
    """(mask, dtype, head dim, layout, batch, query heads, kv heads) of one random case: GQA up
    to 4:1, one mask or one per kv or query head, densities from 10% to every block."""
    geo, nq, nk = _random_geometry(rng)
    hkv = int(rng.choice([1, 2]))
    hq = hkv * int(rng.choice([1, 2, 4]))
    mask_heads = int(rng.choice(sorted({1, hkv, hq})))
    dense = rng.random((mask_heads, nq, nk)) < rng.choice([0.1, 0.4, 0.8, 1.0])
    mask = tessera.BlockMask.from_dense(dense, **geo)
    dtype = str(rng.choice(["bfloat16", "float16"]))
    d = int(rng.choice([64, 96, 128]))
    layout = str(rng.choice(["bhld", "blhd"]))
    b = int(rng.choice([1, 2]))
    return mask, dtype, d, layout, b, hq, hkv


@pytest.mark.parametrize("case", range(CASES))
def test_random_backward_matches_the_reference(case):
    """The backward pass on the forward fuzz's kind of case (bf16 / fp16, every head dim,
    layout, GQA, mask heads, uniform ragged or variable blocks, score range)."""
    from tests.gpu.test_gpu_backward import check_gradients

    rng = np.random.default_rng(5000 + case)
    mask, dtype, d, layout, b, hq, hkv = _random_case(rng)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", dtype, b, hq, hkv, mask.seq_len_q,
                                      mask.seq_len_kv, d, layout)
    (do, _, _), (de, _, _) = _inputs(rng, "cupy", dtype, b, hq, hkv, mask.seq_len_q, 16, d,
                                     layout)
    scale = float(rng.choice([1.0, 3.0])) / np.sqrt(d)
    out, lse = tessera.attention(q, k, v, mask, layout=layout, scale=scale, return_lse=True)
    grads = tessera.attention_backward(q, k, v, out, lse, do, mask, layout=layout, scale=scale)
    want = reference.attention_backward(qe, ke, ve, de, mask, layout=layout, scale=scale)
    # Rows against float64 from the kernel's own out and LSE (check_gradients says why).
    p = tessera.plan(mask, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, batch=b, layout=layout)
    same = emulate.run_backward(p, qe, ke, ve, de, scale=scale, out=_to_numpy(out),
                                lse=_to_numpy(lse))
    for g, w, s, name in zip(grads, want, (same.dq, same.dk, same.dv), ("dq", "dk", "dv")):
        check_gradients(g, w, dtype, name, rows_ref=s)


@pytest.mark.parametrize("case", range(CASES))
def test_random_case_matches_the_reference(case):
    rng = np.random.default_rng(1000 + case)
    mask, dtype, d, layout, b, hq, hkv = _random_case(rng)
    fw = "cupy"
    (q, k, v), (qe, ke, ve) = _inputs(rng, fw, dtype, b, hq, hkv, mask.seq_len_q,
                                      mask.seq_len_kv, d, layout)
    spread = float(rng.choice([1.0, 4.0]))  # large score ranges: the online softmax rescales
    scale = spread / np.sqrt(d)
    out = tessera.attention(q, k, v, mask, layout=layout, scale=scale)
    ref = reference.attention(qe, ke, ve, mask, layout=layout, scale=scale)
    got = _to_numpy(out)
    assert not np.isnan(got).any(), "output has NaN (unwritten or broken)"
    err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err <= TOL[dtype] * spread, f"relative error {err:.2e}"
    if spread == 1.0:
        assert_rows_close(got, ref, dtype)


def test_a_nan_query_row_stays_in_its_own_rows():
    """NaN in one query row makes that row's output NaN and leaves every other row exact."""
    rng = np.random.default_rng(7)
    mask = tessera.BlockMask.from_dense(rng.random((2, 4, 4)) < 0.6, block_size=64)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", "float16", 1, 2, 2, 256, 256, 64, "bhld")
    q[0, 1, 70] = float("nan")
    qe[0, 1, 70] = np.nan
    got = _to_numpy(tessera.attention(q, k, v, mask))
    ref = reference.attention(qe, ke, ve, mask)
    selects = mask.to_dense()[0, 1, 70 // 64].any()
    assert np.isnan(got[0, 1, 70]).all() == bool(selects)
    keep = np.ones(got.shape[:3], bool)
    keep[0, 1, 70] = False
    assert not np.isnan(got[keep]).any()
    assert_rows_close(got[keep], ref[keep], "float16")


def test_tensors_past_two_to_the_31_elements():
    """q, k, v of 2**31 + 2**27 elements each (64-bit offsets throughout), checked on sampled
    rows against the float64 reference."""
    import cupy as cp

    h, length, d = 34, 1 << 19, 128  # 34 x 524,288 x 128 = 2.28e9 elements
    cp.get_default_memory_pool().free_all_blocks()  # earlier tests' cached memory back
    free = cp.cuda.runtime.memGetInfo()[0]
    if free < 6 * h * length * d * 2:
        pytest.skip("needs ~30 GB of free GPU memory")
    assert h * length * d > 2**31
    rng = np.random.default_rng(3)
    n = length // 128
    dense = cp.random.random((h, n, n)) < 0.002
    dense[:, :, 0] = True  # every row selects something
    mask = tessera.BlockMask.from_dense(dense, block_size=128)
    q, k, v = (cp.random.standard_normal((1, h, length, d), dtype=cp.float32).astype(cp.float16)
               for _ in range(3))
    out = tessera.attention(q, k, v, mask)
    rows = np.stack([np.zeros(64, np.int64), rng.integers(0, h, 64),
                     rng.integers(0, length, 64)], axis=1)
    rows[:4] = [[0, h - 1, length - 1], [0, h - 1, length - 129], [0, 0, 0], [0, h - 1, 0]]
    ref = reference.attention_rows(q, k, v, mask, rows)
    got = cp.asnumpy(out[rows[:, 0], rows[:, 1], rows[:, 2]]).astype(np.float64)
    err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert np.isfinite(got).all() and err.max() < 1.25e-2, f"worst sampled row {err.max():.2e}"
