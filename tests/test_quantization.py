"""CPU tests of an 8-bit forward's numbers (tessera.quantization): the e4m3 rounding against
the format's definition, the scales, the rotation, and the oracle against the float64 reference
where rounding loses nothing and where it must."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import BlockMask, quantization as qz, reference


def _e4m3_values() -> np.ndarray:
    """Every finite non-negative e4m3 value, from its bit fields (bias 7, 3 mantissa bits;
    exponent field 15 with mantissa 7 is NaN)."""
    vals = [m / 8 * 2.0 ** -6 for m in range(8)]  # subnormals (and zero)
    vals += [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8)
             if not (e == 15 and m == 7)]
    return np.array(sorted(vals))


def test_round_e4m3_lands_on_the_nearest_value_ties_to_even():
    grid = _e4m3_values()
    assert grid.size == 127 and grid[-1] == qz.E4M3_MAX
    x = np.random.default_rng(0).uniform(0, 460, 20000)
    x = np.concatenate([x, np.random.default_rng(1).uniform(0, 0.05, 20000)])
    got = qz.round_e4m3(x)
    assert np.isin(got, grid).all()
    i = np.clip(np.searchsorted(grid, np.minimum(x, qz.E4M3_MAX)), 1, grid.size - 1)
    nearest = np.minimum(np.abs(grid[i] - x), np.abs(grid[i - 1] - x))
    assert (np.abs(got - np.minimum(x, qz.E4M3_MAX)) <= nearest + 1e-15).all()
    # ties go to the even mantissa; beyond 448 saturates; signs and NaN kept
    ties = [1.0625, 1.1875, 17.0, 2.0 ** -10, 1.5 * 2.0 ** -9, 464.0, 1e9, -1.0625, np.inf]
    assert qz.round_e4m3(ties).tolist() == [1.0, 1.25, 16.0, 0.0, 2.0 ** -8, 448.0, 448.0,
                                            -1.0, 448.0]
    assert np.isnan(qz.round_e4m3([np.nan])).all()
    assert (qz.round_e4m3(grid) == grid).all()


@pytest.mark.parametrize("fmt,top", [("e4m3", 448.0), ("int8", 127.0)])
def test_quantize_scales_each_slice_by_its_largest_magnitude(fmt, top):
    x = np.random.default_rng(2).standard_normal((2, 3, 50, 16))
    x[0, 0, 7] = 0.0  # a slice of zeros keeps scale 1
    vals, scales = qz.quantize(x, fmt, -1)
    assert scales.shape == (2, 3, 50, 1) and scales[0, 0, 7, 0] == 1.0
    assert np.abs(vals).max(axis=-1)[scales[..., 0] != 1.0] == pytest.approx(top)
    rel = np.abs(vals * scales - x).max() / np.abs(x).max()
    assert 0 < rel < (1 / 16 if fmt == "e4m3" else 0.5 / 127 + 1e-12)
    if fmt == "int8":
        assert (vals == np.round(vals)).all()
        u, _ = qz.quantize(np.abs(x), "int8", 2, unsigned=True)
        assert u.min() >= 0 and u.max() == 255


def test_quantize_refuses_unknown_formats():
    with pytest.raises(ValueError, match="fmt must be one of"):
        qz.quantize(np.ones((2, 2)), "fp4")
    with pytest.raises(ValueError, match="unsigned applies to the int8"):
        qz.quantize(np.ones((2, 2)), "e4m3", unsigned=True)


@pytest.mark.parametrize("d", [64, 96, 128])
def test_rotation_is_orthogonal_and_spreads_a_channel(d):
    r = qz.rotation(d)
    assert np.allclose(r @ r.T, np.eye(d), atol=1e-12)
    spread = np.abs(r[0])  # channel 0's weight in every rotated channel
    assert (spread > 0).sum() == (d if d & (d - 1) == 0 else 32)
    assert (qz.rotation(d) == r).all()  # the same signs every call
    with pytest.raises(ValueError, match="head_dim"):
        qz.rotation(80)


def _case(seed=0, h=2, hkv=2, d=64, blocks=6, block=64):
    rng = np.random.default_rng(seed)
    L = blocks * block
    dense = rng.random((h, blocks, blocks)) < 0.5
    dense[0, 2] = False  # a row that selects nothing
    mask = BlockMask.from_dense(dense, block_size=block)
    q = rng.standard_normal((1, h, L, d))
    k, v = (rng.standard_normal((1, hkv, L, d)) for _ in range(2))
    return q, k, v, mask


def test_attention_is_exact_where_rounding_loses_nothing():
    """Q and K integers whose rows reach 127 (int8, scale 1), P . V in 16 bits, no rewrite:
    the oracle is the reference."""
    q, k, v, mask = _case(seed=3)
    rng = np.random.default_rng(4)
    q = rng.integers(-127, 128, q.shape).astype(np.float64)
    k = rng.integers(-127, 128, k.shape).astype(np.float64)
    q[..., 0], k[..., 0] = 127.0, -127.0
    s = qz.Scheme(qk="int8", pv="16bit", smooth_k=False, rotate=False)
    got = qz.attention(q, k, v, mask, scheme=s, scale=1e-3)
    np.testing.assert_allclose(got, reference.attention(q, k, v, mask, scale=1e-3), atol=1e-12)


def test_the_rewrites_are_exact():
    """Smoothing K and rotating Q and K change no softmax: the reference on the rewritten
    operands is the reference."""
    q, k, v, mask = _case(seed=5)
    r = qz.rotation(q.shape[-1])
    ks = k - k.mean(axis=2, keepdims=True)
    np.testing.assert_allclose(reference.attention(q @ r, ks @ r, v, mask),
                               reference.attention(q, k, v, mask), atol=1e-12)


@pytest.mark.parametrize("scheme,bound", [
    (qz.Scheme(qk="int8", pv="16bit"), 0.02),
    (qz.Scheme(qk="int8", pv="int8"), 0.035),
    (qz.Scheme(qk="e4m3", pv="e4m3", rotate=False), 0.08),
])
def test_attention_error_against_float64(scheme, bound):
    """Each scheme's error on Gaussian inputs (GQA 4:2, blhd too), within its measured bound
    and not zero (the rounding happens); rows that select nothing stay 0."""
    q, k, v, mask = _case(seed=6, h=4, hkv=2)
    ref = reference.attention(q, k, v, mask)
    got = qz.attention(q, k, v, mask, scheme=scheme)
    live = np.linalg.norm(ref, axis=-1) > 0
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert 1e-4 < err < bound
    assert not got[~live].any() and np.isfinite(got).all()
    blhd = qz.attention(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                        v.transpose(0, 2, 1, 3), mask, scheme=scheme, layout="blhd")
    np.testing.assert_allclose(blhd, got.transpose(0, 2, 1, 3), atol=1e-12)


def test_int8_scores_beat_e4m3_scores():
    """The reason the default scheme multiplies Q K^T in int8: on Gaussian inputs e4m3's
    3-bit mantissa costs the scores several times int8's error (docs/decisions.md)."""
    q, k, v, mask = _case(seed=7, d=128)
    ref = reference.attention(q, k, v, mask)
    err = {fmt: np.linalg.norm(qz.attention(q, k, v, mask, scheme=qz.Scheme(
        qk=fmt, pv="16bit")) - ref) for fmt in ("int8", "e4m3")}
    assert err["e4m3"] > 2.5 * err["int8"]


def test_scheme_refusals_and_name():
    assert qz.Scheme().name == "qk_int8-pv_int8-smooth-rotate"
    assert qz.Scheme(qk="e4m3", pv="16bit", rotate=False).name == "qk_e4m3-pv_16bit-smooth"
    with pytest.raises(ValueError, match="qk must be one of"):
        qz.Scheme(qk="16bit")
    with pytest.raises(ValueError, match="pv must be one of"):
        qz.Scheme(pv="fp4")
    with pytest.raises(TypeError, match="rotate must be True or False"):
        qz.Scheme(rotate=1)
    q, k, v, mask = _case()
    with pytest.raises(TypeError, match="scheme must be"):
        qz.attention(q, k, v, mask, scheme="int8")


def test_probabilities_round_a_chunk_at_a_time():
    """Chunks restart at each span of consecutive keys: each chunk's largest P survives
    exactly (it is the chunk's scale), and every P lands on its chunk's 1/255 grid."""
    keys = np.concatenate([np.arange(0, 200), np.arange(300, 364)])  # spans of 200 and 64 keys
    p = np.random.default_rng(8).uniform(0.001, 0.9, (3, keys.size))
    s = qz.Scheme(chunk_keys=128)
    got = qz._round_probabilities(p, keys, s)
    for cols in (slice(0, 128), slice(128, 200), slice(200, 264)):
        top = p[:, cols].max(axis=1, keepdims=True)
        assert (got[:, cols].max(axis=1, keepdims=True) == top).all()
        codes = got[:, cols] / top * 255
        assert np.allclose(codes, np.round(codes), atol=1e-9)
    fixed = qz._round_probabilities(p, keys, qz.Scheme(p_per_chunk=False))
    assert np.allclose(fixed * 255, np.round(fixed * 255), atol=1e-9)
    assert np.abs(got - p).max() <= 0.9 / 255 / 2 + 1e-12


def test_chunk_scaled_probabilities_beat_a_fixed_step():
    """Why P is scaled per chunk: on rows of many keys most chunks sit far below the row's
    largest P, where the fixed step of 1/255 leaves them few bits (docs/decisions.md)."""
    q, k, v, mask = _case(seed=9, d=64, blocks=16, block=128)
    ref = reference.attention(q, k, v, mask)
    err = {c: np.linalg.norm(qz.attention(q, k, v, mask, scheme=qz.Scheme(
        qk="int8", pv="int8", p_per_chunk=c)) - ref) for c in (True, False)}
    assert err[False] > 1.2 * err[True]
    assert qz.Scheme(p_per_chunk=False, chunk_keys=64).name.endswith("-pfixed-c64")
    with pytest.raises(ValueError, match="chunk_keys must be 64 or 128"):
        qz.Scheme(chunk_keys=96)


def test_key_groups_share_one_step():
    """k_group: each run of that many keys of a head takes one step, its largest magnitude over
    127 (the last, short group its own), and the codes round K to it; 1 is a step a token."""
    k = np.random.default_rng(3).standard_normal((1, 2, 40, 64)) * np.linspace(0.5, 3, 40)[:, None]
    one = qz.quantized_operands(k, k, k, qz.Scheme(smooth_k=False, rotate=False))
    assert np.allclose(one.k_scale[..., 0], np.abs(k).max(-1) / 127)
    got = qz.quantized_operands(k, k, k, qz.Scheme(smooth_k=False, rotate=False, k_group=16))
    for lo, hi in ((0, 16), (16, 32), (32, 40)):
        step = got.k_scale[:, :, lo:hi, 0]
        assert (step == step[:, :, :1]).all()
        assert np.allclose(step[:, :, 0], np.abs(k[:, :, lo:hi]).max((-2, -1)) / 127)
    assert np.abs(got.k * got.k_scale - k).max() <= got.k_scale.max() / 2 + 1e-12
    assert np.array_equal(got.q, one.q) and qz.Scheme(k_group=64).name.endswith("-kg64")


@pytest.mark.parametrize("scheme,err,match", [
    ("int8", TypeError, "scheme must be a tessera.quantization.Scheme"),
    (qz.Scheme(qk="e4m3"), ValueError, "rounds to int8 only"),
    (qz.Scheme(pv="e4m3"), ValueError, "rounds to int8 only"),
])
def test_the_gpu_pre_pass_refuses_a_scheme_before_anything_else(scheme, err, match):
    """On any machine: the scheme is checked before the operands or the GPU are looked at."""
    from tessera.quantize_launch import quantize_operands

    with pytest.raises(err, match=match):
        quantize_operands(None, None, None, scheme=scheme)


def test_v_key_order_makes_s_accumulator_registers_the_p_fragment():
    """Thread q of a quad holds S's keys 2q, 2q + 1 of each key octet (wgmma's accumulator);
    its u8 A fragment register holds keys 4q .. 4q + 3 of each 16: in v_key_order the columns
    4q .. 4q + 3 of every 16 keys are the keys the thread holds, in the order it packs them
    (the first octet's two, then the second's), and every key appears once."""
    from tessera.quantize_launch import v_key_order

    order = v_key_order(64)
    assert sorted(order) == list(range(64))
    for group in range(4):
        for q in range(4):
            held = [8 * o + 2 * q + e for o in (2 * group, 2 * group + 1) for e in (0, 1)]
            assert list(order[16 * group + 4 * q: 16 * group + 4 * q + 4]) == held
    assert v_key_order(0).size == 0


def test_quantized_operands_are_the_rewritten_operands_rounded():
    """Host side of the pre-pass: values times steps give the smoothed, rotated operands back
    within half a step; blhd inputs give the same bhld result; 16-bit P . V keeps V."""
    q, k, v, _ = _case(seed=10, h=4, hkv=2, d=96)
    s = qz.Scheme()
    ops = qz.quantized_operands(q, k, v, s)
    r = qz.rotation(96)
    for got, step, exact in ((ops.q, ops.q_scale, q @ r),
                             (ops.k, ops.k_scale, (k - k.mean(axis=2, keepdims=True)) @ r)):
        assert np.abs(got * step - exact).max() <= 0.5 * step.max() + 1e-12
        assert (np.abs(got) <= 127).all() and (got == np.round(got)).all()
    assert ops.v_scale.shape == (1, 2, 1, 96)
    t = qz.quantized_operands(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), s, layout="blhd")
    assert all((getattr(t, f) == getattr(ops, f)).all() for f in ("q", "k", "v"))
    kept = qz.quantized_operands(q, k, v, qz.Scheme(pv="16bit"))
    assert (kept.v == v).all() and (kept.v_scale == 1).all()
    np.testing.assert_allclose(
        qz.rotation(128), np.kron(np.eye(1), _sylvester(128)) * qz.rotation_factors(128))


def _sylvester(n: int) -> np.ndarray:
    i = np.arange(n)
    return (-1.0) ** np.vectorize(lambda x: bin(x).count("1"))(i[:, None] & i[None, :])
