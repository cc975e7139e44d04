"""CPU tests of mask features (tessera.runtime.regime.features): measures, buckets and keys."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tessera import BlockMask
from tessera.runtime.regime import MaskFeatures, mask_features, mask_measures
from tessera.runtime.regime import features as F
from tests.runtime.regime.regime_helpers import (
    clean_selection,  # noqa: F401 (autouse fixture)
    feats,
)


def brute_measures(dense: np.ndarray, qb: np.ndarray, kb: np.ndarray) -> tuple[float, float]:
    """Token-pair density and heaviest/mean row, by expanding every row of ``dense``."""
    qlen, klen = np.diff(qb), np.diff(kb)
    rows = dense.reshape(-1, dense.shape[-1])
    pairs = np.array([qlen[i % qlen.size] * klen[r].sum() for i, r in enumerate(rows)])
    n_bh = rows.shape[0] // qlen.size
    return pairs.sum() / (n_bh * qb[-1] * kb[-1]), pairs.max() / pairs.mean()


def test_features_uniform_128_known_density_and_balance():
    rng = np.random.default_rng(0)
    dense = np.zeros((4, 8, 8), bool)
    for h in range(4):
        for i in range(8):
            dense[h, i, rng.choice(8, 4, replace=False)] = True  # half of every row
    m = BlockMask.from_dense(dense, block_size=128)
    meas = mask_measures(m)
    assert m._indptr is None  # measured from the dense rows: the CSR was not derived
    assert meas.density == pytest.approx(0.5) and meas.imbalance == pytest.approx(1.0)
    assert meas.uniform == (128, 128) and meas.seq_len == 1024 and meas.q_block == 128
    f = mask_features(m, head_dim=128, dtype="bfloat16", arch=90, num_q_heads=4, batch=1)
    assert (f.geometry, f.seq_len, f.density, f.imbalance, f.batch_heads) == \
        ("uniform-128x128", "<=16k", "30-60%", "<1.5", "<=16")
    # The same selection through CSR gives the same measures.
    csr = BlockMask(m.q_bounds, m.kv_bounds, m.indptr, m.indices, m.batch_heads)
    assert mask_measures(csr) == meas


def _np_mask_pairs(grid, block, args):
    """numpy stand-in for plan.cu's mask_pairs (out[0] += pairs, out[1] = max, per row)."""
    dense, n_rows, n_kv, n_q, qb, kb, out = args
    for r in range(int(n_rows)):
        i = r % int(n_q)
        pairs = int(np.diff(kb)[dense[r].astype(bool)].sum()) * int(qb[i + 1] - qb[i])
        out[0] += np.uint64(pairs)
        out[1] = max(int(out[1]), pairs)


def test_device_measures_equal_host_measures(monkeypatch):
    """The one-kernel device path (kernel replaced by its numpy stand-in) measures uniform,
    ragged, variable, per-head and empty masks exactly as the host path does."""
    from tessera.cuda import loader
    from tessera.runtime import mapping

    rng = np.random.default_rng(7)
    variable = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(8, 300, 10))],
                    kv_bounds=np.r_[0, np.cumsum(rng.integers(8, 200, 13))])
    heavy = rng.random((3, 10, 13)) < 0.2
    heavy[1, 4] = True  # one row far heavier than the rest
    masks = [BlockMask.from_dense(rng.random((4, 9, 9)) < 0.4, block_size=128),
             BlockMask.from_dense(rng.random((2, 8, 8)) < 0.3, block_size=128, seq_len_q=1000,
                                  seq_len_kv=900),
             BlockMask.from_dense(heavy, **variable),
             BlockMask.from_dense(rng.random((2, 3, 10, 13)) < 0.5, **variable),
             BlockMask.from_dense(np.zeros((2, 5, 5), bool), block_size=64)]
    host = [mask_measures(m) for m in masks]
    assert host[2].imbalance > 2
    calls = []
    monkeypatch.setattr(loader, "load_kernel", lambda v: calls.append(v.kernel) or _np_mask_pairs)
    monkeypatch.setattr(mapping, "use_device_planner", lambda xp: True)
    for m, want in zip(masks, host):
        assert mask_measures(m) == want
    assert calls == ["mask_pairs"] * len(masks)
    # A mask given as CSR only (no dense rows) keeps the array path.
    csr = BlockMask(masks[0].q_bounds, masks[0].kv_bounds, masks[0].indptr, masks[0].indices,
                    masks[0].batch_heads)
    assert mask_measures(csr) == host[0] and len(calls) == len(masks)


def test_features_ragged_and_variable_match_brute_force():
    rng = np.random.default_rng(1)
    # Ragged: 1000 query and 900 key tokens in 128-token blocks (short last blocks).
    dense = rng.random((2, 8, 8)) < 0.3
    m = BlockMask.from_dense(dense, block_size=128, seq_len_q=1000, seq_len_kv=900)
    meas = mask_measures(m)
    dens, imb = brute_measures(dense, m.q_bounds, m.kv_bounds)
    assert meas.density == pytest.approx(dens) and meas.imbalance == pytest.approx(imb)
    assert meas.uniform == (128, 128) and meas.seq_len == 1000
    # Variable blocks on both axes: the dense path's weighted sum, and the CSR path.
    qb = np.array([0, 30, 80, 140, 340, 410])
    kb = np.array([0, 100, 130, 300, 310, 500, 512])
    dense = rng.random((3, 5, 6)) < 0.5
    dense[0, 0] = False  # an empty row
    m = BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    meas = mask_measures(m)
    assert m._indptr is None
    dens, imb = brute_measures(dense, qb, kb)
    assert meas.density == pytest.approx(dens) and meas.imbalance == pytest.approx(imb)
    assert mask_measures(BlockMask(m.q_bounds, m.kv_bounds, m.indptr, m.indices,
                                   m.batch_heads)) == meas
    assert meas.uniform is None and meas.q_block == 60.0
    f = mask_features(m, head_dim=64, dtype="float16", arch=80, num_q_heads=6, batch=3)
    assert f.geometry == "variable-64" and f.batch_heads == "17-64" and f.dtype == "float16"


def test_features_heavy_rows_and_buckets():
    dense = np.zeros((1, 16, 16), bool)
    dense[0, np.arange(16), np.arange(16)] = True  # diagonal: one block a row
    m = BlockMask.from_dense(dense, block_size=64)
    assert mask_measures(m).imbalance == pytest.approx(1.0)
    dense[0, 3] = True  # one row selects everything: 16 / (31/16) = 8.3 x the mean
    meas = mask_measures(BlockMask.from_dense(dense, block_size=64))
    assert meas.imbalance == pytest.approx(16 / (31 / 16))
    f = mask_features(BlockMask.from_dense(dense, block_size=64), head_dim=128, dtype="bf16",
                      arch=90, num_q_heads=40, batch=2)
    assert (f.geometry, f.imbalance, f.batch_heads, f.dtype) == \
        ("uniform-64x64", ">=3", ">64", "bfloat16")
    dense[0, 3] = False
    dense[0, 3, :4] = True  # 4 / (19/16) = 3.4; with 3 blocks 3/(18/16) = 2.7
    dense[0, 3, 3] = False
    assert mask_features(BlockMask.from_dense(dense, block_size=64), head_dim=128,
                         dtype="bfloat16", arch=90, num_q_heads=1, batch=1).imbalance == "1.5-3"
    empty = BlockMask.from_dense(np.zeros((2, 3), bool), block_size=(256, 512))
    f = mask_features(empty, head_dim=64, dtype="bfloat16", arch=90, num_q_heads=1, batch=1)
    assert (f.geometry, f.density, f.imbalance) == ("uniform-256x384+", "0-5%", "<1.5")


def test_bucket_edges():
    assert [F.block_bucket(b) for b in (16, 64, 65, 128, 129, 256, 384, 4096)] == \
        ["64", "64", "128", "128", "256", "256", "384+", "384+"]
    sb = lambda n: F._bucket(n, F._SEQ_EDGES, F.SEQ_BUCKETS, True)  # noqa: E731
    assert [sb(n) for n in (1000, 16384, 16385, 32768, 75_000, 131072, 200_000)] == \
        ["<=16k", "<=16k", "<=32k", "<=32k", "<=128k", "<=128k", ">128k"]
    db = lambda d: F._bucket(d, F._DENSITY_EDGES, F.DENSITY_BUCKETS, False)  # noqa: E731
    assert [db(d) for d in (0, 0.049, 0.05, 0.15, 0.3, 0.59, 0.6, 1.0)] == \
        ["0-5%", "0-5%", "5-15%", "15-30%", "30-60%", "30-60%", "60-100%", "60-100%"]


def test_feature_key_is_stable_and_round_trips():
    f = feats()
    # The key is the table's index: changing its spelling breaks every committed table.
    assert f.key() == "sm90/d128/bfloat16/uniform-128x128/L<=32k/p5-15%/r<1.5/bh<=16"
    assert feats().key() == f.key() and feats(density="0-5%").key() != f.key()
    assert MaskFeatures.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    m = BlockMask.from_dense(np.eye(8, dtype=bool), block_size=128)
    k1 = mask_features(m, head_dim=128, dtype="bfloat16", arch=90, num_q_heads=2, batch=1).key()
    k2 = mask_features(BlockMask.from_dense(np.eye(8, dtype=bool), block_size=128),
                       head_dim=128, dtype="bfloat16", arch=90, num_q_heads=2, batch=1).key()
    assert k1 == k2


def test_mask_geometry_is_the_features_geometry_from_the_bounds_alone(monkeypatch):
    """What a plan asks a table before measuring: the same geometry feature, without a read."""
    rng = np.random.default_rng(4)
    masks = [BlockMask.from_dense(rng.random((2, 8, 8)) < 0.3, block_size=128,
                                  seq_len_q=1000, seq_len_kv=900),
             BlockMask.from_dense(rng.random((1, 5, 6)) < 0.5,
                                  q_bounds=np.array([0, 30, 80, 140, 340, 410]),
                                  kv_bounds=np.array([0, 100, 130, 300, 310, 500, 512])),
             BlockMask.from_dense(rng.random((1, 4, 2)) < 0.5, q_bounds=np.arange(0, 257, 64),
                                  kv_bounds=np.array([0, 256, 512]))]
    want = [mask_features(m, head_dim=128, dtype="bfloat16", arch=90, num_q_heads=2,
                          batch=1).geometry for m in masks]
    assert want == ["uniform-128x128", "variable-64", "uniform-64x256"]
    monkeypatch.setattr(F, "mask_measures", lambda m: pytest.fail("measured the mask"))
    assert [F.mask_geometry(m) for m in masks] == want
