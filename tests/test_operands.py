"""tessera.operands: the checks the CPU entry points share with the GPU path, and the
output-overlap test (fake device tensors: no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.interop import DeviceTensor
from tessera.operands import _overlap, host_operands

MASK = tessera.BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)


def _qkv(b=1, hq=2, hkv=1, lq=128, lk=128, d=64, dtype=np.float32):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((b, hq, lq, d)).astype(dtype),
            rng.standard_normal((b, hkv, lk, d)).astype(dtype),
            rng.standard_normal((b, hkv, lk, d)).astype(dtype))


@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan"), float("inf"), 1e39])
def test_reference_and_emulator_refuse_bad_scales(scale):
    """What the kernels cannot take is refused everywhere: a scale past float32 (which they
    scale scores in) too."""
    q, k, v = _qkv()
    p = tessera.plan(MASK, num_q_heads=2, num_kv_heads=1, head_dim=64)
    with pytest.raises(ValueError, match="scale must be positive and finite"):
        tessera.reference.attention(q, k, v, MASK, scale=scale)
    with pytest.raises(ValueError, match="scale must be positive and finite"):
        tessera.runtime.emulate.run(p, q, k, v, scale=scale)
    with pytest.raises(TypeError, match="scale must be a number"):
        tessera.reference.attention(q, k, v, MASK, scale="0.1")


@pytest.mark.parametrize("make, kind, words", [
    (lambda q, k, v: (q.astype(np.complex64), k, v), TypeError, "q must hold real floating"),
    (lambda q, k, v: (q, k.astype(np.int32), v), TypeError, "k must hold real floating"),
    (lambda q, k, v: ("q", k, v), TypeError, "q must be an array"),
    (lambda q, k, v: (None, k, v), TypeError, "q must be an array"),
    (lambda q, k, v: (q[..., :0], k[..., :0], v), ValueError, "head dims must be at least 1"),
    (lambda q, k, v: (q, k[:, :, :64], v), ValueError, "k and v must agree"),
    (lambda q, k, v: (q[0], k, v), ValueError, "q must be 4-D"),
])
def test_reference_refuses_what_attention_refuses(make, kind, words):
    q, k, v = make(*_qkv())
    with pytest.raises(kind, match=words):
        tessera.reference.attention(q, k, v, MASK)


def test_emulator_checks_operands_against_the_plan():
    """A short k, extra k/v heads, a longer q or another head dim is refused (the emulator
    used to reuse the last key, ignore the heads or return NaN rows)."""
    p = tessera.plan(MASK, num_q_heads=2, num_kv_heads=1, head_dim=64)
    q, k, v = _qkv()
    run = tessera.runtime.emulate.run
    assert np.isfinite(run(p, q, k, v).out).all()
    with pytest.raises(ValueError, match=r"covers \(128, 128\) tokens but q/k have \(128, 100\)"):
        run(p, q, k[:, :, :100], v[:, :, :100])
    with pytest.raises(ValueError, match="differ from the plan's"):
        run(p, *_qkv(hkv=2))
    with pytest.raises(ValueError, match=r"q/k have \(192, 128\)"):
        run(p, *_qkv(lq=192))
    with pytest.raises(ValueError, match="differ from the plan's"):
        run(p, *_qkv(d=128))
    with pytest.raises(TypeError, match="plan must be a tessera.Plan"):
        run("plan", q, k, v)


def test_a_layout_mix_up_says_so():
    q, k, v = _qkv(hq=128, hkv=128, lq=2, lk=2)  # [B, L, H, D] data read as bhld
    mask = tessera.BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)
    with pytest.raises(ValueError, match="layout='blhd'"):
        tessera.reference.attention(q, k, v, mask)
    out = host_operands(q, k, v, "blhd", None, mask)[0]
    assert out.shape == (1, 2, 128, 64)


def _t(ptr, shape, strides, device=0):
    return DeviceTensor(ptr, shape, strides, "float16", device, "cupy", None)


def test_output_overlap_is_found():
    q = _t(1 << 20, (1, 2, 128, 64), (2 * 128 * 64, 128 * 64, 64, 1))
    after = _t((1 << 20) + 2 * 2 * 128 * 64, (1, 2, 128, 64), q.strides)
    inside = _t((1 << 20) + 2 * 64, (1, 2, 128, 64), q.strides)
    assert not _overlap(q, after) and _overlap(q, inside) and _overlap(inside, q)
    assert not _overlap(q, _t(q.ptr, q.shape, q.strides, device=1))
    assert not _overlap(q, _t(q.ptr, (1, 2, 0, 64), q.strides))  # no elements


def test_inputs_are_checked_before_the_environment(monkeypatch):
    """Without CuPy (a numpy-only install) a bad input is still named first; only good-looking
    inputs get the environment's error."""
    from tessera import _array

    monkeypatch.setattr(_array, "_cupy", None)
    x = np.zeros((1, 1, 128, 64), np.float32)
    mask = tessera.BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)
    with pytest.raises(ValueError, match=r"q is a host \(numpy\) array"):
        tessera.attention(x, x, x, mask)
    with pytest.raises(TypeError, match="q must be a CuPy array or a DLPack tensor"):
        tessera.attention(None, None, None, mask)
    with pytest.raises(ValueError, match=r"q is a host \(numpy\) array"):
        tessera.plan(mask, num_q_heads=1, head_dim=64).run(x, x, x)

