"""Planning cost on the host: pytest-benchmark suites for a Wan-1.3B-shaped mask.

12 heads, 32,760 tokens, 10% block density (random, seed 0), numpy on the host:
``tessera.plan`` with 64- and 128-token blocks, ``BlockMask.from_dense`` of the 64-token mask,
a dense layer (every 128-token block selected) made into a mask and planned each call, and the
backward pass's queues of the 128-token mask (the Hopper kernels' 128-row tasks), both or the
key-major one alone (dQ summed by atomics).

    PYTHONPATH=. python -m pytest benchmarks/test_bench_plan.py --benchmark-enable -q

(pyproject's addopts disable benchmarks, so a plain test run executes each body once.) No
assertion is made on time; the checks below only make sure the benchmarked call did its work.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import BlockMask

HEADS = 12
SEQ_LEN = 32_760
DENSITY = 0.10
HEAD_DIM = 128


def wan_dense(block: int) -> np.ndarray:
    """[H, nB, nB] random block selection at DENSITY (seed 0)."""
    n = -(-SEQ_LEN // block)
    return np.random.default_rng(0).random((HEADS, n, n)) < DENSITY


def wan_mask(block: int) -> BlockMask:
    return BlockMask.from_dense(wan_dense(block), block_size=block, seq_len_q=SEQ_LEN,
                                seq_len_kv=SEQ_LEN)


@pytest.fixture(scope="module")
def dense64() -> np.ndarray:
    return wan_dense(64)


@pytest.mark.parametrize("block", [64, 128])
def test_bench_plan_wan(benchmark, block):
    mask = wan_mask(block)
    benchmark.group = "plan"
    benchmark.extra_info.update(block=block, heads=HEADS, seq_len=SEQ_LEN, nnz=mask.nnz)
    plan = benchmark(lambda: tessera.plan(mask, num_q_heads=HEADS, head_dim=HEAD_DIM))
    assert plan.queue.num_tasks > 0
    benchmark.extra_info.update(num_tasks=plan.queue.num_tasks, num_tiles=plan.tiles.num_tiles,
                                num_spans=int(plan.queue.spans.shape[0]))


def test_bench_from_dense_wan64(benchmark, dense64):
    benchmark.group = "from_dense"
    mask = benchmark(lambda: BlockMask.from_dense(dense64, block_size=64, seq_len_q=SEQ_LEN,
                                                  seq_len_kv=SEQ_LEN))
    assert mask.nnz == int(dense64.sum())
    benchmark.extra_info.update(nnz=mask.nnz)


def test_bench_plan_wan_dense_layer(benchmark):
    every = np.ones((HEADS, -(-SEQ_LEN // 128), -(-SEQ_LEN // 128)), dtype=bool)

    def mask_and_plan():
        mask = BlockMask.from_dense(every, block_size=128, seq_len_q=SEQ_LEN, seq_len_kv=SEQ_LEN)
        return tessera.plan(mask, num_q_heads=HEADS, head_dim=HEAD_DIM)

    benchmark.group = "plan"
    plan = benchmark(mask_and_plan)
    # One group and one span a head: the arithmetic mapping of a mask selecting every block.
    assert plan.tiles.num_groups == HEADS and plan.tiles.num_spans == HEADS
    benchmark.extra_info.update(num_tasks=plan.queue.num_tasks, num_tiles=plan.tiles.num_tiles)


@pytest.mark.parametrize("query_major", [True, False], ids=["both-queues", "key-major-only"])
def test_bench_backward_queues_wan(benchmark, query_major):
    from tessera.runtime.backward import backward_queues
    from tessera.runtime.plan import checked_shape

    mask = wan_mask(128)
    shape = checked_shape(mask, HEADS, HEADS, HEAD_DIM, None, 1, "bfloat16", "bhld")
    benchmark.group = "backward_queues"
    bq = benchmark(lambda: backward_queues(mask, shape, block_m=128, block_n=(64, 64),
                                           query_major=query_major))
    assert (bq.dq is not None) == query_major and bq.dkdv.tasks.shape[0] > 0
