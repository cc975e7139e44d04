"""CPU tests of the planners (tessera.runtime.planners): the key-major direction -- tiles of key
rows walking the query spans that select them -- covers exactly the mask's transpose, every
(key, query) pair once, and organizes one query head a task."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import BlockMask, Regime
from tessera.runtime.mode import Direction, PlanMode
from tessera.runtime.planners import ArrayPlanner, PlanShape, oriented
from tessera.runtime.queue import Task
from tessera.runtime.regime.choice import RegimeChoice


def _ragged_mask(rng: np.random.Generator, batch: int, heads: int) -> BlockMask:
    q_bounds = np.concatenate([[0], np.cumsum(rng.integers(16, 200, size=7))])
    kv_bounds = np.concatenate([[0], np.cumsum(rng.integers(16, 200, size=5))])
    dense = rng.random((batch, heads, 7, 5)) < 0.45
    dense[..., 0, 0] = True
    return BlockMask.from_dense(dense, q_bounds=q_bounds, kv_bounds=kv_bounds)


def _shape(mask: BlockMask, batch: int, hq: int, hkv: int) -> PlanShape:
    return PlanShape(batch, hq, hkv, 64, "bfloat16", "bhld", mask.batch_index(batch),
                     mask.head_index(hq, hkv))


def _token_mask(mask: BlockMask) -> np.ndarray:
    """[B*H, Lq, Lk] booleans: which key tokens each query token selects."""
    dense = mask.to_dense().reshape(-1, mask.num_q_blocks, mask.num_kv_blocks)
    q_block = np.repeat(np.arange(mask.num_q_blocks), np.diff(mask.q_bounds))
    k_block = np.repeat(np.arange(mask.num_kv_blocks), np.diff(mask.kv_bounds))
    return dense[:, q_block][:, :, k_block]


def _covered(tiles, n_bh: int, rows: int, cols: int) -> np.ndarray:
    """How many times the tiles' spans cover each (row token, column token) pair of each head."""
    cov = np.zeros((n_bh, rows, cols), dtype=np.int64)
    for t in range(tiles.num_tiles):
        r_lo, r_hi = int(tiles.q0[t]), int(tiles.q1[t])
        for s in range(int(tiles.span_begin[t]), int(tiles.span_end[t])):
            lo, hi = max(r_lo, int(tiles.r0[s])), min(r_hi, int(tiles.r1[s]))
            cov[int(tiles.mask_bh[t]), lo:hi, int(tiles.k0[s]):int(tiles.k1[s])] += 1
    return cov


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("combine", [0.0, 0.4])
def test_key_major_tiles_cover_the_transpose_once(seed, combine):
    rng = np.random.default_rng(seed)
    mask = _ragged_mask(rng, 2, 3)
    regime = Regime(block_m=64, block_n=64, num_warps=4, stages=2, combine_threshold=combine)
    choice = RegimeChoice(regime, True, True, 0, False)
    shape = _shape(mask, 2, 3, 3)
    done = ArrayPlanner().organize(mask, shape, PlanMode.EXACT, choice, Direction.KEY_MAJOR)
    want = _token_mask(mask).transpose(0, 2, 1)  # [B*H, key token, query token]
    got = _covered(done.tiles, want.shape[0], mask.seq_len_kv, mask.seq_len_q)
    np.testing.assert_array_equal(got, want.astype(np.int64))
    # Query-major tiles of the same mask cover it the other way round, also exactly once.
    fwd = ArrayPlanner().organize(mask, shape, PlanMode.EXACT, choice)
    np.testing.assert_array_equal(
        _covered(fwd.tiles, want.shape[0], mask.seq_len_q, mask.seq_len_kv),
        _token_mask(mask).astype(np.int64))


@pytest.mark.parametrize("mask_heads", [1, 2, 4])
def test_key_major_tasks_hold_one_query_head_each(mask_heads):
    """GQA (4 query heads, 2 kv heads): key-major tasks are per query head, each reading its own
    stored mask head, where query-major tasks pack a kv head's group."""
    rng = np.random.default_rng(7)
    mask = _ragged_mask(rng, 1, mask_heads)
    regime = Regime(block_m=128, block_n=64, num_warps=8, stages=2, combine_threshold=0.0)
    choice = RegimeChoice(regime, True, True, 0, False)
    shape = _shape(mask, 1, 4, 2)
    key_major = ArrayPlanner().organize(mask, shape, PlanMode.EXACT, choice,
                                        Direction.KEY_MAJOR).launch_queue
    assert key_major.heads_per_task == 1
    heads = np.unique(key_major.tasks[:, Task.Q_HEAD0])
    np.testing.assert_array_equal(heads, np.arange(4))
    query_major = ArrayPlanner().organize(mask, shape, PlanMode.EXACT, choice).launch_queue
    assert query_major.heads_per_task == (2 if mask_heads < 4 else 1)


def test_oriented_transposes_the_mask_and_keeps_query_major_as_given():
    rng = np.random.default_rng(3)
    mask = _ragged_mask(rng, 1, 2)
    shape = _shape(mask, 1, 4, 2)
    same_mask, same_shape = oriented(mask, shape, Direction.QUERY_MAJOR)
    assert same_mask is mask and same_shape is shape
    t, s = oriented(mask, shape, Direction.KEY_MAJOR)
    np.testing.assert_array_equal(t.q_bounds, mask.kv_bounds)
    np.testing.assert_array_equal(t.kv_bounds, mask.q_bounds)
    np.testing.assert_array_equal(t.to_dense(), mask.to_dense().swapaxes(-1, -2))
    assert (s.num_q_heads, s.num_kv_heads) == (4, 4)
    np.testing.assert_array_equal(s.head_of, shape.head_of)
