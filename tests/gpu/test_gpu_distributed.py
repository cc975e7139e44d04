"""GPU: sequence-parallel attention on NCCL. One GPU: world size 1 (every mode through the
real communicator and Tessera's kernels) equals tessera.attention. Two or more GPUs: spawned
ranks, each mode equals one-GPU tessera.attention on a Wan-like shape with per-head masks, and
100 calls with changing masks neither hang nor grow memory. Needs torch."""

from __future__ import annotations

import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.integrations import distributed as D  # noqa: E402
from tessera.tools.peers import relative_difference  # noqa: E402

pytestmark = pytest.mark.gpu


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _case(seed, heads=4, n=24, block=128, density=0.15):
    rng = np.random.default_rng(seed)
    dens = rng.choice([0.02, density, 0.6], size=heads)  # per-head densities differ
    blocks = rng.random((heads, n, n)) < dens[:, None, None]
    blocks[:, :, 0] = True
    L = n * block - 37  # a ragged end
    mask = tessera.BlockMask.from_dense(blocks, block_size=block, seq_len_q=L, seq_len_kv=L)
    if seed % 2:  # every other case a device mask: its parts are cut and planned on the GPU
        mask = mask.to_device()
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, heads, L, 64, generator=g, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    return mask, q, k, v


def _run_ranks(rank, world, port, rounds, results):
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        worst = 0.0
        for i in range(rounds):
            mask, q, k, v = _case(i)
            ref = tessera.attention(q, k, v, mask)
            lo, hi = D.shard_ranges(mask.seq_len_q, world)[rank]
            modes = [("ulysses", None, "pairs"), ("ulysses", None, "heads"),
                     ("ring", None, "pairs")] + (
                [("hybrid", 2, "pairs")] if world >= 4 and world % 2 == 0 else [])
            for mode, udeg, balance in modes:
                out = D.sequence_parallel_attention(
                    *(x[:, :, lo:hi].contiguous() for x in (q, k, v)), mask, mode=mode,
                    ulysses_degree=udeg, balance=balance)
                worst = max(worst, relative_difference(out, ref[:, :, lo:hi]))
            if i == 0:
                base = torch.cuda.memory_allocated()
        results[rank] = (worst, torch.cuda.memory_allocated() - base)
    finally:
        dist.destroy_process_group()


def test_world_size_one_equals_one_gpu_attention():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    results = {}
    _run_ranks(0, 1, _port(), 3, results)
    worst, _ = results[0]
    assert worst < 1e-2


def test_ranks_on_several_gpus_equal_one_gpu_attention_over_100_calls():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two or more GPUs")
    import torch.multiprocessing as mp

    world = min(torch.cuda.device_count(), 4)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_run_ranks, args=(world, _port(), 100, results), nprocs=world, join=True)
        for rank in range(world):
            worst, growth = results[rank]
            assert worst < 1e-2, (rank, worst)
            assert growth < 64 * 2 ** 20, (rank, growth)  # no leak across the calls
