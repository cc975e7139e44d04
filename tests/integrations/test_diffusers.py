"""CPU tests of the diffusers integration (tessera.integrations.diffusers) on tiny versions of
each supported transformer: routing, text tokens, schedules, enable/disable. On CPU tensors the
integration runs the float64 reference, so these test the glue, not the kernels (the GPU tests
in tests/gpu/test_gpu_diffusers.py do). Skipped without torch and diffusers."""

from __future__ import annotations

import inspect
import types
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import tessera  # noqa: E402
from tessera.integrations import diffusers as td  # noqa: E402
from tessera.integrations import methods as M  # noqa: E402
from tessera.tools import models  # noqa: E402
from tests.integrations.test_methods import _in_model_order  # noqa: E402

# The models with a family that keeps the method's order across blocks (keep_order) ...
NAMES = ["wan-1.3b", "hunyuan", "cogvideox-5b"]
# ... and every family's model.
FAMILY_NAMES = NAMES + ["wan-vace-1.3b", "skyreels-v2-1.3b", "hunyuan-1.5", "mochi", "cosmos-7b",
                        "ltx-video", "ltx-2"]


@pytest.fixture(autouse=True)
def _clean():
    yield
    for s in list(td._sessions.values()):
        s.disable()


def _model(name, **kw):
    m = models.build(name, tiny=True, device="cpu", dtype=torch.float32)
    return m, models.inputs(name, m, tiny=True, **kw)


def _layers(model) -> int:
    return len(td.self_attention_layers(model))


def _full(name) -> M.Method:
    """A method whose mask selects every pair (a window over the whole tile grid)."""
    return M.SlidingTile(tile=(2, 4, 4), window=(9, 9, 9))


def session_for(geo: M.VideoGeometry, layout: str, method: M.Method):
    """A session (no transformer) inside a forward over ``geo``'s video, and the key mask a
    call over ``geo``'s tokens gets (None: no text padding)."""
    family = td.Family("test", (), None, None, text="before" if geo.text_first else "after")
    session = td.Session(None, family, method, M.Schedule())
    session._routes = [td._Route("test", "dispatch" if layout == "blhd" else "sdpa")]
    session._latent, session._seen = geo.latent, True
    if geo.text_valid is None:
        return session, None
    keys = torch.ones(1, 1, 1, geo.tokens, dtype=torch.bool)
    keys[..., geo.video_tokens + geo.text_valid:] = False
    return session, keys


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_an_all_ones_mask_equals_the_models_own_attention(name):
    """Every self-attention layer routed (one Tessera call per layer per forward -- fails if
    diffusers moves the function its processors call), with tokens reordered into tiles and
    back: the output equals the model's own to float32 rounding."""
    model, x = _model(name, text_valid=10)
    with torch.no_grad():
        own = model(**x)[0]
        s = td.enable(model, _full(name))
        got = model(**x)[0]
    assert s.stats.sparse_calls == _layers(model) and s.stats.dense_calls == 0
    assert torch.allclose(got, own, atol=2e-5, rtol=1e-4), (got - own).abs().max()


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_disable_restores_the_model_bit_for_bit(name):
    """enable -> disable: the same processors, the diffusers module's own attention function,
    and outputs equal to the last bit."""
    import importlib

    model, x = _model(name)
    layers = td.self_attention_layers(model)
    mod = importlib.import_module(td._route_of(layers[0].processor).module)
    before = (mod.__dict__.get("dispatch_attention_fn"), mod.__dict__.get("F"))
    procs = [a.processor for a in layers]
    with torch.no_grad():
        own = model(**x)[0]
        td.enable(model, M.TopKCubes(topk=2))
        assert not torch.equal(model(**x)[0], own)  # the sparse mask changes the output
        td.disable(model)
        again = model(**x)[0]
    assert torch.equal(again, own)
    assert [a.processor for a in td.self_attention_layers(model)] == procs
    assert (mod.__dict__.get("dispatch_attention_fn"), mod.__dict__.get("F")) == before
    assert td.session_of(model) is None


def test_the_schedule_keeps_steps_and_layers_dense():
    """dense_steps=1 with two forwards a step: the first two forwards are the model's own
    (bit for bit), the third is sparse except its first dense_layers layer."""
    model, x = _model("wan-1.3b")
    with torch.no_grad():
        own = model(**x)[0]
        s = td.enable(model, M.TopKCubes(topk=2), schedule=M.Schedule(dense_steps=1,
                                                                     dense_layers=1),
                      forwards_per_step=2)
        first, second = model(**x)[0], model(**x)[0]
        assert torch.equal(first, own) and torch.equal(second, own) and s.step == 0
        assert s.stats.dense_calls == 2 * _layers(model) and s.stats.sparse_calls == 0
        third = model(**x)[0]
        assert s.step == 1 and s.stats.sparse_calls == _layers(model) - 1
        assert not torch.equal(third, own)
        s.reset()
        assert torch.equal(model(**x)[0], own)


def test_steps_come_from_the_timesteps():
    """No forwards_per_step: the same timestep is the same step (guidance's second forward), a
    lower one the next, a higher one a new video (its dense steps again, no reset); with the
    pipeline's scheduler, a timestep's place in its timesteps is the step, so a transformer that
    first sees the schedule's middle (Wan 2.2's second expert) is at the middle step."""
    model, _ = _model("wan-1.3b")
    n = _layers(model)
    x = {t: models.inputs("wan-1.3b", model, tiny=True, timestep=t) for t in (900, 800, 700)}
    with torch.no_grad():
        s = td.enable(model, M.TopKCubes(topk=2), schedule=M.Schedule(dense_steps=1))
        steps = []
        for t in (900, 900, 800, 800, 700, 900):
            model(**x[t])
            steps.append(s.step)
        assert steps == [0, 0, 1, 1, 2, 0]
        assert (s.stats.dense_calls, s.stats.sparse_calls) == (3 * n, 3 * n)
        schedule = types.SimpleNamespace(timesteps=torch.tensor([900, 850, 800, 700]))
        s = td.enable(model, M.TopKCubes(topk=2), schedule=M.Schedule(dense_steps=2),
                      scheduler=schedule)
        model(**x[800])
        assert s.step == 2 and (s.stats.dense_calls, s.stats.sparse_calls) == (0, n)
        model(**x[900])
        assert s.step == 0 and s.stats.dense_calls == n
    with pytest.raises(TypeError, match="scheduler must be the pipeline's scheduler"):
        td.enable(model, M.Radial(), scheduler=object())


def test_sparse_switches_a_pipelines_transformers_for_a_block():
    """``with td.sparse(pipe, method)``: both transformers of a two-expert pipeline run Tessera
    with the pipeline's scheduler placing the steps, and their own attention after the block,
    bit for bit -- also when the block raises."""
    model, x = _model("wan-1.3b")
    twin = models.build("wan-1.3b", tiny=True, device="cpu", dtype=torch.float32)
    pipe = types.SimpleNamespace(transformer=model, transformer_2=twin,
                                 scheduler=types.SimpleNamespace(timesteps=torch.tensor(
                                     [900, 700, 500, 300])))
    n = _layers(model)
    with torch.no_grad():
        own = model(**x)[0]
        with td.sparse(pipe, M.TopKCubes(topk=2), schedule=M.Schedule(dense_steps=2)) as (a, b):
            sparse = model(**x)[0]  # timestep 500: step 2, sparse
            twin(**x)
            assert (a.step, b.step) == (2, 2) and a.scheduler is pipe.scheduler
            assert a.stats.sparse_calls == b.stats.sparse_calls == n
        assert not torch.equal(sparse, own) and torch.equal(model(**x)[0], own)
        assert td.session_of(model) is None and td.session_of(twin) is None
        with pytest.raises(RuntimeError, match="inside"):
            with td.sparse(model, M.Radial()):
                raise RuntimeError("inside")
        assert td.session_of(model) is None


def test_a_forward_that_routes_no_call_warns_once():
    """Processors replaced after enable: the forward runs without Tessera, which says so once."""
    model, x = _model("wan-1.3b")
    with torch.no_grad():
        s = td.enable(model, M.Radial())
        for attn, original in s._originals:
            attn.set_processor(original)
        with pytest.warns(UserWarning, match="routed no self-attention call through it"):
            model(**x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model(**x)  # (once)


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("geo", [M.VideoGeometry((5, 6, 10)),
                                 M.VideoGeometry((5, 6, 10), 12, 7),
                                 M.VideoGeometry((5, 6, 10), 12, None, text_first=True)],
                         ids=str)
@pytest.mark.parametrize("method", [M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)),
                                    M.SpatialTemporal(block=32, heads=["spatial", "temporal"]),
                                    M.Radial(block=32), M.TopKCubes(topk=3),
                                    M.SemanticClusters(q_clusters=6, kv_clusters=8)],
                         ids=lambda m: m.name)
def test_each_method_equals_sdpa_with_its_token_mask(method, geo, layout):
    """One routed call (orders applied, Tessera run, order undone) equals torch's SDPA over the
    original tokens with the method's mask as a token-level boolean mask."""
    rng = np.random.default_rng(0)
    b, h, n, d = 1, 2, geo.tokens, 16
    q, k, v = (torch.from_numpy(rng.standard_normal((b, h, n, d)).astype(np.float32))
               for _ in range(3))
    session, mask = session_for(geo, layout, method)
    lay = (lambda t: t.transpose(1, 2).contiguous()) if layout == "blhd" else (lambda t: t)
    got = session._attend(0, lay(q), lay(k), lay(v), mask, None, None)
    got = got.transpose(1, 2) if layout == "blhd" else got
    qn, kn = q.numpy(), k.numpy()
    lm = method.layer_mask(geo, qn, kn)
    tokens = torch.from_numpy(np.stack([_in_model_order(lm, hh) for hh in range(h)]))[None]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=tokens)
    valid = tokens.any(-1, keepdim=True)  # rows with no key: zero in Tessera, NaN in SDPA
    assert torch.allclose(torch.where(valid, got, 0), torch.where(valid, want, 0), atol=1e-5)


@pytest.mark.parametrize("name", ["hunyuan", "mochi"])
def test_prompts_of_different_lengths_in_one_batch(name):
    """Two prompts of different lengths (classifier-free guidance) give the video output of
    the model's own attention. HunyuanVideo pads them in one call: one geometry per prompt,
    its valid text read from the call's mask. Mochi attends each element's prompt in a call of
    its own: each call's length gives its text."""
    model, _ = _model(name)
    x = models.inputs(name, model, tiny=True, batch=2)
    x["encoder_attention_mask"][0, 7:] = 0
    x["encoder_attention_mask"][1, 15:] = 0
    with torch.no_grad():
        own = model(**x)[0]
        s = td.enable(model, _full(name))
        got = model(**x)[0]
    reads = list(s._geometry_reads.values())
    if name == "hunyuan":
        assert [[g.text_valid for g in geos] for geos in reads] == [[7, 15]]
    else:
        assert sorted(g.text_tokens for geos in reads for g in geos) == [7, 15]
        assert s.stats.sparse_calls == 2 * _layers(model)
    assert torch.allclose(got, own, atol=2e-5, rtol=1e-4)


def test_image_to_video_variants_route_their_self_attention():
    """Wan's image-to-video transformer (image tokens by cross-attention) and HunyuanVideo 1.5
    with an image (its image tokens joint with the text, valid before the prompt's): every
    self-attention routed, the output the model's own."""
    wan = models.build("wan-1.3b", tiny=True, device="cpu", dtype=torch.float32,
                       overrides=dict(image_dim=16, added_kv_proj_dim=128))
    x = models.inputs("wan-1.3b", wan, tiny=True)
    x["encoder_hidden_states_image"] = torch.randn(1, 9, 16)
    hy, _ = _model("hunyuan-1.5")
    y = models.inputs("hunyuan-1.5", hy, tiny=True, text_valid=10)
    y["image_embeds"] = torch.randn_like(y["image_embeds"])
    for model, inputs, valid in ((wan, x, None), (hy, y, 19)):
        with torch.no_grad():
            own = model(**inputs)[0]
            s = td.enable(model, _full(""))
            got = model(**inputs)[0]
            td.disable(model)
        assert s.stats.sparse_calls == _layers(model) and s.stats.unrouted_calls == 0
        assert {g.text_valid for geos in s._geometry_reads.values() for g in geos} == {valid}
        assert torch.allclose(got, own, atol=2e-5, rtol=1e-4), (got - own).abs().max()


def test_a_subclass_is_routed_as_its_family():
    """A transformer class derived from a family's class (a user's, or a newer diffusers'
    variant) is routed as that family, and a processor subclass that keeps its base's call
    through its base's module."""
    import diffusers

    class MyWan(diffusers.WanTransformer3DModel):
        pass

    model, x = _model("wan-1.3b")
    model.__class__ = MyWan
    assert td.family_of(model).name == "Wan 2.1 / 2.2"
    processor = td.self_attention_layers(model)[0].processor

    class MyProcessor(type(processor)):  # a processor subclass: its base's module routes it
        pass

    td.self_attention_layers(model)[0].set_processor(MyProcessor())
    with torch.no_grad():
        s = td.enable(model, _full("wan-1.3b"))
        model(**x)
    assert s.stats.sparse_calls == _layers(model)


def test_calls_tessera_cannot_run_stay_the_models_own():
    """LTX-2 with a video self-attention mask (weights between 0 and 1, as its IC-LoRA
    pipeline passes): no block mask says it, so every such call is the model's own -- counted,
    not routed -- and the output is the model's, bit for bit; the audio stream's attention is
    never seen."""
    model, x = _model("ltx-2")
    n = x["hidden_states"].shape[1]
    x["video_self_attention_mask"] = torch.rand(1, n, n, generator=torch.Generator()
                                                .manual_seed(3))
    with torch.no_grad():
        own = model(**x)[0]
        s = td.enable(model, M.TopKCubes(topk=2))
        with pytest.warns(UserWarning, match="left every self-attention call of its forward"):
            got = model(**x)[0]
    assert (s.stats.sparse_calls, s.stats.unrouted_calls) == (0, _layers(model))
    assert torch.equal(got, own)


def test_the_routers_pass_every_other_call_on_as_made():
    """A routed module's attention function, called with a keyword Tessera does not take (or
    dropout, or causality) inside a marked call, reaches the original with every argument
    as given; unmarked calls always do."""
    got = []

    def original(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                 scale=None, future=None, **extra):
        got.append(dict(dropout_p=dropout_p, is_causal=is_causal, future=future, **extra))
        return "own"

    router = td._dispatch_router(original)
    q = torch.zeros(1, 4, 1, 8)
    assert router(q, q, q, future="x") == "own"  # unmarked
    td._calls.append(td._Mark(0, torch.tensor(0)))
    try:
        assert router(q, q, q, future="x") == "own"
        assert router(q, q, q, dropout_p=0.1) == "own"
        assert router(q, q, q, is_causal=True, other=3) == "own"
    finally:
        td._calls.pop()
    assert got == [dict(dropout_p=0.0, is_causal=False, future="x"),
                   dict(dropout_p=0.0, is_causal=False, future="x"),
                   dict(dropout_p=0.1, is_causal=False, future=None),
                   dict(dropout_p=0.0, is_causal=True, future=None, other=3)]
    assert inspect.signature(router) == inspect.signature(original)  # (functools.wraps)


def test_enable_checks_the_diffusers_version_and_the_processors(monkeypatch):
    """A diffusers release outside the tested range warns once; a processor that calls neither
    attention function Tessera routes is refused by name, before anything changes; keep_order
    on a family that keeps no order across blocks is refused."""
    import diffusers

    model, x = _model("wan-1.3b")
    monkeypatch.setattr(diffusers, "__version__", "0.99.0")
    monkeypatch.setattr(td, "_warned_version", False)
    with pytest.warns(UserWarning, match="diffusers 0.99.0 is outside the releases .*0.41"):
        td.enable(model, M.Radial())
    td.disable(model)

    class OwnProcessor:
        def __call__(self, attn, hidden_states, *args, **kwargs):
            return hidden_states

    layers = td.self_attention_layers(model)
    layers[1].set_processor(OwnProcessor())
    before = [a.processor for a in layers]
    with pytest.raises(TypeError, match="attention processor OwnProcessor .* calls neither"):
        td.enable(model, M.Radial())
    assert [a.processor for a in layers] == before and td.session_of(model) is None
    ltx, _ = _model("ltx-video")
    with pytest.raises(ValueError, match="keep_order=True is supported for Wan .*LTX-Video"):
        td.enable(ltx, M.Radial(), keep_order=True)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_a_fine_tuning_step_on_the_cpu_backpropagates_through_tessera(name):
    """loss.backward() through a transformer with Tessera enabled (every self-attention layer
    routed, the CPU's float64 backward pass): with a mask of every pair the gradients of the
    attention projections equal those of the model's own attention; with a sparse top-k mask
    a LoRA-style step (only the query projections train) changes the loss."""
    model, x = _model(name, text_valid=10)
    layers = td.self_attention_layers(model)
    weights = [a.to_q.weight for a in layers]

    def grads():
        model.zero_grad()
        loss = model(**x)[0].square().mean()
        loss.backward()
        return loss.detach(), [w.grad.clone() for w in weights]

    _, own = grads()
    s = td.enable(model, _full(name))
    _, got = grads()
    assert s.stats.sparse_calls == len(layers)
    for g, o in zip(got, own):
        assert torch.allclose(g, o, atol=1e-6, rtol=1e-4), (g - o).abs().max()
    td.enable(model, M.TopKCubes(topk=2))
    before, sparse = grads()
    assert all(bool(g.abs().sum() > 0) for g in sparse)
    with torch.no_grad():
        for w, g in zip(weights, sparse):
            w -= 1e-2 * g / g.norm()
    after = model(**x)[0].square().mean().detach()
    assert not torch.equal(after, before)


def test_a_preset_runs_as_its_docstring_shows():
    """A published setting (presets) on a pipeline: the radial preset for Wan keeps its first
    12 steps dense, then the first layer of every step."""
    from tessera.integrations import presets

    model, _ = _model("wan-1.3b")
    n = _layers(model)
    pipe = types.SimpleNamespace(transformer=model, scheduler=types.SimpleNamespace(
        timesteps=torch.arange(1000, 0, -20)))  # 50 steps
    method, schedule = presets.get("wan-14b-768p-radial").arguments()
    with torch.no_grad(), td.sparse(pipe, method, schedule=schedule) as (s,):
        model(**models.inputs("wan-1.3b", model, tiny=True, timestep=980))  # step 1
        assert (s.stats.dense_calls, s.stats.sparse_calls) == (n, 0)
        model(**models.inputs("wan-1.3b", model, tiny=True, timestep=500))  # step 25
    assert (s.stats.dense_calls, s.stats.sparse_calls) == (n + 1, n - 1)


def test_a_calls_mask_is_read_only_where_it_marks_text_padding():
    """What decides a call's route: a key-padding mask (booleans, or an additive 0 / -inf or
    -10000 bias) gives each batch element's prompt tokens; a per-query mask reads at a video
    query's row only for a family whose masks are valid-by-valid (HunyuanVideo 1.5); a mask
    with weights, per-head rows, another length, a masked video key or padding before text
    leaves the call to the model (None)."""
    n, text, length = 6, 4, 10  # 6 video tokens, then 4 text slots
    keys = torch.ones(2, length, dtype=torch.bool)
    keys[0, n + 3:] = False  # 3 prompt tokens
    keys[1, n + 1:] = False  # 1
    read = td._allowed_keys(keys[:, None, None, :], 2, length, "keys")
    assert td._valid_text(read, n, text, False) == [3, 1]
    bias = torch.where(keys, 0.0, float("-inf"))[:, None, :]  # [B, 1, L]
    assert td._valid_text(td._allowed_keys(bias, 2, length, "keys"), n, text, False) == [3, 1]
    ltx = (1 - keys.float()) * -10000.0
    assert td._valid_text(td._allowed_keys(ltx, 2, length, "keys"), n, text, False) == [3, 1]
    weights = torch.zeros(2, length)
    weights[0, 2] = -0.5  # a key weighed, not dropped
    assert td._allowed_keys(weights, 2, length, "keys") is None
    outer = (keys[:, :, None] & keys[:, None, :])[:, None]  # [B, 1, L, L]: valid x valid
    assert td._allowed_keys(outer, 2, length, "keys") is None  # a per-query mask
    assert td._valid_text(td._allowed_keys(outer, 2, length, "outer"), n, text,
                          False) == [3, 1]
    per_head = keys[:, None, None, :].expand(2, 3, 1, length)
    assert td._allowed_keys(per_head, 2, length, "keys") is None
    assert td._allowed_keys(keys, 2, length + 1, "keys") is None
    holes = torch.ones(1, length, dtype=torch.bool)
    holes[0, 2] = False  # a video key masked
    assert td._valid_text(holes.numpy(), n, text, False) is None
    gap = torch.ones(1, length, dtype=torch.bool)
    gap[0, n + 1] = False  # padding before a prompt token
    assert td._valid_text(gap.numpy(), n, text, False) is None
    first = torch.zeros(1, length, dtype=torch.bool)
    first[0, :2] = first[0, text:] = True  # text first: 2 prompt tokens, then the video
    assert td._valid_text(first.numpy(), n, text, True) == [2]
    assert td._valid_text(torch.ones(1, length, dtype=torch.bool).numpy(), n, text,
                          False) == [None]


@pytest.mark.parametrize("keep_order", [False, True])
def test_a_deep_copy_gets_a_session_of_its_own(keep_order):
    """copy.deepcopy of an enabled transformer: at its first forward the copy gets a session
    of its own with the same settings (the original's counts untouched, its output the
    original's), and disabling either leaves the other enabled."""
    import copy

    model, x = _model("wan-1.3b")
    n = _layers(model)
    s = td.enable(model, M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)), keep_order=keep_order,
                  schedule=M.Schedule(dense_layers=1))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        got = twin(**x)[0]
        assert s.stats.forwards == 0 and td.session_of(twin) is not s
        want = model(**x)[0]
    mine = td.session_of(twin)
    assert (mine.stats.forwards, mine.stats.sparse_calls, mine.stats.dense_calls) == (1, n - 1, 1)
    assert mine.keep_order == keep_order and mine.schedule == s.schedule
    assert (s.stats.forwards, s.stats.sparse_calls) == (1, n - 1)
    assert torch.equal(got, want)
    td.disable(twin)
    assert not isinstance(td.self_attention_layers(twin)[0].processor, td._Routed)
    assert td.session_of(model) is s
    with torch.no_grad():
        model(**x)
    assert s.stats.forwards == 2


def test_bad_arguments_are_refused_by_name():
    model, _ = _model("wan-1.3b")
    with pytest.raises(TypeError, match="transformer must be a diffusers video transformer of "
                                        "a family .*Wan 2.1.*got Linear"):
        td.enable(torch.nn.Linear(2, 2), M.Radial())
    with pytest.raises(TypeError, match="method must be a tessera.integrations.methods.Method"):
        td.enable(model, "sliding_tile")
    with pytest.raises(ValueError, match="forwards_per_step must be None .* or an int >= 1"):
        td.enable(model, M.Radial(), forwards_per_step=0)
    with pytest.raises(TypeError, match="schedule must be a tessera.integrations.methods"):
        td.enable(model, M.Radial(), schedule=3)
    with pytest.raises(TypeError, match="keep_order must be True or False"):
        td.enable(model, M.Radial(), keep_order="yes")
    assert td.session_of(model) is None  # nothing left half-enabled


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("method", [M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)),
                                    M.TopKCubes(topk=3)], ids=lambda m: m.name)
def test_tokens_kept_in_the_method_order_for_the_whole_forward(name, method):
    """keep_order: the tokens are reordered once (first block in, last block out) and every
    attention call sees them already in the method's order -- no per-call reordering -- and
    the output equals the per-call reordering's (float32 rounding)."""
    model, x = _model(name, text_valid=10)
    seen = []
    with torch.no_grad():
        td.enable(model, method)
        per_call = model(**x)[0]
        s = td.enable(model, method, keep_order=True)
        attend = s._attend
        s._attend = lambda *a: seen.append(s._ordered) or attend(*a)
        kept = model(**x)[0]
    assert seen == [True] * _layers(model)
    assert not s._ordered  # back in the model's order after the last block
    assert torch.allclose(kept, per_call, atol=2e-5, rtol=1e-4), (kept - per_call).abs().max()


def test_per_token_timesteps_follow_the_order():
    """Wan 2.2's per-token time embedding (a timestep per token) is reordered with the tokens:
    the output equals the per-call reordering's."""
    model, x = _model("wan-1.3b")
    f, h, w = models.MODELS["wan-1.3b"].tiny_latent
    n = f * (h // 2) * (w // 2)
    x["timestep"] = torch.linspace(0, 999, n).round().long()[None]
    with torch.no_grad():
        td.enable(model, M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)))
        per_call = model(**x)[0]
        td.enable(model, M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)), keep_order=True)
        kept = model(**x)[0]
    assert torch.allclose(kept, per_call, atol=2e-5, rtol=1e-4)


def _cp_worker(rank, world, port, ring, ulysses, results):
    """One rank of diffusers' context parallelism, as its hooks hand the attention this rank's
    shard: the router gets q/k/v shards and a ParallelConfig whose context-parallel group is
    the gloo world (diffusers' own mesh set-up needs GPUs)."""
    import importlib
    import types

    import torch.distributed as dist

    from tessera.integrations import distributed as D

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        model, x = _model("wan-1.3b")
        session = td.enable(model, M.Radial(block=16))
        session._before_forward(model, (), x)  # the transformer's inputs set the layout
        geo = M.VideoGeometry(session._latent)
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(1, geo.tokens, 4, 16, generator=g, dtype=torch.float64)
                   for _ in range(3))
        lo, hi = D.shard_ranges(geo.tokens, world)[rank]
        cp = types.SimpleNamespace(ring_degree=ring, ulysses_degree=ulysses,
                                   _flattened_mesh=types.SimpleNamespace(get_group=lambda: None))
        config = types.SimpleNamespace(context_parallel_config=cp)
        mod = importlib.import_module("diffusers.models.transformers.transformer_wan")
        td._calls.append(td._Mark(id(model), torch.tensor(1)))
        try:
            out = mod.dispatch_attention_fn(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi],
                                            parallel_config=config)
            whole = session._attend(1, q, k, v, None, None, lambda: None)
        finally:
            td._calls.pop()
        results[rank] = (out.numpy(), whole[:, lo:hi].numpy(), session.stats.sparse_calls)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ring,ulysses", [(1, 2), (2, 1), (1, 3)])
def test_context_parallel_shards_equal_the_whole_sequence(ring, ulysses):
    """diffusers' context parallelism (Wan's): each rank's routed call with its sequence shard
    gives that shard of the whole sequence's output -- Ulysses (ring_degree 1) and the ring
    (ulysses_degree 1) over gloo ranks, the method's fixed mask over the whole sequence."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    world = ring * ulysses
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_cp_worker, args=(world, port, ring, ulysses, results), nprocs=world,
                 join=True)
        results = dict(results)
    for r in range(world):
        got, want, calls = results[r]
        assert got.shape == want.shape and calls == 2
        assert np.abs(got - want).max() < 1e-6, r  # (the ring merges in float32)


def test_context_parallel_refuses_what_shards_cannot_run():
    """Under context parallelism a rank holds a contiguous shard in the model's order: a mask
    made from q and k, or one in another token order, is refused by name (also by the router,
    before anything moves); tensor parallelism alone leaves the model's own attention in
    place."""
    import types

    geo = M.VideoGeometry((4, 6, 8))
    td.check_context_parallel(M.Radial(block=16), False, geo)  # in the model's order: fine
    with pytest.raises(ValueError, match="makes its mask from the whole sequence"):
        td.check_context_parallel(M.TopKCubes(density=0.2), False, geo)
    with pytest.raises(ValueError, match="reorders the tokens"):
        td.check_context_parallel(M.SlidingTile(tile=(2, 2, 2), window=(1, 1, 1)), False, geo)
    with pytest.raises(ValueError, match="reorders the tokens"):
        td.check_context_parallel(M.Radial(block=16), True, geo)
    model, x = _model("wan-1.3b")
    session = td.enable(model, M.Radial(block=16))
    session._before_forward(model, (), x)
    def own(query, key, value, attn_mask=None, *, parallel_config=None):
        return "the model's own"

    router = td._dispatch_router(own)
    q = torch.randn(1, int(np.prod(session._latent)), 4, 16)
    td._calls.append(td._Mark(id(model), torch.tensor(1)))
    try:
        tp_only = types.SimpleNamespace(context_parallel_config=None)
        assert router(q, q, q, parallel_config=tp_only) == "the model's own"
        cp = types.SimpleNamespace(context_parallel_config=types.SimpleNamespace(
            ring_degree=1, ulysses_degree=2, _flattened_mesh=None))
        session.method = M.SlidingTile(tile=(2, 2, 2), window=(1, 1, 1))
        with pytest.raises(ValueError, match="reorders the tokens"):
            router(q, q, q, parallel_config=cp)
    finally:
        td._calls.pop()
    assert session.stats.sparse_calls == 0


# Deeper tiny models: a compiled block that recompiled per layer would exceed the limit below.
_DEEP = {"wan-1.3b": dict(num_layers=6), "hunyuan": dict(num_layers=3, num_single_layers=3),
         "cogvideox-5b": dict(num_layers=4)}
# Compiles a block code object may take: a forward in the model's order, the first block that
# reorders, the others (keep_order); HunyuanVideo's two block kinds share the hook's code.
_COMPILES = {"wan-1.3b": 3, "hunyuan": 5, "cogvideox-5b": 3}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("keep_order", [False, True])
def test_compiled_blocks_run_the_eager_calls(name, keep_order):
    """torch.compile of every block with fullgraph=True (a graph break fails it): over three new
    inputs, with a schedule whose first step is dense, the compiled transformer's outputs equal
    the eager one's (float32 rounding), the same calls ran sparse and dense, and the blocks
    compiled a bounded number of times (_COMPILES) -- not once per layer."""
    model, twin = (models.build(name, tiny=True, device="cpu", dtype=torch.float32,
                                overrides=_DEEP[name]) for _ in range(2))  # (same weights)
    xs = [models.inputs(name, model, tiny=True, seed=i, text_valid=10, timestep=900 - 100 * i)
          for i in range(3)]  # (three steps: the timestep falls)
    method = M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3))
    torch._dynamo.reset()
    with torch.no_grad():
        # compiled first, on a fresh session: nothing made eagerly before the trace
        s = td.enable(model, method, schedule=M.Schedule(dense_steps=1), keep_order=keep_order)
        td.compile_blocks(model, fullgraph=True)
        with torch._dynamo.config.patch(recompile_limit=_COMPILES[name],
                                        fail_on_recompile_limit_hit=True):
            got = [model(**x)[0] for x in xs]
        e = td.enable(twin, method, schedule=M.Schedule(dense_steps=1), keep_order=keep_order)
        eager = [twin(**x)[0] for x in xs]
    n = _layers(model)
    assert (e.stats.sparse_calls, e.stats.dense_calls) == (2 * n, n)
    assert (s.stats.sparse_calls, s.stats.dense_calls) == (2 * n, n)
    assert not torch.allclose(eager[0], eager[1])  # (the step-0 output is dense: it differs)
    for g, e in zip(got, eager):
        assert torch.allclose(g, e, atol=2e-5, rtol=1e-4), (g - e).abs().max()
    torch._dynamo.reset()


def test_the_whole_transformer_compiled_runs_its_layout_hook_eagerly():
    """torch.compile of the whole transformer (graph breaks allowed): the forward pre-hook,
    which reads the inputs' layout on the host (HunyuanVideo's prompt lengths), runs eagerly,
    and the outputs equal the eager transformer's."""
    model, x = _model("hunyuan", text_valid=10)
    torch._dynamo.reset()
    with torch.no_grad():
        td.enable(model, M.TopKCubes(topk=3), keep_order=True)
        eager = model(**x)[0]
        compiled = torch.compile(model)
        got = compiled(**x)[0]
    assert torch.allclose(got, eager, atol=2e-5, rtol=1e-4), (got - eager).abs().max()
    torch._dynamo.reset()


def compiled_and_eager_query_grads(method: M.Method, build: dict, inputs: dict):
    """One fine-tuning step of a tiny Wan transformer with ``method`` enabled, twice from the
    same weights: blocks compiled whole (fullgraph), then eager. Each step's query-projection
    gradients (float32) with its session, (compiled, eager); ``build`` and ``inputs`` go to
    ``models.build`` and ``models.inputs``."""
    model, twin = (models.build("wan-1.3b", tiny=True, **build)
                   for _ in range(2))  # (same weights)
    x = models.inputs("wan-1.3b", model, tiny=True, **inputs)
    torch._dynamo.reset()
    s = td.enable(model, method)
    td.compile_blocks(model, fullgraph=True)
    e = td.enable(twin, method)

    def grads(m):
        m.zero_grad()
        m(**x)[0].float().square().mean().backward()
        return [a.to_q.weight.grad.float().clone() for a in td.self_attention_layers(m)]

    return (grads(model), s), (grads(twin), e)


@pytest.mark.parametrize("method", [M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)),
                                    M.TopKCubes(topk=2)], ids=["sliding-tile", "top-k"])
def test_a_compiled_fine_tuning_step_backpropagates_through_the_op(method):
    """Blocks compiled whole (fullgraph) with autograd recording: the routed call stays the
    custom op, whose gradient recomputes the call with autograd (its recomputation not counted
    in the stats); the query projections' gradients equal the eager Tessera step's."""
    (got, s), (want, e) = compiled_and_eager_query_grads(
        method, dict(device="cpu", dtype=torch.float32), dict(text_valid=10))
    n = len(got)
    assert s.stats.sparse_calls == e.stats.sparse_calls == n
    assert all(bool(w.abs().sum() > 0) for w in want)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-4), (g - w).abs().max()
    torch._dynamo.reset()


def test_compile_blocks_refuses_other_modules():
    with pytest.raises(TypeError, match="transformer must be a diffusers video transformer"):
        td.compile_blocks(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("precision", ["int8", "int8-qk"])
def test_the_8bit_forward_through_a_transformer(precision):
    """An 8-bit precision routes every sparse call through its 8-bit forward (on the CPU its
    arithmetic, by the emulator): the output moves off the 16-bit one by the scheme's rounding,
    no further; bad settings are refused by name before anything is enabled."""
    model, x = _model("wan-1.3b")
    method = M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3))
    with torch.no_grad():
        td.enable(model, method)
        own = model(**x)[0]
        s = td.enable(model, method, precision=precision)
        got = model(**x)[0]
    assert s.stats.sparse_calls == _layers(model) and s.precision == precision
    rel = float((got - own).norm() / own.norm())
    assert 0 < rel < 3e-2, rel
    td.disable(model)
    with pytest.raises(ValueError, match=r"precision must be one of \(None, 'int8', 'int8-qk'\)"):
        td.enable(model, method, precision="fp8")
    with pytest.raises(ValueError, match=f"regime must be None with precision='{precision}'"):
        td.enable(model, method, precision=precision, regime=tessera.INT8_REGIME)
    assert td.session_of(model) is None
