"""GPU: the diffusers integration on tiny versions of each supported transformer, and every
family at its published widths and latent size, bf16 on the GPU kernels: all-ones masks equal
the model's own attention, each method's routed call equals
SDPA with its token-level mask and FlexAttention on the same mask, a captured forward replays
with masks that change, and disable restores the model bit for bit. Needs torch and diffusers
(skipped without them)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from tessera.integrations import diffusers as td  # noqa: E402
from tessera.integrations import methods as M  # noqa: E402
from tessera.tools import models  # noqa: E402
from tessera.tools.peers import relative_difference  # noqa: E402
from tessera.tools.pipeline import flex_attention_runner  # noqa: E402
from tests.integrations.test_diffusers import (  # noqa: E402
    compiled_and_eager_query_grads, session_for)
from tests.integrations.test_methods import _in_model_order  # noqa: E402

pytestmark = pytest.mark.gpu
NAMES = ["wan-1.3b", "hunyuan", "cogvideox-5b"]
# Every family at its published size, cut to a layer or two (the routing is per layer alike).
PUBLISHED_LAYERS = {
    "wan-1.3b": dict(num_layers=1), "wan-vace-1.3b": dict(num_layers=2, vace_layers=[0, 1]),
    "skyreels-v2-1.3b": dict(num_layers=1), "hunyuan": dict(num_layers=1, num_single_layers=1),
    "hunyuan-1.5": dict(num_layers=1), "cogvideox-5b": dict(num_layers=1),
    "mochi": dict(num_layers=1), "cosmos-7b": dict(num_layers=1), "ltx-video": dict(num_layers=1),
    "ltx-2": dict(num_layers=1)}
PROMPT = 100  # the prompt's text tokens of the model's text slots


@pytest.fixture(autouse=True)
def _clean():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    yield
    for s in list(td._sessions.values()):
        s.disable()


@pytest.mark.parametrize("keep_order", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_all_ones_masks_equal_the_models_own_attention(name, keep_order):
    """A window over the whole tile grid (every pair, tokens reordered into tiles and back):
    the transformer's output equals its own dense attention's to bf16 rounding; disable gives
    the model's own output bit for bit."""
    model = models.build(name, tiny=True)
    x = models.inputs(name, model, tiny=True, text_valid=10)
    with torch.no_grad():
        own = model(**x)[0]
        s = td.enable(model, M.SlidingTile(tile=(2, 4, 4), window=(9, 9, 9)),
                      keep_order=keep_order)
        got = model(**x)[0]
        td.disable(model)
        again = model(**x)[0]
    assert s.stats.sparse_calls > 0 and not torch.isnan(got).any()
    assert relative_difference(got, own) < 2e-2, relative_difference(got, own)
    assert torch.equal(again, own)


@pytest.mark.parametrize("name", NAMES)
def test_tokens_kept_in_order_equal_the_per_call_reordering(name):
    """keep_order with top-k cubes on the GPU (pooling tokens already in cube order): the
    forward equals the per-call reordering's to bf16 rounding."""
    model = models.build(name, tiny=True)
    x = models.inputs(name, model, tiny=True, text_valid=10)
    with torch.no_grad():
        td.enable(model, M.TopKCubes(topk=4))
        per_call = model(**x)[0]
        td.enable(model, M.TopKCubes(topk=4), keep_order=True)
        kept = model(**x)[0]
    assert relative_difference(kept, per_call) < 2e-2, relative_difference(kept, per_call)


METHODS = [M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)),
           M.SpatialTemporal(block=64, heads=["spatial", "temporal"]), M.Radial(block=64),
           M.TopKCubes(topk=4), M.SemanticClusters(q_clusters=8, kv_clusters=12)]
GEOS = [M.VideoGeometry((5, 12, 20)), M.VideoGeometry((5, 12, 20), 24, 10),
        M.VideoGeometry((5, 12, 20), 24, None, text_first=True)]


@pytest.mark.parametrize("geo", GEOS, ids=str)
@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_each_method_equals_sdpa_and_flex_on_its_mask(method, geo):
    """One routed call on the GPU (orders, Tessera's kernels, order undone) against float32
    SDPA over the original tokens with the method's token-level mask (worst row within bf16
    tolerance), and FlexAttention given the same mask through the pipeline's runner."""
    rng = np.random.default_rng(1)
    b, h, n, d = 1, 2, geo.tokens, 64
    q, k, v = (torch.from_numpy(rng.standard_normal((b, n, h, d)).astype(np.float32))
               .cuda().bfloat16() for _ in range(3))
    session, mask = session_for(geo, "blhd", method)
    mask = None if mask is None else mask.cuda()
    got = session._attend(0, q, k, v, mask, None, None).float()
    lm = method.layer_mask(geo, q.transpose(1, 2).float().cpu().numpy(),
                           k.transpose(1, 2).float().cpu().numpy())
    tokens = torch.from_numpy(np.stack([_in_model_order(lm, hh) for hh in range(h)]))[None]
    tokens = tokens.cuda()
    want = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2).float() for t in (q, k, v)), attn_mask=tokens).transpose(1, 2)
    rows = tokens.any(-1).transpose(1, 2)  # [b, n, h]: rows that select something
    err = ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-6))[rows]
    assert not torch.isnan(got[rows]).any() and float(err.max()) < 2.5e-2, float(err.max())
    session.attention = flex_attention_runner()
    flex = session._attend(0, q, k, v, mask, None, None).float()
    assert relative_difference(flex[rows], got[rows]) < 1e-2


@pytest.mark.parametrize("method", [M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)),
                                    M.TopKCubes(cube=(1, 2, 2), density=0.1)],
                         ids=["sliding_tile", "topk_cubes"])
def test_a_captured_forward_replays_on_new_inputs(method):
    """A whole transformer forward captured into a CUDA graph after a warm-up forward, replayed
    on new inputs: each replay equals an eager forward on those inputs -- with sliding tiles (a
    fixed mask, planned once), and with top-k cubes, whose masks the replay makes anew from
    the new q and k in every layer (the pooled top-k kernels: no library call) and plans on
    the GPU."""
    model = models.build("wan-1.3b", tiny=True)
    x = models.inputs("wan-1.3b", model, tiny=True)
    session = td.enable(model, method)
    static = {k: v for k, v in x.items() if torch.is_tensor(v)}
    stream = torch.cuda.Stream()
    with torch.no_grad():
        with torch.cuda.stream(stream):
            model(**x)  # warm-up: kernels loaded, plans kept
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = model(**x)[0]
        for seed in (1, 2):
            fresh = models.inputs("wan-1.3b", model, tiny=True, seed=seed)
            for key, t in static.items():
                t.copy_(fresh[key])
            graph.replay()
            torch.cuda.synchronize()
            eager = model(**fresh)[0]
            assert relative_difference(out, eager) < 1e-2, relative_difference(out, eager)
    assert session.stats.sparse_calls > 0


@pytest.mark.parametrize("keep_order", [False, True])
@pytest.mark.parametrize("method", [M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)),
                                    M.TopKCubes(topk=4)], ids=lambda m: m.name)
@pytest.mark.parametrize("name", NAMES)
def test_compiled_blocks_equal_the_eager_forward(name, method, keep_order):
    """The blocks torch.compile'd whole (fullgraph=True: the routed call is one op in each
    block's graph) on the GPU kernels: over three new inputs, with the first step dense, each
    forward equals the eager one to bf16 rounding (inductor fuses the model's own elementwise
    work differently) and every sparse call ran."""
    model, twin = (models.build(name, tiny=True) for _ in range(2))  # (the same weights)
    xs = [models.inputs(name, model, tiny=True, seed=i, text_valid=10, timestep=900 - 100 * i)
          for i in range(3)]  # (three steps: the timestep falls)
    torch._dynamo.reset()
    with torch.no_grad():
        # compiled first, on a fresh session: nothing made eagerly before the trace
        s = td.enable(model, method, schedule=M.Schedule(dense_steps=1), keep_order=keep_order)
        td.compile_blocks(model, fullgraph=True)
        got = [model(**x)[0] for x in xs]
        td.enable(twin, method, schedule=M.Schedule(dense_steps=1), keep_order=keep_order)
        eager = [twin(**x)[0] for x in xs]
    n = len(td.self_attention_layers(model))
    assert (s.stats.sparse_calls, s.stats.dense_calls) == (2 * n, n)
    for g, e in zip(got, eager):
        assert not torch.isnan(g).any()
        assert relative_difference(g, e) < 2e-2, relative_difference(g, e)
    torch._dynamo.reset()


def _cp_ranks(rank, world, port, ring, ulysses, results):
    """One rank of a tiny Wan under diffusers' own context parallelism, Tessera enabled."""
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    try:
        torch.manual_seed(0)
        model = models.build("wan-1.3b", tiny=True)
        x = models.inputs("wan-1.3b", model, tiny=True)
        model.enable_parallelism(config=ContextParallelConfig(ring_degree=ring,
                                                              ulysses_degree=ulysses))
        session = td.enable(model, M.Radial(block=16))
        with torch.no_grad():
            out = model(**x)[0]
        results[rank] = (out.float().cpu().numpy(), session.stats.sparse_calls)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ring,ulysses", [(1, 2), (2, 1)])
def test_diffusers_context_parallelism_equals_one_gpu(ring, ulysses):
    """Wan under diffusers' context parallelism (its hooks shard the sequence; Tessera's
    sequence-parallel attention runs each layer over the group): every rank's output equals
    the one-GPU forward with Tessera (bf16 tolerance), every layer routed."""
    import socket

    import torch.multiprocessing as mp

    world = ring * ulysses
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    torch.manual_seed(0)
    model = models.build("wan-1.3b", tiny=True)
    x = models.inputs("wan-1.3b", model, tiny=True)
    td.enable(model, M.Radial(block=16))
    with torch.no_grad():
        want = model(**x)[0].float().cpu().numpy()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_cp_ranks, args=(world, port, ring, ulysses, results), nprocs=world,
                 join=True)
        results = dict(results)
    layers = len(td.self_attention_layers(model))
    for r in range(world):
        got, calls = results[r]
        assert calls == layers
        assert relative_difference(torch.from_numpy(got), torch.from_numpy(want)) < 2e-2, r


@pytest.mark.parametrize("name", list(PUBLISHED_LAYERS))
def test_every_family_at_its_published_size(name):
    """The published widths, latent grid and text slots (with a 100-token prompt): every
    self-attention call reaches Tessera with the layout the model's inputs give -- joint text
    and its padding read from the call -- and a mask of every pair gives the model's own
    output within bf16 rounding."""
    model = models.build(name, overrides=PUBLISHED_LAYERS[name])
    x = models.inputs(name, model, text_valid=PROMPT)
    with torch.no_grad():
        own = model(**x)[0].float()
        s = td.enable(model, M.TopKCubes(density=1.0))
        got = model(**x)[0].float()
    assert s.stats.sparse_calls == len(td.self_attention_layers(model))
    assert s.stats.unrouted_calls == 0
    geos = {g for found in s._geometry_reads.values() for g in found}
    texts = {(g.text_tokens, g.text_valid) for g in geos}
    spec = models.MODELS[name]
    want = {"hunyuan": (spec.text, PROMPT), "hunyuan-1.5": (spec.text + 256 + 729, PROMPT),
            "mochi": (PROMPT, None), "cogvideox-5b": (spec.text, None)}.get(name, (0, None))
    assert texts == {want}, texts
    assert {g.latent for g in geos} == {_grid(name, model)}
    assert not torch.isnan(got).any() and relative_difference(got, own) < 2e-2


def _grid(name: str, model) -> tuple:
    from tessera.integrations.video_models import _patch

    f, h, w = models.MODELS[name].latent
    pt, ph, pw = _patch(model.config)
    return f // pt, h // ph, w // pw



def test_a_fine_tuning_step_on_the_gpu_backpropagates_through_tessera():
    """loss.backward() through a Wan transformer with Tessera enabled on the GPU (bf16, the
    backward kernels): with a mask of every pair the query projections' gradients match the
    model's own attention's within bf16 rounding; with a sparse top-k mask a LoRA-style step
    (only the query projections train) changes the loss."""
    from tests.integrations.test_diffusers import _full

    model = models.build("wan-1.3b", tiny=True)
    x = models.inputs("wan-1.3b", model, tiny=True)
    layers = td.self_attention_layers(model)
    weights = [a.to_q.weight for a in layers]

    def grads():
        model.zero_grad()
        loss = model(**x)[0].float().square().mean()
        loss.backward()
        return loss.detach(), [w.grad.float().clone() for w in weights]

    _, own = grads()
    s = td.enable(model, _full("wan-1.3b"))
    _, got = grads()
    assert s.stats.sparse_calls == len(layers)
    for g, o in zip(got, own):
        assert torch.isfinite(g).all()
        assert float((g - o).norm() / o.norm()) < 3e-2
    td.enable(model, M.TopKCubes(topk=2))
    before, sparse = grads()
    assert all(bool(g.abs().sum() > 0) for g in sparse)
    with torch.no_grad():
        for w, g in zip(weights, sparse):
            w -= (1e-2 * g / g.norm()).to(w.dtype)
        after = model(**x)[0].float().square().mean()
    assert not torch.equal(after, before)


class _DrawnTopK(M.TopKCubes):
    """Top-k cubes, a device mask made every call, from q- and k-shaped scores drawn from a
    fixed seed instead of q and k themselves: the compiled and the eager step then take the
    same masks (their q and k differ by rounding, enough to flip near-tied cubes of a mask made
    from them)."""

    def _family_mask(self, geo, q, k, ordered):
        import cupy as cp

        rs = cp.random.RandomState(0)
        drawn = [rs.standard_normal(tuple(x.shape), dtype=cp.float32) for x in (q, k)]
        return super()._family_mask(geo, *drawn, ordered)


@pytest.mark.parametrize("method", [M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)),
                                    _DrawnTopK(topk=2)], ids=["sliding-tile", "top-k"])
def test_a_compiled_fine_tuning_step_on_the_gpu_equals_the_eager_one(method):
    """Blocks compiled whole (fullgraph) on the GPU, autograd recording: the routed op's
    gradient (the call recomputed with autograd: Tessera's forward, then its backward kernels)
    gives the eager step's query-projection gradients, bf16, with a fixed host mask (sliding
    tile: a kept plan) and a mask made every call (top-k: a device mask)."""
    (got, s), (want, e) = compiled_and_eager_query_grads(method, {}, {})
    assert s.stats.sparse_calls == e.stats.sparse_calls == len(got)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all() and bool(w.abs().sum() > 0)
        assert float((g - w).norm() / w.norm()) < 2e-2
    torch._dynamo.reset()
