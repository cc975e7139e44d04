"""CPU tests of the method configurations (tessera.integrations.methods): every method's mask,
taken back to the model's own token order, against a token-level construction; text before or
after the video, with padding slots; the orders and their inverses; schedules."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import families
from tessera.integrations import methods as M

LATENT = (5, 6, 7)  # 210 video tokens: partial tiles and cubes on every axis


def _tokens(mask, b=0, h=0) -> np.ndarray:
    """The token-level matrix of one (batch, head) of a host BlockMask."""
    d = np.asarray(mask.to_host().to_dense())
    d = d[min(b, d.shape[0] - 1), min(h, d.shape[1] - 1)]
    rq, rk = np.diff(mask.q_bounds), np.diff(mask.kv_bounds)
    return np.repeat(np.repeat(d, rq, axis=0), rk, axis=1)


def _placed(t: np.ndarray, rows, cols) -> np.ndarray:
    """Token matrix ``t`` with its row ``i`` moved to ``rows[i]`` and column ``j`` to
    ``cols[j]`` (None: where it is)."""
    n = t.shape[0]
    out = np.zeros_like(t)
    out[np.ix_(np.arange(n) if rows is None else rows,
               np.arange(n) if cols is None else cols)] = t
    return out


def _in_model_order(lm: M.LayerMask, h=0) -> np.ndarray:
    """The LayerMask's token matrix with rows and columns back in the model's sequence order."""
    return _placed(_tokens(lm.mask, h=h), lm.q_order, lm.key_order)


def _family_in_model_order(vm: families.VideoMask, geo: M.VideoGeometry, h=0) -> np.ndarray:
    """The family's mask as a token matrix of the model's order, built directly: undo the
    family's permutations, then move the text where the model has it (where the family put it
    last)."""
    orig = _placed(_tokens(vm.mask, h=h), vm.permutation, vm.key_permutation)
    if geo.text_first and geo.text_tokens and not vm.params.get("text_first"):
        nv = geo.video_tokens
        to_model = np.r_[np.arange(geo.text_tokens, geo.text_tokens + nv),
                         np.arange(geo.text_tokens)]
        return _placed(orig, to_model, to_model)
    return orig


def _text_rule(geo: M.VideoGeometry, a: np.ndarray) -> None:
    """Text rows and columns of a model-order token matrix follow the documented rule."""
    nv, nt = geo.video_tokens, geo.text_tokens
    if not nt:
        return
    valid = nt if geo.text_valid is None else geo.text_valid
    off = 0 if geo.text_first else nv
    video = np.r_[nt:nt + nv] if geo.text_first else np.r_[0:nv]
    tv, tp = np.r_[off:off + valid], np.r_[off + valid:off + nt]
    assert a[np.ix_(tv, video)].all() and a[np.ix_(tv, tv)].all()
    assert a[np.ix_(video, tv)].all()
    assert not a[np.ix_(video, tp)].any() and not a[np.ix_(tv, tp)].any()
    assert a[np.ix_(tp, tp)].all() and not a[np.ix_(tp, video)].any()


GEOMETRIES = [M.VideoGeometry(LATENT), M.VideoGeometry(LATENT, 9, 5),
              M.VideoGeometry(LATENT, 9, 5, text_first=True),
              M.VideoGeometry(LATENT, 6, None, text_first=True)]
STATIC = [M.SlidingTile(tile=(2, 4, 4), window=(1, 3, 3)),
          M.SlidingTile(tile=(2, 4, 4), window=[(1, 1, 3), (3, 3, 1)]),
          M.SpatialTemporal(block=32, heads=["spatial", "temporal"]),
          M.SpatialTemporal(block=32, heads="temporal"), M.Radial(block=32)]


def _qk(geo, heads=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, heads, geo.tokens, 8)).astype(np.float32)
            for _ in range(2)]


def _family(method, geo, q, k):
    """The family call a method stands for: on the text-last sequence, unless the family reads
    the text first itself (``text_first_family``)."""
    if geo.text_first and geo.text_tokens and not method.text_first_family:
        order = np.r_[np.arange(geo.text_tokens, geo.tokens), np.arange(geo.text_tokens)]
        q, k = q[:, :, order], k[:, :, order]
    return method._family_mask(geo, q, k, False)


@pytest.mark.parametrize("geo", GEOMETRIES, ids=str)
@pytest.mark.parametrize("method", STATIC + [M.TopKCubes(topk=3), M.TopKCubes(top_p=0.6),
                                             M.SemanticClusters(q_clusters=7, kv_clusters=9)],
                         ids=lambda m: m.name)
def test_mask_in_model_order_equals_the_family_rule(method, geo):
    """Every (method, layout): the LayerMask, undone through its orders, selects exactly the
    token pairs the family selects, moved to the model's order; text follows the rule."""
    q, k = _qk(geo)
    lm = method.layer_mask(geo, q, k)
    vm = _family(method, geo, q, k)
    for h in range(2):
        got = _in_model_order(lm, h)
        assert np.array_equal(got, _family_in_model_order(vm, geo, h))
        _text_rule(geo, got)


@pytest.mark.parametrize("geo", GEOMETRIES, ids=str)
@pytest.mark.parametrize("method", [STATIC[0], STATIC[3], M.TopKCubes(topk=3)],
                         ids=lambda m: m.name)
def test_tokens_kept_in_the_method_order_need_no_reordering(method, geo):
    """q/k already in the method's order (``sequence_order(video_order)``, as a pipeline keeps
    them across layers): the mask, with no orders, equals the reordered call's, and the order
    is a permutation whose inverse restores the sequence."""
    q, k = _qk(geo, seed=1)
    order = geo.sequence_order(method.video_order(geo))
    base = method.layer_mask(geo, q, k)
    if order is None:
        assert base.q_order is None
        return
    assert np.array_equal(np.sort(order), np.arange(geo.tokens))
    inv = families.invert_permutation(order)
    assert np.array_equal(order[inv], np.arange(geo.tokens))
    assert np.array_equal(base.q_order, order)
    ordered = method.layer_mask(geo, q[:, :, order], k[:, :, order], ordered=True)
    assert ordered.q_order is None and ordered.kv_order is None
    for h in range(2):
        assert np.array_equal(_tokens(ordered.mask, h=h), _tokens(base.mask, h=h))


def test_schedule_keeps_first_steps_and_layers_dense():
    s = M.Schedule(dense_steps=2, dense_layers=1)
    table = [[s.dense(step, layer) for layer in range(3)] for step in range(4)]
    assert table == [[True] * 3, [True] * 3, [True, False, False], [True, False, False]]
    assert not M.Schedule().dense(0, 0)
    with pytest.raises(ValueError, match="dense_steps must be an int >= 0"):
        M.Schedule(dense_steps=-1)


def test_bad_configurations_are_refused_by_name():
    with pytest.raises(ValueError, match="text_valid must be None or an int in"):
        M.VideoGeometry(LATENT, 4, 5)
    with pytest.raises(ValueError, match="latent must be three positive ints"):
        M.VideoGeometry((0, 2, 2))
    with pytest.raises(ValueError, match="give one of density, topk or top_p"):
        M.TopKCubes(density=0.1, topk=3)
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\]"):
        M.TopKCubes(density=1.5)
    with pytest.raises(ValueError, match="unknown method 'sta'; choose from sliding_tile"):
        M.method_from_name("sta")
    with pytest.raises(ValueError, match="builds its mask from q and k"):
        M.TopKCubes().layer_mask(M.VideoGeometry(LATENT))
    with pytest.raises(TypeError, match="geo must be a VideoGeometry"):
        M.Radial().layer_mask((5, 6, 7))
    assert M.TopKCubes().density == 0.1


@pytest.mark.parametrize("make, kind, words", [
    (lambda: M.SlidingTile(window=(0, 3, 3)), ValueError, "window must be three positive ints"),
    (lambda: M.SlidingTile(window=[(3, 3, 3), (1, 2)]), ValueError, "window must be three"),
    (lambda: M.SlidingTile(window="333"), TypeError, "window must be one value or a list"),
    (lambda: M.SpatialTemporal(heads="both"), ValueError, "heads must be 'spatial', 'temporal'"),
    (lambda: M.SpatialTemporal(width=-1), ValueError, "width must be an int >= 0"),
    (lambda: M.SpatialTemporal(block=128.0), TypeError, "block must be a positive int"),
    (lambda: M.SpatialTemporal(temporal_rule="strided"), ValueError, "temporal_rule must be"),
    (lambda: M.Radial(block=-1), ValueError, "block must be a positive int"),
    (lambda: M.Radial(dense_distance=1.5), TypeError, "dense_distance must be an int >= 0"),
    (lambda: M.Radial(sink_frame=1), TypeError, "sink_frame must be True or False"),
    (lambda: M.TopKCubes(topk=0), ValueError, "topk must be a positive int"),
    (lambda: M.TopKCubes(top_p=2.0), ValueError, r"top_p must be in \(0, 1\]"),
    (lambda: M.TopKCubes(cube=(4, 4)), ValueError, "cube must be three positive ints"),
    (lambda: M.SemanticClusters(q_clusters=0), ValueError, "q_clusters must be a positive int"),
    (lambda: M.SemanticClusters(kv_clusters=10.5), TypeError, "kv_clusters must be a positive"),
    (lambda: M.SemanticClusters(min_fraction=1.5), ValueError, r"min_fraction must be in \[0"),
    (lambda: M.SemanticClusters(iters=0), ValueError, "iters must be a positive int"),
    (lambda: M.method_from_name(3), ValueError, "unknown method 3"),
])
def test_methods_check_every_field_when_made(make, kind, words):
    """A method refuses a bad field when it is made, not inside the model's forward."""
    with pytest.raises(kind, match=words):
        make()


def test_methods_are_frozen_values_and_their_masks_follow_them():
    """A method cannot be changed under its cached masks (it is frozen); a changed copy
    (dataclasses.replace) makes masks of its own, and equal methods compare equal."""
    import dataclasses

    geo = M.VideoGeometry((4, 16, 16))
    wide = M.SlidingTile(tile=(2, 4, 4), window=[(3, 3, 3), [1, 1, 1]])
    assert wide.window == ((3, 3, 3), (1, 1, 1)) and hash(wide) == hash(M.SlidingTile(
        tile=(2, 4, 4), window=((3, 3, 3), (1, 1, 1))))
    m = M.SlidingTile(tile=(2, 4, 4), window=(3, 3, 3))
    before = m.layer_mask(geo).mask
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.window = (1, 1, 1)
    narrow = dataclasses.replace(m, window=(1, 1, 1))
    after = narrow.layer_mask(geo).mask
    assert after.nnz < before.nnz and m.layer_mask(geo).mask is before
    assert M.TopKCubes().density == 0.1 and M.TopKCubes(topk=4).density is None


def test_enable_refuses_a_regime_that_is_not_one():
    """diffusers.enable checks its regime before touching the model."""
    from tessera.integrations import diffusers as td

    with pytest.raises(TypeError, match="regime must be a tessera.Regime or None, got str"):
        td.enable(object(), M.SlidingTile(), regime="fast")


# ---------------------------------------------------------------------------- saved configurations
CONFIGS = [
    M.SparseConfig(M.SlidingTile(window=[(3, 3, 3), (1, 2, 2)]), M.Schedule(10, 1), "a sweep"),
    M.SparseConfig(M.SpatialTemporal(heads=["spatial", "temporal"], width=2)),
    M.SparseConfig(M.Radial(dense_distance=2, sink_frame=False), M.Schedule(dense_steps=12)),
    M.SparseConfig(M.TopKCubes(topk=7)),
    M.SparseConfig(M.TopKCubes(top_p=0.8, cube=(2, 4, 4))),
    M.SparseConfig(M.SemanticClusters(q_clusters=50, top_p=0.95)),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[c.method.name for c in CONFIGS])
def test_a_saved_configuration_loads_back_equal(config, tmp_path):
    path = tmp_path / "c.json"
    config.save(path)
    again = M.SparseConfig.load(path)
    assert again == config
    assert again.method.layer_mask is not None and type(again.method) is type(config.method)
    assert M.SparseConfig.from_json(config.to_json()) == config


def test_a_configuration_refuses_what_it_does_not_know(tmp_path):
    good = CONFIGS[0].to_json()
    cases = [
        ({**good, "format": "other"}, ValueError, 'with "format": "tessera-sparse-attention"'),
        ({**good, "version": 2}, ValueError, "configuration version 2 is not 1"),
        ({**good, "extra": 1}, ValueError, r"configuration keys \['extra'\] are unknown"),
        ({**good, "method": {"name": "nope", "params": {}}}, ValueError, "unknown method 'nope'"),
        ({**good, "method": {"name": "radial", "params": {"windw": 1}}}, ValueError,
         "method 'radial' takes no parameter windw"),
        ({**good, "method": {"name": "radial", "params": {"block": 0}}}, ValueError, "block"),
        ({**good, "schedule": {"dense_steps": -1}}, ValueError, "dense_steps must be an int"),
        ({**good, "schedule": {"steps": 1}}, ValueError, '"schedule" must be'),
        ([1, 2], ValueError, "a JSON object"),
    ]
    for obj, err, match in cases:
        with pytest.raises(err, match=match):
            M.SparseConfig.from_json(obj)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read a configuration from"):
        M.SparseConfig.load(bad)
    with pytest.raises(TypeError, match="method must be one of the methods"):
        M.SparseConfig("sliding_tile")
