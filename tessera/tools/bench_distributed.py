"""``python -m tessera bench --distributed``: sequence-parallel attention across the GPUs of one
``torchrun`` launch (:mod:`tessera.integrations.distributed`) against one GPU running
``tessera.attention`` on the whole sequence.

Every rank makes the same inputs and mask (one seed), keeps its sequence shard, and also runs
the whole-sequence attention on its own GPU: that is the one-GPU time (rank 0's) and the
reference each rank's output shard is compared with. Per mode -- Ulysses with heads balanced by
useful pairs, Ulysses with the plain split by head count, the ring, and the hybrid where the
group allows one -- it prints the slowest and mean rank time, the balance (max / mean useful
pairs per rank, :func:`~tessera.integrations.distributed.rank_pairs`), the share of ring steps
skipped, the speed-up over one GPU and the largest relative difference from it. Run without
``torchrun`` it is a group of one on this GPU.

Cases: ``random-10`` (128-token blocks, 10%) and ``mixed-heads`` (per-head densities from 2% to
60%, the spread that makes a plain head split idle some ranks).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import numpy as np

import tessera

from ..families import mixed_densities
from ..integrations import distributed as sp
from .timing import cuda_time_ms
from .workloads import WORKLOADS

BLOCK = 128
DIST_CASES = ("random-10", "mixed-heads")


def case_blocks(case: str, rng: np.random.Generator, heads: int, n: int) -> np.ndarray:
    """The block matrix ``[heads, n, n]`` of a distributed bench case."""
    if case == "random-10":
        return rng.random((heads, n, n)) < 0.10
    if case == "mixed-heads":
        density = np.asarray(mixed_densities(heads, int(rng.integers(1 << 31))))
        return rng.random((heads, n, n)) < density[:, None, None]
    raise ValueError(f"case must be one of {DIST_CASES}, got {case!r}")


def modes_for(ranks: int, kv_heads: int) -> list[tuple[str, int | None, str]]:
    """(mode, ulysses_degree, balance) to time on ``ranks`` ranks: the ring, Ulysses both ways
    where every rank can have a kv head, and the hybrid of the largest proper Ulysses group."""
    out: list[tuple[str, int | None, str]] = []
    if kv_heads >= ranks:
        out += [("ulysses", None, "pairs"), ("ulysses", None, "heads")]
    out.append(("ring", None, "pairs"))
    groups = [u for u in range(2, ranks) if ranks % u == 0 and u <= kv_heads]
    if groups:
        out.append(("hybrid", max(groups), "pairs"))
    return out


def _init() -> tuple[int, int, Any]:
    """(rank, world size, device) from torchrun's environment, or a group of one here."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device


def run(shapes: list[str], cases: list[str], reps: int) -> list[dict]:
    """Time every (shape, case, mode) on the launched group; rank 0 returns the rows (the
    others an empty list)."""
    import torch
    import torch.distributed as dist

    rank, ranks, device = _init()
    rows: list[dict] = []
    try:
        for shape in shapes:
            w = WORKLOADS[shape]
            h, d, L = w.heads, w.head_dim, w.seq_len
            gen = torch.Generator(device=device).manual_seed(0)
            q, k, v = (torch.randn(1, h, L, d, device=device, dtype=torch.bfloat16,
                                   generator=gen) for _ in range(3))
            lo, hi = sp.shard_ranges(L, ranks)[rank]
            mine = [x[:, :, lo:hi].contiguous() for x in (q, k, v)]
            n = -(-L // BLOCK)
            for case in cases:
                # A device mask, as a model makes it: the one-GPU request plans on the GPU.
                blocks = torch.from_numpy(case_blocks(case, np.random.default_rng(0), h, n))
                bounds = np.minimum(np.arange(n + 1) * BLOCK, L)
                mask = tessera.BlockMask.from_dense(blocks.to(device), q_bounds=bounds,
                                                    kv_bounds=bounds)
                one_ms = cuda_time_ms(lambda: tessera.attention(q, k, v, mask), reps)
                ref = tessera.attention(q, k, v, mask)[:, :, lo:hi].float()
                for mode, udeg, balance in modes_for(ranks, h):
                    def call():
                        return sp.sequence_parallel_attention(*mine, mask, mode=mode,
                                                              ulysses_degree=udeg,
                                                              balance=balance)
                    out = call().float()
                    diff = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
                    dist.barrier()
                    ms = cuda_time_ms(call, reps)
                    got = [None] * ranks
                    dist.all_gather_object(got, (ms, diff))
                    if rank:
                        continue
                    times = np.array([g[0] for g in got])
                    pairs = sp.rank_pairs(mask, ranks, h, h, mode=mode, ulysses_degree=udeg,
                                          balance=balance)
                    skipped = 0.0
                    if mode == "ring":
                        skipped = sp.ring_plan(mask, sp.shard_ranges(L, ranks),
                                               mask.to_dense()).skipped_fraction
                    rows.append(dict(
                        shape=shape, case=case, ranks=ranks,
                        mode=mode + (f"/u{udeg}" if udeg else "") +
                        ("/plain" if balance == "heads" else ""),
                        one_gpu_ms=one_ms, max_ms=float(times.max()),
                        mean_ms=float(times.mean()), per_rank_ms=times.tolist(),
                        balance=float(pairs.max() / max(pairs.mean(), 1e-30)),
                        ring_skipped=skipped, speedup=one_ms / float(times.max()),
                        rel_diff=max(g[1] for g in got)))
    finally:
        dist.destroy_process_group()
    return rows


def table(rows: list[dict]) -> str:
    """The figures as an aligned text table."""
    head = (f"{'shape':15} {'case':12} {'P':>2} {'mode':16} {'1 GPU':>8} {'max':>8} "
            f"{'mean':>8} {'bal':>5} {'skip':>5} {'x 1GPU':>6} {'diff':>8}")
    out = [head]
    for r in rows:
        out.append(f"{r['shape']:15} {r['case']:12} {r['ranks']:2d} {r['mode']:16} "
                   f"{r['one_gpu_ms']:8.2f} {r['max_ms']:8.2f} {r['mean_ms']:8.2f} "
                   f"{r['balance']:5.2f} {r['ring_skipped']:5.2f} {r['speedup']:6.2f} "
                   f"{r['rel_diff']:8.1e}")
    return "\n".join(out)


def main(shapes: list[str], cases: list[str], reps: int, json_path: str | None) -> int:
    """The ``--distributed`` bench: checks, runs, prints on rank 0."""
    for c in cases:
        if c not in DIST_CASES:
            print(f"bench --distributed: unknown case {c!r}; choose from "
                  f"{', '.join(DIST_CASES)}", file=sys.stderr)
            return 2
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("bench --distributed needs PyTorch with torch.distributed; it is not installed "
              "here.")
        return 1
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("bench --distributed needs CUDA GPUs and NCCL; none is visible here. Launch it "
              "with `torchrun --nproc-per-node N -m tessera bench --distributed` on a machine "
              "with N GPUs (the CPU tests run every mode on gloo).")
        return 1
    rows = run(shapes, cases, reps)
    if rows:
        print(table(rows))
        if json_path:
            with open(json_path, "w") as f:
                json.dump(rows, f, indent=1)
    return 0
