"""tessera.integrations.torch_attention on CPU tensors (needs torch): the emulator's run of the
plan a GPU would take, equal to the float64 reference, with one warning a process that this path
checks correctness, not speed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tessera import BlockMask, Regime, reference  # noqa: E402
from tessera.integrations import torch_attention  # noqa: E402


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
