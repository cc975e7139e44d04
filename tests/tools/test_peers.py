"""CPU tests of the peers' inputs (tessera.tools.peers): FlexAttention's BlockMask computes
exactly the Tessera mask on every geometry (eager Flex against the float64 reference), cuDNN
BSA's index lists select exactly the mask's blocks and are refused where cuDNN cannot run the
mask exactly. Skipped without torch."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import reference
from tessera.tools import peers

torch = pytest.importorskip("torch")


def _flex(q, k, v, mask):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=peers.flex_block_mask(mask, q.device))


@pytest.mark.parametrize("geometry", ["64", "128 ragged"])
def test_flex_block_mask_of_uniform_blocks_is_the_mask_as_full_tiles(geometry):
    """Uniform 64- and 128-token blocks: every selected block a full Flex tile, nothing else
    (no partial tiles, no mask_mod), 64x64 kernel tiles at 64. (The compiled kernel visits only
    those tiles; eager Flex ignores the block structure, so the numbers are checked on the
    GPU, where every peer's output is compared with Tessera's.)"""
    rng = np.random.default_rng(1)
    b, n = int(geometry.split()[0]), 6
    L = n * b - (37 if "ragged" in geometry else 0)
    dense = rng.random((2, n, n)) < 0.5
    mask = tessera.BlockMask.from_dense(dense, block_size=b, seq_len_q=L, seq_len_kv=L)
    fm = peers.flex_block_mask(mask, "cpu")
    assert int(fm.kv_num_blocks.sum()) == 0
    assert torch.equal(fm.full_kv_num_blocks[0], torch.from_numpy(dense.sum(-1)).int())
    assert torch.equal(fm.to_dense()[0].bool(), torch.from_numpy(dense))
    assert fm.seq_lengths == (L, L)
    assert peers.flex_kernel_options(fm) == ({"BLOCK_M": 64, "BLOCK_N": 64} if b == 64
                                             else None)


def test_flex_block_mask_of_variable_blocks_is_exact():
    """Variable blocks as full and partial 128-token tiles with a token-exact mask_mod: eager
    Flex (which computes the mask_mod) equals the reference on per-head masks."""
    rng = np.random.default_rng(1)
    bounds = np.r_[0, np.cumsum(rng.integers(30, 200, size=6))]
    dense = rng.random((2, 6, 6)) < 0.5
    dense[:, :, 0] = True
    mask = tessera.BlockMask.from_dense(dense, q_bounds=bounds, kv_bounds=bounds)
    L = mask.seq_len_q
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, L, 16)).astype(np.float32))
               for _ in range(3))
    got = _flex(q, k, v, mask).numpy()
    want = reference.attention(q.numpy(), k.numpy(), v.numpy(), mask)
    assert np.abs(got - want).max() < 1e-4


def test_cudnn_bsa_index_lists_select_the_mask():
    rng = np.random.default_rng(2)
    dense = rng.random((2, 5, 5)) < 0.4
    dense[0, 3] = False  # a query block that selects nothing (allow_empty_block_nums)
    mask = tessera.BlockMask.from_dense(dense, block_size=64)
    inp = peers.cudnn_bsa_inputs(mask, batch=2, heads=4, device="cpu", kv_heads=2)
    assert inp.block == 64 and inp.kv_splits == "auto"
    assert tuple(inp.nums.shape) == (2, 4, 5) and inp.index.dtype == torch.int32
    for b in range(2):
        for h in range(4):
            for i in range(5):
                n = int(inp.nums[b, h, i])
                got = np.zeros(5, bool)
                got[inp.index[b, h, i, :n].numpy()] = True
                assert np.array_equal(got, dense[h // 2, i])
    m128 = tessera.BlockMask.from_dense(dense, block_size=128)
    assert peers.cudnn_bsa_inputs(m128, 1, 2, "cpu").kv_splits == 1


def test_cudnn_bsa_refuses_what_it_cannot_run_exactly():
    dense = np.ones((2, 3, 3), bool)
    bounds = np.array([0, 50, 120, 200])
    variable = tessera.BlockMask.from_dense(dense, q_bounds=bounds, kv_bounds=bounds)
    assert peers.cudnn_bsa_inputs(variable, 1, 2, "cpu") is None
    ragged = tessera.BlockMask.from_dense(dense, block_size=64, seq_len_q=150, seq_len_kv=150)
    assert peers.cudnn_bsa_inputs(ragged, 1, 2, "cpu") is None
    assert peers.cudnn_bsa_inputs(tessera.BlockMask.from_dense(dense, block_size=96), 1, 2,
                                  "cpu") is None


def test_optional_peers_are_detected_without_failing():
    assert isinstance(peers.cudnn_bsa_available(), bool)
    assert isinstance(peers.fa4_available(), bool)
    a, b = torch.ones(3), torch.ones(3) * 1.01
    assert peers.relative_difference(a, b) == pytest.approx(0.01 / 1.01, rel=1e-5)


def test_compiled_flex_keeps_a_compile_per_length(monkeypatch):
    """Flex compiled for static shapes, with room for a compile per length, head dim and tile
    option of a bench process (a symbolic-length kernel ran 1.45x slower)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    monkeypatch.setattr(config, name, 8)
    assert callable(peers.compiled_flex())
    assert getattr(config, name) == peers.FLEX_COMPILES


def test_agrees_records_the_difference_and_flags_a_peer_too_far(capsys):
    row = {}
    assert peers.agrees(row, "flex", 5e-3, "on x/y")
    assert row == {"flex_diff": 5e-3}
    assert not peers.agrees(row, "bsa", 0.5, "on x/y")
    assert row["bsa_differs"] and row["bsa_diff"] == 0.5
    assert "bsa differs from Tessera on x/y by 5.00e-01: not timed" in capsys.readouterr().err
