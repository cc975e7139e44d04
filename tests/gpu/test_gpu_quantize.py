"""GPU: the 8-bit forward's pre-pass (tessera.quantize_launch) against the host's numbers
(tessera.quantization.quantized_operands) on fresh random inputs, outputs poisoned first: head
dims 64, 96 and 128, bf16 and fp16, both layouts, GQA, key counts that are no multiple of the
pad, inputs with outlier channels. Marked ``gpu``: skipped where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import quantization as qz
from tests.gpu.test_attention import _inputs, _to_numpy

pytestmark = pytest.mark.gpu


def _codes_agree(got: np.ndarray, want: np.ndarray, name: str) -> None:
    """Every code within one of the host's (float32 against float64 rounding: a value on a
    boundary may land either side), nearly all equal, and none the poison."""
    assert got.shape == want.shape, name
    assert (got != -128).all(), f"{name}: a code was not written"
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= 1, f"{name}: a code {diff.max()} away from the host's"
    assert (diff == 0).mean() >= 0.995, f"{name}: {(diff != 0).mean():.2%} of codes differ"


@pytest.mark.parametrize("d,dtype,layout,hq,hkv,lq,lkv,scheme", [
    (128, "bfloat16", "bhld", 4, 2, 300, 517, qz.Scheme()),
    (64, "float16", "blhd", 2, 2, 128, 64, qz.Scheme()),
    (96, "bfloat16", "blhd", 3, 1, 200, 130, qz.Scheme()),
    (128, "float16", "bhld", 2, 2, 260, 1030, qz.Scheme(smooth_k=False, rotate=False)),
    (64, "bfloat16", "bhld", 2, 1, 100, 700, qz.Scheme(rotate=False)),
])
def test_the_pre_pass_rounds_as_the_host_does(d, dtype, layout, hq, hkv, lq, lkv, scheme,
                                              monkeypatch):
    from tessera.quantize_launch import PAD_KEYS, quantize_operands, v_key_order

    monkeypatch.setattr(tessera.config, "poison_outputs", True)
    rng = np.random.default_rng(d + lkv)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", dtype, 2, hq, hkv, lq, lkv, d, layout)
    got = quantize_operands(q, k, v, scheme=scheme, layout=layout)
    want = qz.quantized_operands(qe, ke, ve, scheme, layout=layout)
    for name, tokens in (("q", lq), ("k", lkv)):
        scales = getattr(got, f"{name}_scale").get()[..., :tokens]  # (K's padded to L_pad)
        assert not np.isnan(scales).any(), f"{name}_scale has an unwritten step"
        np.testing.assert_allclose(scales, getattr(want, f"{name}_scale")[..., 0], rtol=1e-5)
        _codes_agree(getattr(got, name).get(), getattr(want, name), name)
    np.testing.assert_allclose(got.v_scale.get(), want.v_scale[:, :, 0], rtol=1e-7)
    stored = got.v_t.get()
    assert stored.shape == (2, hkv, d, -(-lkv // PAD_KEYS) * PAD_KEYS)
    v_t = np.empty_like(stored)
    v_t[..., v_key_order(stored.shape[-1])] = stored  # back in key order
    assert (v_t[..., lkv:] == 0).all(), "the pad keys' codes are not zero"
    _codes_agree(v_t[..., :lkv].transpose(0, 1, 3, 2), want.v, "v")


def test_outlier_channels_and_repeat_runs_give_the_same_codes():
    """Large, offset channels (what smoothing and rotation are for) round as on the host, and a
    second run gives bitwise the same codes (the channel sums' order is fixed)."""
    import cupy as cp

    from tessera.quantize_launch import quantize_operands

    rng = np.random.default_rng(7)
    (q, k, v), (qe, ke, ve) = _inputs(rng, "cupy", "float16", 1, 2, 2, 256, 2000, 128, "bhld")
    q[..., :4] *= 4
    k[..., :4] *= 4
    k[..., 4:8] += 4
    qe, ke = _to_numpy(q), _to_numpy(k)
    a = quantize_operands(q, k, v)
    want = qz.quantized_operands(qe, ke, ve, qz.Scheme())
    _codes_agree(a.k.get(), want.k, "k")
    _codes_agree(a.q.get(), want.q, "q")
    b = quantize_operands(q, k, v)
    for x, y in zip(vars(a).values(), vars(b).values()):
        assert cp.array_equal(x, y)
