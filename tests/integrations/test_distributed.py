"""CPU tests of sequence-parallel attention (tessera.integrations.distributed): every mode in
spawned gloo processes equals single-process attention (the float64 reference) for uniform,
variable and per-head masks, uneven heads and shards, GQA and shards no query selects; the
head assignment against a brute-force optimum. Skipped without torch."""

from __future__ import annotations

import socket

import numpy as np
import pytest

import tessera
from tessera import reference
from tessera.integrations import distributed as D


def test_shard_ranges_cover_the_sequence():
    assert D.shard_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert D.shard_ranges(2, 3) == [(0, 1), (1, 2), (2, 2)]
    with pytest.raises(ValueError):
        D.shard_ranges(10, 0)


@pytest.mark.parametrize("seed", range(12))
def test_head_assignment_near_the_optimum(seed):
    """Longest first plus improving moves and swaps: within 4/3 of the best possible maximum
    load (the longest-first bound), and at it on most small cases."""
    rng = np.random.default_rng(seed)
    heads, ranks = int(rng.integers(3, 8)), int(rng.integers(2, 4))
    work = rng.choice([0.02, 0.1, 0.3, 0.6], size=heads) * rng.uniform(0.5, 1.5, size=heads)
    units = D.assign_heads(work, ranks)
    assert sorted(u for us in units for u in us) == list(range(heads))
    got = max(work[us].sum() if us else 0.0 for us in units)
    best = D.brute_force_assignment(work, ranks)
    assert got <= best * 4 / 3 + 1e-12
    if seed < 6:
        assert got == pytest.approx(best) or got <= best * 1.15


def test_head_assignment_beats_a_plain_split_on_mixed_densities():
    """Per-head densities 2-60%: balanced by work, the largest rank's share is far below a
    plain split (consecutive heads, two a rank)."""
    work = np.array([0.6, 0.5, 0.02, 0.03, 0.02, 0.04, 0.3, 0.05])
    plain = max(work[i:i + 2].sum() for i in range(0, 8, 2))
    balanced = max(work[us].sum() for us in D.assign_heads(work, 4))
    assert balanced <= 0.62 and plain / balanced >= 1.25


def test_plain_split_gives_consecutive_heads_by_count():
    mask = tessera.BlockMask.from_dense(np.ones((5, 2, 2), bool), block_size=64)
    dense = np.asarray(mask.to_dense())
    assert D.head_units(mask, dense, 5, 2, "heads") == [[0, 1], [2, 3, 4]]
    assert D.head_units(mask, dense, 3, 4, "heads") == [[], [0], [1], [2]]
    with pytest.raises(ValueError, match="balance must be one of"):
        D.head_units(mask, dense, 5, 2, "even")


@pytest.mark.parametrize("mode,ranks,udeg", [("ulysses", 3, None), ("ring", 4, None),
                                             ("hybrid", 4, 2)])
def test_rank_pairs_count_each_ranks_work(mode, ranks, udeg):
    """Per-rank useful pairs add up to the mask's (every pair computed once); the ring's are
    the pairs of each rank's query rows, counted token by token; Ulysses balanced by pairs
    has its largest rank no busier than the plain split's."""
    rng = np.random.default_rng(3)
    bounds = np.r_[0, np.cumsum(rng.integers(20, 90, size=9))]
    dense = rng.random((6, 9, 9)) < np.linspace(0.05, 0.9, 6)[:, None, None]
    mask = tessera.BlockMask.from_dense(dense, q_bounds=bounds, kv_bounds=bounds)
    total = float(mask.selected_pairs(1, 6).sum())
    got = D.rank_pairs(mask, ranks, 6, 6, mode=mode, ulysses_degree=udeg)
    assert got.shape == (ranks,) and got.sum() == pytest.approx(total)
    tok = np.repeat(np.repeat(dense, np.diff(bounds), 1), np.diff(bounds), 2)  # [H, L, L]
    if mode == "ring":
        want = [tok[:, lo:hi].sum() for lo, hi in D.shard_ranges(int(bounds[-1]), ranks)]
        assert np.allclose(got, want)
    plain = D.rank_pairs(mask, ranks, 6, 6, mode=mode, ulysses_degree=udeg, balance="heads")
    assert plain.sum() == pytest.approx(total) and got.max() <= plain.max() + 1e-9
    with pytest.raises(ValueError, match="mode must be"):
        D.rank_pairs(mask, ranks, 6, 6, mode="auto")
    with pytest.raises(ValueError, match="ranks must be an int >= 1, got 0"):
        D.rank_pairs(mask, 0, 6, 6, mode="ring")
    with pytest.raises(ValueError, match="num_kv_heads must be an int >= 1"):
        D.rank_pairs(mask, ranks, 6, 0, mode="ring")
    with pytest.raises(ValueError, match="ulysses_degree must divide the group's 4 ranks"):
        D.rank_pairs(mask, 4, 6, 6, mode="hybrid", ulysses_degree=3)
    with pytest.raises(TypeError, match="block_mask must be a tessera.BlockMask"):
        D.rank_pairs(dense, ranks, 6, 6, mode="ring")
    with pytest.raises(ValueError, match="ranks must be an int >= 1"):
        D.head_units(mask, np.asarray(mask.to_dense()), 6, 0)


def test_crop_keeps_exactly_the_pairs_in_range():
    rng = np.random.default_rng(2)
    bounds = np.r_[0, np.cumsum(rng.integers(5, 40, size=8))]
    mask = tessera.BlockMask.from_dense(rng.random((2, 8, 8)) < 0.4, q_bounds=bounds,
                                        kv_bounds=bounds)
    n = int(bounds[-1])

    def tokens(m):
        d = np.asarray(m.to_dense())
        return np.repeat(np.repeat(d, np.diff(m.q_bounds), axis=2), np.diff(m.kv_bounds), axis=3)

    full = tokens(mask)
    for q_range, kv_range in [((0, n), (0, n)), ((13, 77), (40, n)), ((5, 6), (0, 9))]:
        part = D.crop(mask, q_range, kv_range)
        want = full[..., q_range[0]:q_range[1], kv_range[0]:kv_range[1]]
        if part is None:
            assert not want.any()
        else:
            assert np.array_equal(tokens(part), want)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, cases, mode, udeg, balance, results):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for key, (mask, layout, q, k, v) in cases.items():
            lo, hi = D.shard_ranges(mask.seq_len_q, world)[rank]
            sd = 2 if layout == "bhld" else 1
            pieces = [torch.from_numpy(x).narrow(sd, lo, hi - lo).contiguous() for x in (q, k, v)]
            out = D.sequence_parallel_attention(*pieces, mask, mode=mode, layout=layout,
                                                ulysses_degree=udeg, balance=balance)
            results[(key, rank)] = out.numpy()
    finally:
        dist.destroy_process_group()


def _cases():
    rng = np.random.default_rng(7)
    L = 300
    uniform = tessera.BlockMask.from_dense(rng.random((3, 5, 5)) < 0.5, block_size=64,
                                           seq_len_q=L, seq_len_kv=L)
    bounds = np.r_[0, np.cumsum([70, 13, 90, 41, 86])]
    dense = rng.random((3, 5, 5)) < [[[0.9]], [[0.1]], [[0.5]]]  # per-head densities differ
    dense[:, :, 1] = False  # key block 1 (tokens 70-83) selected by no query
    dense[:, 0] = False  # query block 0 selects nothing: zero rows
    variable = tessera.BlockMask.from_dense(dense, q_bounds=bounds, kv_bounds=bounds)
    broadcast = tessera.BlockMask.from_dense(rng.random((5, 5)) < 0.4, block_size=64,
                                             seq_len_q=L, seq_len_kv=L)
    for name, mask, hq, hkv in (("uniform", uniform, 3, 3), ("variable", variable, 3, 3),
                                ("gqa", broadcast, 4, 2)):
        q = rng.standard_normal((1, hq, L, 16))
        k, v = (rng.standard_normal((1, hkv, L, 16)) for _ in range(2))
        yield name, mask, q, k, v


@pytest.mark.parametrize("mode,world,udeg,balance", [
    ("ulysses", 2, None, "pairs"), ("ulysses", 3, None, "pairs"), ("ulysses", 4, None, "pairs"),
    ("ulysses", 3, None, "heads"), ("ring", 2, None, "pairs"), ("ring", 3, None, "pairs"),
    ("hybrid", 4, 2, "pairs"), ("hybrid", 4, 2, "heads"), ("auto", 3, None, "pairs"),
    ("auto", 4, None, "pairs")])
def test_every_mode_equals_single_process_attention(mode, world, udeg, balance):
    """gloo ranks in spawned processes, each with its shard: the gathered output equals the
    float64 reference on the whole sequence (3 heads over 2-4 ranks -- a rank with no head --,
    GQA 4/2, variable blocks with a key block no query selects and a query block that selects
    nothing; both layouts; the hybrid as 2 Ulysses groups of 2 ranks; heads balanced by pairs
    or split by count)."""
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    cases = {}
    for name, mask, q, k, v in _cases():
        for layout in ("bhld", "blhd"):
            args = [x if layout == "bhld" else x.transpose(0, 2, 1, 3).copy() for x in (q, k, v)]
            cases[(name, layout)] = (mask, layout, *args)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(world, _free_port(), cases, mode, udeg, balance, results),
                 nprocs=world, join=True)
        results = dict(results)
    for (name, layout), (mask, _, q, k, v) in cases.items():
        ref = reference.attention(q, k, v, mask, layout=layout)
        got = np.concatenate([results[((name, layout), r)] for r in range(world)],
                             axis=2 if layout == "bhld" else 1)
        assert np.abs(got - ref).max() < 1e-6, (name, layout)


def test_auto_mode_choice():
    assert D.choose_mode(4, 8) == ("ulysses", None)
    assert D.choose_mode(8, 4) == ("hybrid", 4)
    assert D.choose_mode(6, 4) == ("hybrid", 3)
    assert D.choose_mode(3, 2) == ("ring", None)


def test_ring_skips_the_shards_no_query_selects():
    """A block-diagonal mask over 4 shards: each rank needs only its own shard (3/4 of the
    ring's steps skipped); a full mask skips none."""
    diag = tessera.BlockMask.from_dense(np.eye(4, dtype=bool), block_size=64)
    ranges = D.shard_ranges(256, 4)
    dense = np.asarray(diag.to_dense())
    assert D.ring_plan(diag, ranges, dense).skipped_fraction == 0.75
    full = tessera.BlockMask.from_dense(np.ones((4, 4), bool), block_size=64)
    assert D.ring_plan(full, ranges, np.asarray(full.to_dense())).skipped_fraction == 0.0


def test_bad_inputs_are_refused_by_name():
    torch = pytest.importorskip("torch")
    mask = tessera.BlockMask.from_dense(np.ones((2, 2), bool), block_size=64)
    q = torch.zeros(1, 2, 128, 16)
    with pytest.raises(ValueError, match="mode must be one of"):
        D.sequence_parallel_attention(q, q, q, mask, mode="tree")
    with pytest.raises(ValueError, match="mode='hybrid' needs ulysses_degree"):
        D.sequence_parallel_attention(q, q, q, mask, mode="hybrid")
    with pytest.raises(TypeError, match="block_mask must be a tessera.BlockMask"):
        D.sequence_parallel_attention(q, q, q, np.ones((2, 2)))
    with pytest.raises(TypeError, match="q must be a 4-D torch tensor"):
        D.sequence_parallel_attention(q.numpy(), q, q, mask)
    if not torch.distributed.is_initialized():
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            D.sequence_parallel_attention(q, q, q, mask)


@pytest.mark.parametrize("call, kind, words", [
    (lambda m: D.rank_pairs(m, 4, 2, 2, mode="hybrid", ulysses_degree=4), ValueError,
     "ulysses_degree must divide the group's 4 ranks and be at most the 2 kv heads, got 4"),
    (lambda m: D.rank_pairs(m, 4, 3, 2, mode="ring"), ValueError,
     "num_q_heads=3 must be a multiple of num_kv_heads=2"),
    (lambda m: D.rank_pairs(m, 4, 2, 2, mode="hybrid"), ValueError,
     "mode='hybrid' needs ulysses_degree"),
    (lambda m: D.choose_mode(4, 0), ValueError, "kv_heads must be an int >= 1, got 0"),
    (lambda m: D.choose_mode(2.5, 4), ValueError, "ranks must be an int >= 1, got 2.5"),
    (lambda m: D.shard_ranges(100, 0), ValueError, "ranks must be an int >= 1, got 0"),
    (lambda m: D.shard_ranges(100.5, 2), ValueError, "length must be an int >= 0"),
    (lambda m: D.assign_heads([1.0, float("nan")], 2), ValueError, "work must be a 1-D"),
    (lambda m: D.assign_heads([1.0, 2.0], 1.5), ValueError, "ranks must be an int >= 1"),
])
def test_helpers_refuse_what_the_attention_refuses(call, kind, words):
    """The planning helpers take what sequence_parallel_attention takes and refuse the rest by
    name (a zero head count was a ZeroDivisionError, a hybrid group larger than the kv heads
    a plan the attention would refuse)."""
    mask = tessera.BlockMask.from_dense(np.ones((2, 3, 3), bool), block_size=16)
    with pytest.raises(kind, match=words):
        call(mask)
