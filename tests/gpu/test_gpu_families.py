"""GPU tests of the video mask families (tessera.families): device paths equal host paths."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import families as M
from tests.families.families_helpers import dense, is_permutation, separated_qk


@pytest.mark.gpu
def test_device_paths_match_host():
    import cupy as cp

    lat, cube = (5, 6, 7), (4, 4, 4)
    rng = np.random.default_rng(7)
    q = 2 * rng.standard_normal((2, 3, 215, 16)).astype(np.float32)
    k = 2 * rng.standard_normal((2, 3, 215, 16)).astype(np.float32)
    for kw in (dict(topk=3), dict(top_p=0.8)):
        h = M.topk_pooled(q, k, lat, cube=cube, text_tokens=5, text_valid=3, **kw)
        d = M.topk_pooled(cp.asarray(q), cp.asarray(k), lat, cube=cube, text_tokens=5,
                          text_valid=3, **kw)
        assert d.mask.on_device and isinstance(d.permutation, np.ndarray)
        assert np.array_equal(cp.asnumpy(d.mask.to_dense()), dense(h)), kw
        assert np.array_equal(d.permutation, h.permutation)
        assert np.array_equal(d.mask.q_bounds, h.mask.q_bounds)
        h = M.topk_pooled(q, k, lat, cube=cube, text_tokens=5, text_valid=3, text_first=True,
                          **kw)
        d = M.topk_pooled(cp.asarray(q), cp.asarray(k), lat, cube=cube, text_tokens=5,
                          text_valid=3, text_first=True, **kw)
        assert np.array_equal(cp.asnumpy(d.mask.to_dense()), dense(h)), kw
        assert np.array_equal(d.permutation, h.permutation)
    qs, ks, _, _ = separated_qk(np.random.default_rng(3))
    h = M.semantic_clusters(qs, ks, 3, 4, top_p=0.9, min_fraction=0.25)
    d = M.semantic_clusters(cp.asarray(qs), cp.asarray(ks), 3, 4, top_p=0.9, min_fraction=0.25)
    assert d.mask.on_device
    assert np.array_equal(d.permutation, h.permutation)
    assert np.array_equal(d.kv_permutation, h.kv_permutation)
    assert np.array_equal(cp.asnumpy(d.mask.to_dense()), dense(h))
    qr = cp.asarray(rng.standard_normal((2, 300, 8)).astype(np.float32))
    vm = M.semantic_clusters(qr, qr * 2, 6, 20, text_tokens=4, text_valid=2)
    assert is_permutation(vm.permutation, 300) and is_permutation(vm.kv_permutation, 300)
    assert (cp.asnumpy(vm.mask.to_dense())[0, :, :-2, :-2].sum(-1) >= 2).all()


def _order_keys(x: np.ndarray) -> np.ndarray:
    """The kernels' order of float32 scores as int64 keys (larger float, larger key; NaN
    below every number)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.int64)
    key = np.where(u & 0x80000000, 0xFFFFFFFF - u, u | 0x80000000)
    return np.where(np.isnan(x), 0, key)


def _top_rows(scores: np.ndarray, keep: int) -> np.ndarray:
    """Per row of ``scores`` its ``keep`` highest, ties in column order, NaN last."""
    rows = scores.reshape(-1, scores.shape[-1])
    out = np.zeros(rows.shape, dtype=bool)
    cols = np.arange(rows.shape[-1])
    for r, row in enumerate(rows):
        order = np.lexsort((cols, -_order_keys(row)))
        out[r, order[:keep]] = True
    return out.reshape(scores.shape)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("ordered", [False, True])
def test_device_pooled_topk_kernels(dtype, ordered):
    """The device's pooled top-k kernels on the values they read, against float64: cube means
    of q and k (partial edge cubes; GQA, k's heads not repeated; q a strided [B, L, H, D]
    tensor seen as [B, H, L, D]), the cubes' scores, and the selection exact against a sort of
    the scores the GPU computed."""
    torch = pytest.importorskip("torch")
    import cupy as cp

    from tessera.families import pooled_topk as pt
    from tessera.families.common import check_qk

    lat, cube = (5, 7, 9), (2, 4, 4)
    n_video = int(np.prod(lat))
    perm, sizes = M.tile_permutation(lat, cube)
    bounds = np.r_[0, np.cumsum(sizes)]
    n = sizes.size
    g = torch.Generator(device="cuda").manual_seed(5)
    tdt = getattr(torch, dtype)
    q = torch.randn(2, n_video + 3, 4, 64, device="cuda", generator=g).to(tdt).transpose(1, 2)
    k = torch.randn(2, 2, n_video + 3, 64, device="cuda", generator=g).to(tdt)
    cq, ck, xp = check_qk(q, k, n_video + 3, repeat_kv=False)
    assert xp is cp and ck.shape[1] == 2 and not cq.flags.c_contiguous
    tokens = None if ordered else cp.asarray(perm)
    dev_bounds = cp.asarray(bounds)
    pq, pk = (pt._device_pool(x[:, :, :n_video], tokens, dev_bounds, n, cp) for x in (cq, ck))
    exact = [t.float().cpu().numpy().astype(np.float64)[:, :, :n_video] for t in (q, k)]
    if not ordered:
        exact = [x[:, :, perm] for x in exact]
    ref_q, ref_k = (np.add.reduceat(x, bounds[:-1], axis=2) / sizes[:, None] for x in exact)
    for got, ref in ((pq, ref_q), (pk, ref_k)):
        assert np.abs(cp.asnumpy(got) - ref).max() <= 1e-5 * np.abs(ref).max()
    scores = pt._device_scores(pq, pk, 0.125, cp)
    ref_s = np.einsum("bhid,bhjd->bhij", ref_q, np.repeat(ref_k, 2, axis=1)) * 0.125
    assert np.abs(cp.asnumpy(scores) - ref_s).max() <= 1e-5 * np.abs(ref_s).max()
    for keep in (1, 7, n):
        got = cp.asnumpy(pt._device_topk(scores, keep, cp))
        assert np.array_equal(got, _top_rows(cp.asnumpy(scores), keep)), keep


@pytest.mark.gpu
def test_device_topk_selection_ties_and_nan():
    """The selection kernel where scores tie at the threshold (taken in column order), hold NaN
    (kept last) and -inf, over rows longer than one 256-column step and shorter than one."""
    import cupy as cp

    from tessera.families import pooled_topk as pt

    rng = np.random.default_rng(11)
    for n in (300, 37, 1000):
        s = rng.integers(-3, 4, size=(3, 5, n)).astype(np.float32)  # many ties
        s[0, 0, ::7] = np.nan
        s[0, 1, :] = np.nan
        s[1, 2, ::3] = -np.inf
        s[2, 3, :] = -0.0
        for keep in (1, 2, n // 3, n - 1, n):
            got = cp.asnumpy(pt._device_topk(cp.asarray(s), keep, cp))
            assert (got.sum(-1) == keep).all()
            assert np.array_equal(got, _top_rows(s, keep)), (n, keep)


@pytest.mark.gpu
def test_pooled_topk_request_captured_in_a_cuda_graph():
    """A top-k request -- its mask made from q and k by the device kernels, planned and run --
    captured into a CUDA graph after a warm-up, replayed on new q, k, v written into the
    captured tensors: each replay's output is the float64 attention of the mask the new
    inputs select (which differs from the captured inputs' mask), within bf16 tolerance."""
    torch = pytest.importorskip("torch")
    import tessera
    from tessera import reference
    from tessera.streams import on_producer_stream

    lat, cube, H, D = (4, 16, 16), (2, 4, 4), 4, 64
    L = int(np.prod(lat))
    q, k, v = (torch.randn(1, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def request():
        with on_producer_stream(q):
            # (tokens taken as already in the cube order: the mask's blocks are theirs)
            vm = M.topk_pooled(q, k, lat, cube=cube, topk=5, ordered=True)
        return tessera.attention(q, k, v, vm.mask, layout="bhld"), vm

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        _, first = request()  # the warm-up: kernels loaded, constants on the GPU
    first_dense = first.mask.to_dense()
    first_dense = first_dense.get() if hasattr(first_dense, "get") else np.asarray(first_dense)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out, _ = request()
    for seed in (1, 2):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, device="cuda", generator=gen).to(t.dtype))
        graph.replay()
        torch.cuda.synchronize()
        vm = M.topk_pooled(q, k, lat, cube=cube, topk=5, ordered=True)  # eager: these inputs' mask
        dense = vm.mask.to_dense()
        dense = dense.get() if hasattr(dense, "get") else np.asarray(dense)
        assert not np.array_equal(dense, first_dense), "the inputs select the same cubes"
        host = tessera.BlockMask.from_dense(dense, q_bounds=vm.mask.q_bounds,
                                            kv_bounds=vm.mask.kv_bounds)
        exact = [t.float().cpu().numpy().astype(np.float64) for t in (q, k, v)]
        ref = reference.attention(*exact, host)
        got = out.float().cpu().numpy().astype(np.float64)
        assert not np.isnan(got).any()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
