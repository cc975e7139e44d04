"""tessera.integrations.torch_attention on CPU tensors (needs torch): the emulator's run of the
plan a GPU would take, equal to the float64 reference, with one warning a process that this path
checks correctness, not speed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera import BlockMask, Regime, reference  # noqa: E402
from tessera.integrations import torch_attention  # noqa: E402
from tessera.integrations import torch_attention as ta  # noqa: E402


@pytest.mark.parametrize("d, regime", [(64, None), (64, Regime(block_m=64, num_warps=4)),
                                       (32, None)])
def test_cpu_tensors_run_the_emulator_and_warn_once(d, regime, monkeypatch):
    monkeypatch.setattr(torch_attention, "_warned_cpu", False)
    rng = np.random.default_rng(d)
    dense = rng.random((2, 3, 3)) < 0.6
    dense[:, 0, 0] = True
    mask = BlockMask.from_dense(dense, block_size=64, seq_len_q=150, seq_len_kv=150)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 150, 2, d))).float() for _ in range(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, lse = torch_attention.attention(q, k, v, mask, layout="blhd", return_lse=True,
                                             regime=regime)
        again = torch_attention.attention(q, k, v, mask, layout="blhd", regime=regime)
    assert [str(w.message)[:50] for w in caught] == [
        "tessera: attention on CPU tensors runs the CPU emu"]
    want, want_lse = reference.attention(*(x.double().numpy() for x in (q, k, v)), mask,
                                         layout="blhd", return_lse=True)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-6)
    assert torch.equal(again, out)


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_gradients_on_cpu_tensors_are_the_float64_backward(layout, monkeypatch):
    """q, k, v that require grad on the CPU: ``backward`` gives the emulated backward pass of
    the plan (its query-major and key-major queues), equal to the float64 reference's
    gradients on a sparse, ragged GQA mask, and a directional finite difference agrees."""
    rng = np.random.default_rng(3)
    hq, hkv, n, d = 4, 2, 200, 64
    mask = tessera.BlockMask.from_dense(rng.random((hq, 4, 4)) < 0.5, block_size=64,
                                        seq_len_q=n, seq_len_kv=n)
    shape = (lambda h: (1, h, n, d)) if layout == "bhld" else (lambda h: (1, n, h, d))
    q, k, v = (torch.from_numpy(rng.standard_normal(shape(h))).requires_grad_()
               for h in (hq, hkv, hkv))
    monkeypatch.setattr(ta, "_warned_cpu", False)
    with pytest.warns(UserWarning, match="CPU emulator"):
        out = ta.attention(q, k, v, mask, layout=layout)
    dout = torch.from_numpy(rng.standard_normal(tuple(out.shape)))
    out.backward(dout)
    want = reference.attention_backward(*(x.detach().numpy() for x in (q, k, v)),
                                        dout.numpy(), mask, layout=layout)
    for got, ref in zip((q.grad, k.grad, v.grad), want):
        assert np.abs(got.numpy() - ref).max() <= 1e-12 * np.abs(ref).max()
    direction = [torch.from_numpy(rng.standard_normal(tuple(x.shape))) for x in (q, k, v)]
    eps = 1e-6

    def loss(sign):
        with torch.no_grad():
            moved = [x + sign * eps * t for x, t in zip((q, k, v), direction)]
            return float((ta.attention(*moved, mask, layout=layout) * dout).sum())

    slope = (loss(1) - loss(-1)) / (2 * eps)
    predicted = sum(float((x.grad * t).sum()) for x, t in zip((q, k, v), direction))
    assert slope == pytest.approx(predicted, rel=1e-6)


def test_tensors_that_require_grad_take_the_autograd_path_or_are_refused_by_name():
    """tessera.attention and Plan.run on torch tensors that require grad go through the autograd
    Function, whose forward checks them as a plain call does (here: not on a GPU); a backward
    pass records no gradient, so it refuses them by name before anything else (no silent
    gradient-less output); under no_grad the usual checks follow."""
    mask = tessera.BlockMask.from_dense(np.ones((1, 2, 2), bool), block_size=64)
    q = torch.randn(1, 1, 128, 64, requires_grad=True)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        tessera.attention(q, q.detach(), q.detach(), mask)
    p = tessera.plan(mask, num_q_heads=1, head_dim=64)
    with pytest.raises(ValueError, match="q must be on a CUDA device"):
        p.run(q, q.detach(), q.detach())
    with pytest.raises(ValueError, match="q requires grad: a differentiable run makes its own"):
        p.run(q, q.detach(), q.detach(), out=torch.empty_like(q))
    x = q.detach()
    with pytest.raises(ValueError, match="q requires grad, but this call records no gradient"):
        p.run_backward(q, x, x, x, x[..., 0], x)
    with pytest.raises(ValueError, match="k requires grad, but this call records no gradient"):
        tessera.attention_backward(x, q, x, x, x[..., 0], x, mask)
    with torch.no_grad(), pytest.raises((ValueError, RuntimeError)) as info:
        p.run(q, q, q)
    assert "requires grad" not in str(info.value)
