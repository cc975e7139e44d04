"""GPU: the 8-bit forward (``tessera.attention(..., precision="int8")``) against its float64
oracle (tessera.quantization.attention: the same rounding, exact arithmetic) and against exact
attention (tessera.reference), on fresh random inputs with outputs poisoned first: head dims 64
and 128, bf16 and fp16, both layouts, GQA, ragged lengths, 64- and 128-token blocks, empty rows,
outlier channels; and the refusals a CPU cannot reach. Marked ``gpu``: skipped where there is no
GPU; Hopper only."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import quantization as qz
from tessera import reference
from tessera.quantize_launch import PRECISION_SCHEMES
from tests.gpu.test_attention import _device_cc, _inputs, _to_numpy

pytestmark = pytest.mark.gpu

# Against the oracle the kernel differs by float32 sums, exp2's approximation and the codes of P
# values on a rounding boundary; against exact attention by the scheme's own error, whose bounds
# are the (3e-2 overall, 6e-2 on the worst row).
ORACLE_TOL, ORACLE_ROW = 4e-3, 2e-2
EXACT_TOL, EXACT_ROW = 3e-2, 6e-2


@pytest.fixture(autouse=True)
def _hopper(monkeypatch):
    if _device_cc() != 90:
        pytest.skip("the 8-bit forward runs on Hopper only")
    monkeypatch.setattr(tessera.config, "poison_outputs", True)


def _rel(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Whole-tensor and worst-row relative error (rows the mask leaves empty must be 0)."""
    g = got.reshape(-1, got.shape[-1])
    w = want.reshape(-1, want.shape[-1])
    norm = np.linalg.norm(w, axis=1)
    empty = norm == 0
    assert not np.abs(g[empty]).any(), "a row that selects nothing is not zero"
    rows = np.linalg.norm(g[~empty] - w[~empty], axis=1) / norm[~empty]
    return float(np.linalg.norm(g - w) / np.linalg.norm(w)), float(rows.max(initial=0.0))


@pytest.mark.parametrize("d,dtype,layout,hq,hkv,lq,lkv,block", [
    (128, "bfloat16", "bhld", 2, 2, 1000, 1100, 128),
    (64, "float16", "blhd", 4, 2, 700, 900, 64),
    (128, "float16", "bhld", 4, 1, 512, 2048, 128),
    (64, "bfloat16", "bhld", 2, 2, 1536, 1536, 128),
])
@pytest.mark.parametrize("precision", ["int8", "int8-qk"])
def test_int8_forward_computes_its_oracle(d, dtype, layout, hq, hkv, lq, lkv, block, precision):
    rng = np.random.default_rng(d + lq)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", dtype, 1, hq, hkv, lq, lkv, d, layout)
    nq, nk = -(-lq // block), -(-lkv // block)
    dense = rng.random((1, hq, nq, nk)) < 0.4
    dense[0, 0, 1] = False  # a block row that selects nothing
    mask = tessera.BlockMask.from_dense(dense, block_size=block, seq_len_q=lq, seq_len_kv=lkv)
    out, lse = tessera.attention(q, k, v, mask, layout=layout, precision=precision,
                                 return_lse=True)
    got = _to_numpy(out).astype(np.float64)
    assert not np.isnan(got).any(), "output has NaN (unwritten or broken)"
    oracle, oracle_lse = qz.attention(qe, ke, ve, mask, layout=layout, return_lse=True,
                                      scheme=PRECISION_SCHEMES[precision])
    exact = reference.attention(qe, ke, ve, mask, layout=layout)
    err, row = _rel(got, oracle)
    assert err <= ORACLE_TOL and row <= ORACLE_ROW, f"against the oracle {err:.2e}, row {row:.2e}"
    err, row = _rel(got, exact)
    assert err <= EXACT_TOL and row <= EXACT_ROW, f"against exact {err:.2e}, row {row:.2e}"
    # The LSE is the rounded scores' (0.08-0.13 from exact attention's on these inputs, H100)
    gl = _to_numpy(lse)
    assert np.array_equal(np.isneginf(gl), np.isneginf(oracle_lse))
    fin = np.isfinite(oracle_lse)
    assert np.abs(gl[fin] - oracle_lse[fin]).max(initial=0) < 2e-3


def test_int8_forward_with_outlier_channels_and_repeat_runs():
    """Large, offset channels (what smoothing and rotation are for) stay within the oracle's
    tolerance, and a second run gives bitwise the same output."""
    rng = np.random.default_rng(3)
    (q, k, v), _ = _inputs(rng, "cupy", "float16", 1, 2, 2, 1024, 1024, 128, "bhld")
    q[..., :4] *= 6
    k[..., :4] *= 6
    k[..., 4:8] += 3
    qe, ke, ve = (_to_numpy(x).astype(np.float64) for x in (q, k, v))
    mask = tessera.BlockMask.from_dense(rng.random((1, 2, 8, 8)) < 0.5, block_size=128)
    a = tessera.attention(q, k, v, mask, precision="int8")
    b = tessera.attention(q, k, v, mask, precision="int8")
    assert np.array_equal(_to_numpy(a), _to_numpy(b)), "two runs differ"
    err, row = _rel(_to_numpy(a).astype(np.float64), qz.attention(qe, ke, ve, mask))
    assert err <= ORACLE_TOL and row <= ORACLE_ROW, f"against the oracle {err:.2e}, row {row:.2e}"


def test_int8_forward_on_blocks_of_any_size():
    """Key blocks of 24 to 200 tokens (spans starting anywhere: a chunk starts at the multiple
    of 16 keys at or below its span, the keys before it masked) compute the oracle."""
    rng = np.random.default_rng(11)
    bounds = np.concatenate([[0], np.cumsum(rng.integers(24, 201, 12))])
    n = len(bounds) - 1
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", "bfloat16", 1, 2, 2, int(bounds[-1]),
                                      int(bounds[-1]), 128, "bhld")
    mask = tessera.BlockMask.from_dense(rng.random((1, 2, n, n)) < 0.4, q_bounds=bounds,
                                        kv_bounds=bounds)
    got = _to_numpy(tessera.attention(q, k, v, mask, precision="int8")).astype(np.float64)
    err, row = _rel(got, qz.attention(qe, ke, ve, mask))
    assert err <= ORACLE_TOL and row <= ORACLE_ROW, f"against the oracle {err:.2e}, row {row:.2e}"


def test_int8_refuses_head_dim_96():
    rng = np.random.default_rng(0)
    (q, k, v), _ = _inputs(rng, "cupy", "bfloat16", 1, 1, 1, 128, 128, 96, "bhld")
    mask = tessera.BlockMask.from_dense(np.ones((1, 1, 2, 2), bool), block_size=64)
    with pytest.raises(ValueError, match=r"head dims \(64, 128\), got 96"):
        tessera.attention(q, k, v, mask, precision="int8")


def test_a_plan_runs_the_8bit_forward():
    """Plan.run(precision="int8") on a plan of the 8-bit regime (a fixed mask planned once; its
    tasks may split, their partials combined) computes the oracle; a plan of another regime is
    refused by name."""
    rng = np.random.default_rng(5)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", "bfloat16", 1, 2, 2, 2048, 2048, 128, "bhld")
    dense = rng.random((1, 2, 16, 16)) < 0.3
    dense[0, 0, 3] = True  # a heavy row, which an exact plan may split
    mask = tessera.BlockMask.from_dense(dense, block_size=128)
    p = tessera.plan(mask, num_q_heads=2, head_dim=128, regime=tessera.INT8_REGIME)
    got = _to_numpy(p.run(q, k, v, precision="int8")).astype(np.float64)
    assert not np.isnan(got).any()
    err, row = _rel(got, qz.attention(qe, ke, ve, mask))
    assert err <= ORACLE_TOL and row <= ORACLE_ROW, f"against the oracle {err:.2e}, row {row:.2e}"
    other = tessera.plan(mask, num_q_heads=2, head_dim=128, regime=tessera.Regime(
        family="sm90", block_m=64, num_warps=8, block_n=64, stages=3, combine_threshold=0.0))
    with pytest.raises(ValueError, match="regime has an 8-bit form"):
        other.run(q, k, v, precision="int8")
