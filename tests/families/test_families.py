"""CPU tests of the video mask families (tessera.families).

Hand-worked small cases, and brute-force token-level constructions (an ``L x L`` boolean rule
matrix reduced to blocks with the any-token rule) compared with the vectorized generators.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tessera import families as M
from tessera import reference
from tests.families.families_helpers import dense, is_permutation, separated_qk


def to_blocks(tok: np.ndarray, qb: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """Any-token reduction of a token matrix [..., Lq, Lk] to blocks [..., nQB, nKB]."""
    r = np.logical_or.reduceat(tok, qb[:-1], axis=-2)
    return np.logical_or.reduceat(r, kb[:-1], axis=-1)


def expand(blocks: np.ndarray, qb: np.ndarray, kb: np.ndarray) -> np.ndarray:
    t = np.repeat(blocks, np.diff(qb), axis=-2)
    return np.repeat(t, np.diff(kb), axis=-1)


def coords(latent):
    """Per frame-major token: (t, h, w) arrays."""
    T, H, W = latent
    t, h, w = np.meshgrid(np.arange(T), np.arange(H), np.arange(W), indexing="ij")
    return t.reshape(-1), h.reshape(-1), w.reshape(-1)


def uniform(n, block):
    return np.minimum(np.arange(-(-n // block) + 1) * block, n)


def test_apply_and_invert_permutation_roundtrip():
    rng = np.random.default_rng(0)
    perm = rng.permutation(17).astype(np.int64)
    x = rng.standard_normal((2, 3, 17, 4))
    xp = M.apply_permutation(x, perm, axis=2)
    assert np.array_equal(xp[:, :, 5], x[:, :, perm[5]])
    inv = M.invert_permutation(perm)
    assert np.array_equal(perm[inv], np.arange(17))
    assert np.array_equal(M.apply_permutation(xp, inv, axis=2), x)
    assert M.apply_permutation(x, None) is x


def test_temporal_permutation_hand():
    p = M.temporal_permutation((4, 2, 4))  # T=4, F=8
    assert is_permutation(p, 32)
    assert p[:5].tolist() == [0, 8, 16, 24, 1]  # position 0 in frames 0..3, then position 1
    t, h, w = coords((4, 2, 4))
    s = h * 4 + w
    assert np.array_equal(s[p] * 4 + t[p], np.arange(32))


def test_sta_divisible_every_row_attends_window_volume():
    vm = M.sliding_tile((6, 8, 10), tile=(2, 2, 2), window=(3, 3, 3))  # grid 3x4x5
    d = dense(vm)
    assert d.shape == (1, 1, 60, 60)
    assert (d.sum(-1) == 27).all()
    assert (np.diff(vm.mask.q_bounds) == 8).all()
    assert vm.family == "sliding_tile" and vm.params["window"] == (3, 3, 3)


def test_sta_hand_rows_clamped_window():
    vm = M.sliding_tile((6, 8, 10), tile=(2, 2, 2), window=(3, 3, 3))  # grid 3x4x5
    d = dense(vm)[0, 0]

    def tid(a, b, c):
        return (a * 4 + b) * 5 + c

    corner = {tid(a, b, c) for a in range(3) for b in range(3) for c in range(3)}
    assert set(np.nonzero(d[tid(0, 0, 0)])[0]) == corner
    # tile (1, 3, 4): t window [0,3), h clamped to [1,4), w clamped to [2,5)
    far = {tid(a, b, c) for a in range(3) for b in range(1, 4) for c in range(2, 5)}
    assert set(np.nonzero(d[tid(1, 3, 4)])[0]) == far
    # an interior tile's window is centred: (1, 2, 2) -> h [1,4), w [1,4)
    mid = {tid(a, b, c) for a in range(3) for b in range(1, 4) for c in range(1, 4)}
    assert set(np.nonzero(d[tid(1, 2, 2)])[0]) == mid


def test_sta_even_window_and_window_larger_than_grid():
    # one axis of 5 tiles, window 2: start = clip(i - 1, 0, 3)
    d = dense(M.sliding_tile((1, 1, 5), tile=(1, 1, 1), window=(1, 1, 2)))[0, 0]
    assert [np.nonzero(r)[0].tolist() for r in d] == [[0, 1], [0, 1], [1, 2], [2, 3], [3, 4]]
    # window larger than the 2x3x4 grid: clipped to the grid, every tile sees every tile
    d = dense(M.sliding_tile((4, 6, 8), tile=(2, 2, 2), window=(5, 5, 5)))
    assert d.all()


def test_sta_permutation_groups_tiles_in_order():
    lat, tile = (7, 9, 10), (6, 8, 8)
    vm = M.sliding_tile(lat, tile=tile)
    perm = vm.permutation
    assert is_permutation(perm, 630)
    sizes = np.diff(vm.mask.q_bounds)
    # grid 2x2x2, extents t [6,1], h [8,1], w [8,2]
    expect = [a * b * c for a in (6, 1) for b in (8, 1) for c in (8, 2)]
    assert sizes.tolist() == expect
    t, h, w = coords(lat)
    qb = vm.mask.q_bounds
    for i in range(sizes.size):
        seg = perm[qb[i]:qb[i + 1]]
        tiles = {(a, b, c) for a, b, c in zip(t[seg] // 6, h[seg] // 8, w[seg] // 8)}
        a, b, c = i // 4, (i // 2) % 2, i % 2  # frame-tile-major
        assert tiles == {(a, b, c)}
        assert (np.diff(seg) > 0).all()  # frame-major inside the tile


def test_sta_per_head_windows():
    vm = M.sliding_tile((6, 8, 10), tile=(2, 2, 2), window=[(3, 3, 3), (1, 1, 1), (1, 3, 5)])
    d = dense(vm)
    assert vm.mask.batch_heads == (1, 3)
    assert (d[0, 0].sum(-1) == 27).all()
    assert np.array_equal(d[0, 1], np.eye(60, dtype=bool))
    assert (d[0, 2].sum(-1) == 15).all()
    single = dense(M.sliding_tile((6, 8, 10), tile=(2, 2, 2), window=(1, 3, 5)))
    assert np.array_equal(d[0, 2], single[0, 0])


LAT = (4, 4, 6)  # 96 video tokens


def family_makers():
    rng = np.random.default_rng(1)
    L = 96 + 7
    q = rng.standard_normal((2, L, 8)).astype(np.float32)
    k = rng.standard_normal((2, L, 8)).astype(np.float32)
    return {
        "sta": lambda **t: M.sliding_tile(LAT, tile=(2, 2, 2), window=(1, 3, 3), **t),
        "spatial": lambda **t: M.spatial_temporal(LAT, block=16, heads=["spatial", "temporal"],
                                                  **t),
        "temporal": lambda **t: M.spatial_temporal(LAT, block=16, heads="temporal", **t),
        "radial": lambda **t: M.radial(LAT, block=16, **t),
        "topk": lambda **t: M.topk_pooled(q[:, :96 + t["text_tokens"]],
                                          k[:, :96 + t["text_tokens"]], LAT, cube=(2, 2, 2),
                                          topk=3, **t),
        "semantic": lambda **t: M.semantic_clusters(q[:, :96 + t["text_tokens"]],
                                                    k[:, :96 + t["text_tokens"]], 6, 8, **t),
        "random": lambda **t: M.random_blocks(2, 96 + t["text_tokens"], block=16, density=0.3,
                                              **t),
    }


@pytest.mark.parametrize("family", list(family_makers()))
@pytest.mark.parametrize("text_valid", [None, 4, 0])
def test_text_blocks(family, text_valid):
    text_tokens = 7
    vm = family_makers()[family](text_tokens=text_tokens, text_valid=text_valid)
    base = family_makers()[family](text_tokens=0)
    d, d0 = dense(vm), dense(base)
    valid = text_tokens if text_valid is None else text_valid
    pad = text_tokens - valid
    n_t = (valid > 0) + (pad > 0)
    nq, nk = d0.shape[-2:]
    assert d.shape[-2:] == (nq + n_t, nk + n_t)
    qb, kb = vm.mask.q_bounds, vm.mask.kv_bounds
    assert np.diff(qb)[nq:].tolist() == [s for s in (valid, pad) if s]
    assert np.diff(kb)[nk:].tolist() == [s for s in (valid, pad) if s]
    # the video part is the mask without text
    assert np.array_equal(d[..., :nq, :nk], d0)
    if valid:
        assert d[..., :nq, nk].all()           # every video row sees the valid text block
        assert d[..., nq, :nk + 1].all()       # valid text rows: all video + valid text
    if pad:
        assert not d[..., :-1, -1].any()       # no other row attends padding
        assert d[..., -1, -1].all()
        assert not d[..., -1, :-1].any()       # padding attends only padding
    # permutations are the identity on text
    for p in (vm.permutation, vm.kv_permutation):
        if p is not None:
            assert is_permutation(p, 96 + text_tokens)
            assert np.array_equal(p[96:], np.arange(96, 96 + text_tokens))


def test_text_valid_out_of_range():
    with pytest.raises(ValueError):
        M.radial(LAT, block=16, text_tokens=3, text_valid=4)


def brute_spatial(latent, width):
    T, H, W = latent
    t, _, _ = coords(latent)
    return np.abs(t[:, None] - t[None, :]) <= width


def brute_temporal_band(latent, width):
    """Original order: token-major chunks of F tokens within +-width."""
    T, H, W = latent
    t, h, w = coords(latent)
    c = ((h * W + w) * T + t) // (H * W)
    return np.abs(c[:, None] - c[None, :]) <= width


def brute_temporal_position(latent, width):
    T, H, W = latent
    t, h, w = coords(latent)
    s = h * W + w
    return (s[:, None] == s[None, :]) & (np.abs(t[:, None] - t[None, :]) <= width)


def test_spatial_hand_tiny():
    lat = (4, 2, 4)  # F = 8 tokens per frame, 32 tokens
    d = dense(M.spatial_temporal(lat, block=8, heads="spatial", width=1))[0, 0]
    assert d.astype(int).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    # blocks of 12 straddle frames: [0,12) frames 0-1, [12,24) frames 1-2, [24,32) frame 3
    d = dense(M.spatial_temporal(lat, block=12, heads="spatial", width=1))[0, 0]
    assert d.astype(int).tolist() == [[1, 1, 0], [1, 1, 1], [0, 1, 1]]


def test_temporal_hand_tiny():
    lat = (4, 2, 4)
    vm = M.spatial_temporal(lat, block=8, heads="temporal", width=1)
    assert vm.params["order"] == "token-major"
    assert np.array_equal(vm.permutation, M.temporal_permutation(lat))
    d = dense(vm)[0, 0]
    # token-major blocks of 8 = 2 positions x 4 frames = one F-chunk: the same band as spatial
    assert d.astype(int).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    # "position" rule in token-major order, width 1: groups of 4 frames, band +-1 inside:
    # block 0 = positions 0,1 only reaches itself
    d = dense(M.spatial_temporal(lat, block=8, heads="temporal", width=1,
                                 temporal_rule="position"))[0, 0]
    assert np.array_equal(d, np.eye(4, dtype=bool))
    # in original order, block = frame: same position in frames +-1 -> tridiagonal
    d = dense(M.spatial_temporal(lat, block=8, heads="temporal", width=1,
                                 temporal_rule="position", order="original"))[0, 0]
    assert d.astype(int).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    # with blocks of 4 (half a frame): block 0 (frame 0, positions 0-3) sees positions 0-3 of
    # frames 0 and 1 = blocks 0 and 2 only
    d = dense(M.spatial_temporal(lat, block=4, heads="temporal", width=1,
                                 temporal_rule="position", order="original"))[0, 0]
    assert np.nonzero(d[0])[0].tolist() == [0, 2]
    assert np.nonzero(d[3])[0].tolist() == [1, 3, 5]


CASES = [((4, 2, 4), 8, 1), ((4, 2, 4), 5, 1), ((5, 3, 4), 7, 1), ((5, 3, 4), 16, 2),
         ((6, 1, 2), 3, 1), ((3, 4, 5), 9, 0), ((7, 2, 3), 4, 2)]


@pytest.mark.parametrize("latent,block,width", CASES)
def test_spatial_temporal_against_brute_force(latent, block, width):
    n = int(np.prod(latent))
    b = uniform(n, block)
    perm = M.temporal_permutation(latent)
    rules = {"spatial": brute_spatial(latent, width),
             "band": brute_temporal_band(latent, width),
             "position": brute_temporal_position(latent, width)}
    # original order, each kind
    got = dense(M.spatial_temporal(latent, block=block, heads="spatial", width=width))[0, 0]
    assert np.array_equal(got, to_blocks(rules["spatial"], b, b))
    for rule in ("band", "position"):
        tok = rules[rule]
        got = dense(M.spatial_temporal(latent, block=block, heads="temporal", width=width,
                                       temporal_rule=rule, order="original"))[0, 0]
        assert np.array_equal(got, to_blocks(tok, b, b)), rule
        # token-major order: the same rule on permuted tokens
        vm = M.spatial_temporal(latent, block=block, heads="temporal", width=width,
                                temporal_rule=rule)
        assert np.array_equal(vm.permutation, perm)
        tok_p = tok[np.ix_(perm, perm)]
        assert np.array_equal(dense(vm)[0, 0], to_blocks(tok_p, b, b)), rule


def test_temporal_band_in_token_major_equals_spatial():
    lat = (21, 6, 10)
    s = dense(M.spatial_temporal(lat, block=32, heads="spatial"))
    t = dense(M.spatial_temporal(lat, block=32, heads="temporal"))
    assert np.array_equal(s, t)


def test_mixed_heads_original_order():
    lat = (5, 3, 4)
    vm = M.spatial_temporal(lat, block=7, heads=["spatial", "temporal", "spatial"])
    assert vm.permutation is None and vm.mask.batch_heads == (1, 3)
    d = dense(vm)[0]
    s = dense(M.spatial_temporal(lat, block=7, heads="spatial"))[0, 0]
    t = dense(M.spatial_temporal(lat, block=7, heads="temporal", order="original"))[0, 0]
    assert np.array_equal(d[0], s) and np.array_equal(d[2], s) and np.array_equal(d[1], t)
    with pytest.raises(ValueError):
        M.spatial_temporal(lat, heads=["spatial", "diagonal"])


def test_spatial_temporal_densities_on_wan():
    lat = (21, 30, 52)
    s = M.spatial_temporal(lat).mask.density
    t = M.spatial_temporal(lat, heads="temporal").mask.density
    assert s == t and 0.12 < s < 0.2


def brute_radial(latent, block, dense_distance=1, sink=True):
    """The documented token rule, token pair by token pair (broadcast)."""
    T, H, W = latent
    F = H * W
    t, h, w = coords(latent)
    s = h * W + w
    d = np.abs(t[:, None] - t[None, :])
    tk = np.broadcast_to(t[None, :], d.shape)
    ds = np.abs(s[:, None] - s[None, :])
    k = np.zeros_like(d)
    for j in range(1, 40):
        k[d >= 2 ** j] = j
    k0 = next(j for j in range(1, 64) if F // 2 ** (j + 1) < block)
    band = (k < k0) & (ds <= F // 2 ** (k + 1))
    sub = (k >= k0) & (tk % 2 ** np.maximum(k - k0 + 1, 0) == 0) & (ds <= F // 2 ** k0)
    rule = (d <= dense_distance) | band | sub
    if sink:
        rule |= tk == 0
    return rule


@pytest.mark.parametrize("latent,block,dd,sink", [
    ((12, 4, 8), 4, 1, True), ((12, 4, 8), 5, 1, False), ((9, 3, 7), 6, 2, True),
    ((17, 2, 5), 3, 1, True), ((6, 5, 5), 8, 0, False)])
def test_radial_against_brute_force(latent, block, dd, sink):
    n = int(np.prod(latent))
    b = uniform(n, block)
    got = dense(M.radial(latent, block=block, dense_distance=dd, sink_frame=sink))[0, 0]
    assert np.array_equal(got, to_blocks(brute_radial(latent, block, dd, sink), b, b))


def test_radial_frame_rule_hand():
    # F = 32, block 4: octave 1 (d 2-3) half-width 8, octave 2 (d 4-7) 4, then k0 = 3:
    # octave 3 (d 8-15) keeps even key frames with half-width 4.
    r = M.radial_frame_rule(12, 32, block=4)
    assert r[11].tolist() == [32, -1, 4, -1, 4, 4, 4, 4, 8, 8, 32, 32]
    assert r[0].tolist() == [32, 32, 8, 8, 4, 4, 4, 4, 4, -1, 4, -1]


def test_radial_structure():
    lat, block = (12, 4, 8), 4
    vm = M.radial(lat, block=block)
    d = dense(vm)[0, 0]
    F = 32
    b = vm.mask.q_bounds
    frame_of_block = b[:-1] // F
    # the sink frame column is selected for every query block
    assert d[:, frame_of_block == 0].all()
    # frame pairs at distance <= 1 are dense
    fq, fk = frame_of_block[:, None], frame_of_block[None, :]
    assert d[np.abs(fq - fk) <= 1].all()
    # without sink and subsampling (few frames) the mask is symmetric
    d2 = dense(M.radial((4, 4, 8), block=4, sink_frame=False))[0, 0]
    assert np.array_equal(d2, d2.T)
    assert not d2.all()
    # decay: selected blocks per row shrink with distance (frame 0 row vs frame 11 column)
    per_frame = np.add.reduceat(d.astype(int), np.arange(0, d.shape[1], F // block), axis=1)
    assert per_frame[0, 2] >= per_frame[0, 4] >= per_frame[0, 8]


def test_radial_density_on_wan():
    for lat in [(21, 30, 52), (21, 45, 80)]:
        assert 0.2 <= M.radial(lat).mask.density <= 0.5


def brute_pooled(q, k, latent, cube):
    """Cube members (original indices, frame-major order), pooled q/k, scores."""
    T, H, W = latent
    ct, ch, cw = cube
    members = []
    for a in range(-(-T // ct)):
        for b in range(-(-H // ch)):
            for c in range(-(-W // cw)):
                members.append([(t * H + h) * W + w
                                for t in range(a * ct, min(T, (a + 1) * ct))
                                for h in range(b * ch, min(H, (b + 1) * ch))
                                for w in range(c * cw, min(W, (c + 1) * cw))])
    pq = np.stack([q[..., m, :].astype(np.float64).mean(-2) for m in members], -2)
    pk = np.stack([k[..., m, :].astype(np.float64).mean(-2) for m in members], -2)
    scores = pq @ np.swapaxes(pk, -1, -2) / math.sqrt(q.shape[-1])
    return members, scores


def test_topk_pooled_against_brute_force():
    lat, cube = (5, 6, 7), (4, 4, 4)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 210, 8)).astype(np.float32)
    k = rng.standard_normal((2, 3, 210, 8)).astype(np.float32)
    vm = M.topk_pooled(q, k, lat, cube=cube, topk=3)
    members, scores = brute_pooled(q, k, lat, cube)
    # cube sizes: t extents [4,1], h [4,2], w [4,3]
    assert np.diff(vm.mask.q_bounds).tolist() == [len(m) for m in members]
    assert [a * b * c for a in (4, 1) for b in (4, 2) for c in (4, 3)] == [len(m) for m in members]
    assert np.array_equal(vm.permutation, np.concatenate(members))
    expect = np.zeros(scores.shape, bool)
    top = np.argsort(-scores, axis=-1)[..., :3]
    np.put_along_axis(expect, top, True, axis=-1)
    d = dense(vm)
    assert vm.mask.batch_heads == (2, 3)
    assert np.array_equal(d, expect)
    assert (d.sum(-1) == 3).all()


def test_topk_pooled_on_tokens_already_in_cube_order():
    """``ordered=True`` (q/k already permuted into cube order, each cube contiguous) selects the
    same cubes as pooling the original order, with top-k and with top-p, and text at the end."""
    lat, cube = (5, 6, 7), (4, 4, 4)
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((1, 2, 210 + 9, 8)).astype(np.float32) for _ in range(2))
    for kw in (dict(topk=2), dict(top_p=0.5)):
        base = M.topk_pooled(q, k, lat, cube=cube, text_tokens=9, text_valid=5, **kw)
        perm = base.permutation
        ordered = M.topk_pooled(q[:, :, perm], k[:, :, perm], lat, cube=cube, text_tokens=9,
                                text_valid=5, ordered=True, **kw)
        assert np.array_equal(dense(ordered), dense(base))
        assert np.array_equal(ordered.mask.q_bounds, base.mask.q_bounds)


def _token_pairs(vm: M.VideoMask, h: int = 0) -> np.ndarray:
    """The (query, key) token pairs ``vm`` selects for head ``h``, in the tokens' own order."""
    blocks = dense(vm)[0, h]
    tok = np.repeat(np.repeat(blocks, np.diff(vm.mask.q_bounds), axis=0),
                    np.diff(vm.mask.kv_bounds), axis=1)
    out = np.zeros_like(tok)
    perm = np.arange(tok.shape[0]) if vm.permutation is None else vm.permutation
    out[np.ix_(perm, perm)] = tok
    return out


@pytest.mark.parametrize("valid", [None, 4, 0])
@pytest.mark.parametrize("kw", [dict(topk=3), dict(top_p=0.7)], ids=["topk", "top_p"])
def test_topk_pooled_reads_text_first_in_place(kw, valid):
    """``text_first=True`` on a sequence whose text precedes the video selects the token pairs
    the text-last call selects on the same tokens: the video read where it is, the text blocks
    (valid text, padding) put first, the permutation's text identity first."""
    lat, cube, t = (3, 5, 6), (2, 2, 4), 6
    nv = int(np.prod(lat))
    rng = np.random.default_rng(8)
    q, k = (rng.standard_normal((1, 2, t + nv, 8)).astype(np.float32) for _ in range(2))
    last = np.r_[t:t + nv, 0:t]  # the text-last sequence's tokens, as positions of q
    first = M.topk_pooled(q, k, lat, cube=cube, text_tokens=t, text_valid=valid,
                          text_first=True, **kw)
    ref = M.topk_pooled(q[:, :, last], k[:, :, last], lat, cube=cube, text_tokens=t,
                        text_valid=valid, **kw)
    assert is_permutation(first.permutation, t + nv)
    assert np.array_equal(first.permutation[:t], np.arange(t))
    for h in range(2):
        want = np.zeros((t + nv, t + nv), dtype=bool)
        want[np.ix_(last, last)] = _token_pairs(ref, h)
        assert np.array_equal(_token_pairs(first, h), want)


def test_topk_pooled_top_p_rule():
    lat, cube = (5, 6, 7), (4, 4, 4)
    rng = np.random.default_rng(1)
    q = 3 * rng.standard_normal((2, 210, 16)).astype(np.float32)
    k = 3 * rng.standard_normal((2, 210, 16)).astype(np.float32)
    for top_p in (0.3, 0.6, 0.9, 1.0):
        d = dense(M.topk_pooled(q, k, lat, cube=cube, top_p=top_p))[0]
        _, scores = brute_pooled(q, k, lat, cube)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        for h in range(2):
            for i in range(p.shape[1]):
                order = np.argsort(-p[h, i])
                n_keep = int(np.searchsorted(np.cumsum(p[h, i][order]), top_p - 1e-12)) + 1
                n_keep = min(n_keep, p.shape[2])
                assert set(np.nonzero(d[h, i])[0]) == set(order[:n_keep]), (top_p, h, i)
                kept = np.sort(p[h, i][d[h, i]])
                assert kept.sum() >= top_p - 1e-9 and kept.sum() - kept[0] < top_p


def test_topk_pooled_gqa_and_3d_input_and_default():
    lat, cube = (4, 4, 8), (2, 2, 2)
    rng = np.random.default_rng(2)
    q = rng.standard_normal((4, 128, 8)).astype(np.float32)
    k = rng.standard_normal((2, 128, 8)).astype(np.float32)
    vm = M.topk_pooled(q, k, lat, cube=cube, topk=2)
    ref = M.topk_pooled(q, np.repeat(k, 2, axis=0), lat, cube=cube, topk=2)
    assert vm.mask.batch_heads == (1, 4)
    assert np.array_equal(dense(vm), dense(ref))
    d = M.topk_pooled(q, k, lat, cube=cube)  # default: 10% of 16 cubes -> topk 2
    assert d.params["topk"] == 2
    with pytest.raises(ValueError):
        M.topk_pooled(q, k, lat, cube=cube, topk=2, top_p=0.5)
    with pytest.raises(ValueError):
        M.topk_pooled(q[:, :100], k[:, :100], lat, cube=cube)


def test_semantic_clusters_find_separated_clusters():
    rng = np.random.default_rng(3)
    q, k, lq, lk = separated_qk(rng)
    vm = M.semantic_clusters(q, k, 3, 4, top_p=0.9, min_fraction=0.0, iters=10)
    assert is_permutation(vm.permutation, 60) and is_permutation(vm.kv_permutation, 60)
    for p, lab, b in ((vm.permutation, lq, vm.mask.q_bounds),
                      (vm.kv_permutation, lk, vm.mask.kv_bounds)):
        groups = [set(lab[p[b[i]:b[i + 1]]]) for i in range(b.size - 1)]
        assert all(len(g) == 1 for g in groups)
        assert sorted(np.diff(b).tolist()) == sorted(np.bincount(lab).tolist())
        for i in range(b.size - 1):  # stable: original order inside a cluster
            assert (np.diff(p[b[i]:b[i + 1]]) > 0).all()


def check_selection(vm, q, k, top_p, min_fraction):
    """Recompute the documented selection from the returned clusters."""
    qb, kb = vm.mask.q_bounds, vm.mask.kv_bounds
    qp = q[..., vm.permutation, :].astype(np.float64)
    kp = k[..., vm.kv_permutation, :].astype(np.float64)
    cq = np.stack([qp[..., qb[i]:qb[i + 1], :].mean(-2) for i in range(qb.size - 1)], -2)
    ck = np.stack([kp[..., kb[i]:kb[i + 1], :].mean(-2) for i in range(kb.size - 1)], -2)
    logits = cq @ np.swapaxes(ck, -1, -2) / math.sqrt(q.shape[-1]) + np.log(np.diff(kb))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    d = dense(vm)[0]
    n_k = kb.size - 1
    m = math.ceil(min_fraction * n_k - 1e-9)
    for h in range(p.shape[0]):
        for i in range(p.shape[1]):
            order = np.argsort(-p[h, i])
            n_mass = min(int(np.searchsorted(np.cumsum(p[h, i][order]), top_p - 1e-12)) + 1, n_k)
            expect = set(order[:max(n_mass, m, 1)])
            assert set(np.nonzero(d[h, i])[0]) == expect, (h, i)
            assert d[h, i].sum() >= m


def test_semantic_clusters_cumulative_probability_rule():
    rng = np.random.default_rng(4)
    q, k, _, _ = separated_qk(rng)
    for top_p, mf in ((0.9, 0.0), (0.5, 0.5), (0.99, 0.1)):
        vm = M.semantic_clusters(q, k, 3, 4, top_p=top_p, min_fraction=mf)
        check_selection(vm, q, k, top_p, mf)
    # random data, more clusters, batch of 2
    qr = rng.standard_normal((2, 2, 200, 8)).astype(np.float32)
    kr = 2 * rng.standard_normal((2, 2, 200, 8)).astype(np.float32)
    vm = M.semantic_clusters(qr, kr, 7, 20, top_p=0.7, min_fraction=0.1)
    assert vm.mask.batch_heads == (2, 2)
    d = dense(vm)
    assert (d.sum(-1) >= math.ceil(0.1 * (vm.mask.kv_bounds.size - 1))).all()
    check_selection(M.VideoMask(vm.mask, vm.permutation, "", {}, vm.kv_permutation),
                    qr[0], kr[0], 0.7, 0.1)


def test_semantic_clusters_deterministic_and_min_fraction():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 150, 8)).astype(np.float32)
    k = rng.standard_normal((3, 150, 8)).astype(np.float32)
    a = M.semantic_clusters(q, k, 5, 30, top_p=0.01, min_fraction=0.25, seed=7)
    b = M.semantic_clusters(q, k, 5, 30, top_p=0.01, min_fraction=0.25, seed=7)
    assert np.array_equal(a.permutation, b.permutation)
    assert np.array_equal(dense(a), dense(b))
    n_k = a.mask.kv_bounds.size - 1
    assert (dense(a).sum(-1) == math.ceil(0.25 * n_k)).all()  # top_p tiny: min_fraction binds


def test_random_blocks_density():
    vm = M.random_blocks(4, 128 * 200 - 5, block=128, density=0.1, seed=3)
    assert vm.mask.batch_heads == (1, 4)
    assert vm.mask.seq_len_q == 128 * 200 - 5
    assert abs(vm.mask.density - 0.1) < 0.005
    again = M.random_blocks(4, 128 * 200 - 5, block=128, density=0.1, seed=3)
    assert np.array_equal(dense(vm), dense(again))
    assert M.random_blocks(1, 1000, density=0.5).mask.batch_heads == (1, 1)


def test_random_blocks_with_a_density_a_head():
    """Per-head densities (the mixed-density case): each head keeps its own fraction of the
    blocks; mixed_densities spreads 2%-60% over the heads in a seeded order; a list of the
    wrong length, or a density out of [0, 1], is refused by name."""
    spread = M.mixed_densities(6, seed=2)
    assert sorted(spread) == pytest.approx(np.linspace(0.02, 0.60, 6))
    assert spread != sorted(spread) and spread == M.mixed_densities(6, seed=2)
    vm = M.random_blocks(6, 128 * 300, density=spread, seed=1)
    per_head = dense(vm)[0].mean(axis=(1, 2))
    assert np.allclose(per_head, spread, atol=0.01), per_head
    with pytest.raises(ValueError, match="density: 2 per-head densities for num_heads=3"):
        M.random_blocks(3, 1000, density=[0.1, 0.2])
    with pytest.raises(ValueError, match="density"):
        M.random_blocks(2, 1000, density=[0.1, 1.5])
    with pytest.raises(ValueError, match="spread must be"):
        M.mixed_densities(4, spread=(0.5, 0.1))


@pytest.mark.parametrize("length", [1000, 32_760, 17_776])
def test_variable_bounds_cover_the_sequence_in_sizes_of_the_range(length):
    from tessera.families.common import variable_bounds

    b = variable_bounds(np.random.default_rng(3), length, 32, 256)
    sizes = np.diff(b)
    assert b[0] == 0 and b[-1] == length
    assert (sizes[:-1] >= 32).all() and (sizes <= 256).all() and sizes[-1] >= 1
    assert abs(sizes[:-1].mean() - 144) < 40  # uniform in [32, 256]


def test_random_variable_blocks():
    """sizes=(lo, hi): the same variable blocks for queries and keys, text blocks after them,
    the density as asked, reproducible by seed."""
    vm = M.random_blocks(4, 20_000 + 226, density=0.1, seed=2, text_tokens=226,
                         sizes=(32, 256))
    m = vm.mask
    assert np.array_equal(m.q_bounds, m.kv_bounds) and m.seq_len_q == 20_226
    video = np.diff(m.q_bounds)[:-1]  # the last block is text
    assert m.q_bounds[-2] == 20_000 and (video[:-1] >= 32).all() and (video <= 256).all()
    assert len(set(video.tolist())) > 20
    again = M.random_blocks(4, 20_226, density=0.1, seed=2, text_tokens=226, sizes=(32, 256))
    assert np.array_equal(dense(vm), dense(again))
    other = M.random_blocks(4, 20_226, density=0.1, seed=3, text_tokens=226, sizes=(32, 256))
    assert not np.array_equal(other.mask.q_bounds, m.q_bounds)
    n = m.q_bounds.size - 2
    assert abs(dense(vm)[:, :n, :n].mean() - 0.1) < 0.02
    for bad in ((0, 256), (64, 32), (32,), (32.0, 64), 128):
        with pytest.raises(ValueError, match="sizes must be"):
            M.random_blocks(2, 4000, sizes=bad)
    with pytest.raises(TypeError, match="num_heads must be a positive int"):
        M.random_blocks(True, 4000)
    with pytest.raises(TypeError, match="density must be a number in"):
        M.random_blocks(2, 4000, density="0.1")


def masked_attention_original(q, k, v, tok):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    s = np.where(tok, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("family", ["sta", "temporal", "semantic"])
def test_permuted_attention_equals_original_order_rule(family):
    """Attention in the permuted order, un-permuted, equals masked attention in the original
    order with the token mask the VideoMask describes."""
    rng = np.random.default_rng(6)
    L = 96 + 7
    q = rng.standard_normal((1, 2, L, 8))
    k = rng.standard_normal((1, 2, L, 8))
    v = rng.standard_normal((1, 2, L, 8))
    if family == "semantic":
        vm = M.semantic_clusters(q, k, 6, 8, text_tokens=7, text_valid=4)
    else:
        vm = family_makers()[family](text_tokens=7, text_valid=4)
    out = vm.unpermute_output(reference.attention(vm.permute_q(q), vm.permute_kv(k),
                                                  vm.permute_kv(v), vm.mask))
    tok_perm = expand(dense(vm)[0], vm.mask.q_bounds, vm.mask.kv_bounds)  # [Hm, L, L]
    qi = M.invert_permutation(vm.permutation)
    ki = M.invert_permutation(vm.key_permutation)
    tok = tok_perm[:, qi][:, :, ki]
    assert np.allclose(out, masked_attention_original(q, k, v, tok[None]), atol=1e-10)


@pytest.mark.parametrize("make, kind, words", [
    (lambda: M.sliding_tile((2.5, 8, 8)), TypeError, "latent must be three positive ints"),
    (lambda: M.sliding_tile(("3", 8, 8)), TypeError, "latent must be three positive ints"),
    (lambda: M.sliding_tile((3, 8, 8), tile=(6.0, 8, 8)), TypeError, "tile must be three"),
    (lambda: M.sliding_tile((3, 8, 8), window=(0, 3, 3)), ValueError, "window must be three"),
    (lambda: M.sliding_tile((3, 8, 8), window=5), TypeError, "window must be one value"),
    (lambda: M.sliding_tile((3, 8, 8), text_tokens=2.5), TypeError, "text_tokens must be"),
    (lambda: M.sliding_tile((3, 8, 8), text_tokens=4, text_valid=5), ValueError,
     "text_valid must be None or an int in"),
    (lambda: M.radial((3, 8, 8), block=-1), ValueError, "block must be a positive int"),
    (lambda: M.radial((3, 8, 8), block="128"), TypeError, "block must be a positive int"),
    (lambda: M.radial((3, 8, 8), dense_distance=1.5), TypeError, "dense_distance must be"),
    (lambda: M.radial((3, 8, 8), sink_frame="yes"), TypeError, "sink_frame must be"),
    (lambda: M.spatial_temporal((3, 8, 8), width=1.5), TypeError, "width must be"),
    (lambda: M.spatial_temporal((3, 8, 8), heads=3), TypeError, "heads must be one value"),
    (lambda: M.spatial_temporal((3, 8, 8), heads=[]), ValueError, "heads: a per-head list"),
    (lambda: M.random_blocks(2, 4000.5), TypeError, "seq_len must be a positive int"),
    (lambda: M.random_blocks(2, 4000, seed=-1), ValueError, "seed must be an int >= 0"),
])
def test_families_refuse_what_they_would_truncate(make, kind, words):
    """A float, a string or a bool where a count belongs is refused, naming the argument: a
    truncated 2.5 made a permutation one token longer than the mask."""
    with pytest.raises(kind, match=words):
        make()


@pytest.mark.parametrize("kw, kind, words", [
    (dict(num_q_clusters=0), ValueError, "num_q_clusters must be a positive int"),
    (dict(num_kv_clusters=2.5), TypeError, "num_kv_clusters must be a positive int"),
    (dict(top_p=2.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(min_fraction=-0.1), ValueError, r"min_fraction must be in \[0, 1\]"),
    (dict(iters=0), ValueError, "iters must be a positive int"),
    (dict(text_tokens=1.5), TypeError, "text_tokens must be"),
])
def test_semantic_clusters_checks_its_counts(kw, kind, words):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 96, 16))
    args = dict(num_q_clusters=4, num_kv_clusters=4) | kw
    with pytest.raises(kind, match=words):
        M.semantic_clusters(q, q, **args)


@pytest.mark.parametrize("kw, kind, words", [
    (dict(topk=0), ValueError, "topk must be a positive int"),
    (dict(topk=2.0), TypeError, "topk must be a positive int"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p="0.5"), TypeError, "top_p must be a number"),
    (dict(cube=(4, 4, 4.5)), TypeError, "cube must be three positive ints"),
    (dict(ordered="no"), TypeError, "ordered must be True or False"),
])
def test_topk_pooled_checks_its_arguments(kw, kind, words):
    q = np.random.default_rng(0).standard_normal((1, 2, 4 * 8 * 8, 16))
    with pytest.raises(kind, match=words):
        M.topk_pooled(q, q, (4, 8, 8), **kw)


@pytest.mark.parametrize("perm", [[0, 0, 1], [0, 1, 3], [-1, 0, 1], [[0, 1]], [0.0, 1.0]])
def test_inverting_what_is_not_a_permutation_is_refused(perm):
    """The inverse of a non-permutation would leave entries unwritten (uninitialised memory)."""
    with pytest.raises(ValueError, match="perm must"):
        M.invert_permutation(np.asarray(perm))
    good = np.array([2, 0, 1])
    np.testing.assert_array_equal(M.invert_permutation(good)[good], np.arange(3))
