"""Regime selection cost on the host: pytest-benchmark suites.

``RegimeTable.lookup`` on a synthetic table of 100 entries (exact hit, and a key answered by
the nearest entry), and ``mask_features`` on a Wan-1.3B-shaped host mask (12 heads, 32,760
tokens, 10% block density, random seed 0) built from a dense matrix (measured from its dense
rows) and from CSR arrays.

    PYTHONPATH=. python -m pytest benchmarks/test_bench_regime.py --benchmark-enable -q

(pyproject's addopts disable benchmarks, so a plain test run executes each body once.) No
assertion is made on time.
"""

from __future__ import annotations

import itertools
import json

import pytest

from tessera import BlockMask
from tessera.runtime.regime import MaskFeatures, RegimeTable, candidate_regimes, mask_features
from tessera.runtime.regime.features import DENSITY_BUCKETS, SEQ_BUCKETS

# The same Wan-1.3B-shaped mask as the planning benchmark (pytest puts benchmarks/ on the path).
from test_bench_plan import HEAD_DIM, HEADS, SEQ_LEN, wan_dense  # noqa: E402


def synthetic_table() -> RegimeTable:
    """100 entries: 4 geometries x 5 densities x 5 sequence lengths, head dim 128, sm_90,
    every other (density, seq_len) cell left out so half the keys resolve to a neighbour."""
    regimes = candidate_regimes(HEAD_DIM, 90)
    entries = []
    cells = itertools.product(("uniform-128x128", "uniform-64x64", "variable-64",
                               "variable-384+"), DENSITY_BUCKETS, SEQ_BUCKETS, ("<1.5", ">=3"))
    for i, (geo, dens, seq, imb) in enumerate(cells):
        if (DENSITY_BUCKETS.index(dens) + SEQ_BUCKETS.index(seq)) % 2:
            continue
        f = MaskFeatures(90, HEAD_DIM, "bfloat16", geo, seq, dens, imb, "<=16")
        entries.append(dict(features=f.to_dict(), regime=regimes[i % len(regimes)].to_dict(),
                            ms=1.0 + i, oracle_ms=1.0 + i))
    return RegimeTable(entries, {"gpu": "synthetic", "arch": 90})


@pytest.fixture(scope="module")
def table() -> RegimeTable:
    return synthetic_table()


@pytest.fixture(scope="module")
def wan_features() -> MaskFeatures:
    m = BlockMask.from_dense(wan_dense(128), block_size=128, seq_len_q=SEQ_LEN,
                             seq_len_kv=SEQ_LEN)
    return mask_features(m, head_dim=HEAD_DIM, dtype="bfloat16", arch=90, num_q_heads=HEADS,
                         batch=1)


@pytest.mark.parametrize("kind", ["exact", "nearest"])
def test_bench_lookup(benchmark, table, wan_features, kind):
    f = wan_features
    if kind == "nearest":  # a density bucket with no entry at this seq_len: a neighbour's
        f = MaskFeatures(**{**f.to_dict(), "density": "0-5%", "seq_len": "<=32k"})
    else:  # the Wan mask's own features but with an imbalance bucket the table has
        f = MaskFeatures(**{**f.to_dict(), "imbalance": "<1.5"})
    assert (table.lookup_exact(f) is not None) == (kind == "exact")
    benchmark.group = "regime lookup"
    benchmark.extra_info.update(entries=len(table), key=f.key())
    regime = benchmark(table.lookup, f)
    assert regime is not None


@pytest.mark.parametrize("source", ["dense", "csr"])
def test_bench_mask_features_wan(benchmark, source):
    m = BlockMask.from_dense(wan_dense(128), block_size=128, seq_len_q=SEQ_LEN,
                             seq_len_kv=SEQ_LEN)
    if source == "csr":
        m = BlockMask(m.q_bounds, m.kv_bounds, m.indptr, m.indices, m.batch_heads)
    benchmark.group = "mask features"
    benchmark.extra_info.update(source=source, nnz=m.nnz)
    f = benchmark(lambda: mask_features(m, head_dim=HEAD_DIM, dtype="bfloat16", arch=90,
                                        num_q_heads=HEADS, batch=1))
    assert f.geometry == "uniform-128x128" and f.density == "5-15%"
    if source == "dense":
        assert m._indptr is None  # features never derived the CSR arrays


def test_bench_lookup_h200_table(benchmark, wan_features):
    """The committed H200 table (smoothed vote, precomputed): a Wan-shaped key."""
    from tessera.runtime.regime import TABLES_DIR

    t = RegimeTable.load(TABLES_DIR / "nvidia-h200.json")
    benchmark.group = "regime lookup"
    benchmark.extra_info.update(entries=len(t), key=wan_features.key())
    assert benchmark(t.lookup, wan_features) is not None


def test_bench_load_h200_table(benchmark):
    """Loading (and precomputing every answer of) the committed H200 table: once a process."""
    from tessera.runtime.regime import TABLES_DIR

    benchmark.group = "regime table load"
    path = TABLES_DIR / "nvidia-h200.json"
    t = benchmark(RegimeTable.load, path)
    assert len(t) == len(json.loads(path.read_text())["entries"])  # every entry kept
