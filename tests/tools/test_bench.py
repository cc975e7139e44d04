"""``python -m tessera bench``: its mask cases and argument checks (CPU), and one small run
timing the kernels in interleaved rounds (GPU)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from tessera.tools import bench


@pytest.mark.parametrize("name", sorted(bench.CASES))
def test_every_case_makes_its_density(name):
    """Each case's block matrix has the shape asked and the density its name says (band-16: a
    band of 8% of the blocks each side, dense: all), drawn from the caller's generator."""
    case = bench.CASES[name]
    n = 200
    a = case.make(np.random.default_rng(1), 3, n)
    b = case.make(np.random.default_rng(1), 3, n)
    assert a.shape == (3, n, n) and a.dtype == bool and np.array_equal(a, b)
    want = {"random-10": 0.10, "random-30": 0.30, "dense": 1.0, "topk64-10": 0.10,
            "random64-30": 0.30, "variable-10": 0.10, "mixed-heads": 0.31,
            "band-16": (2 * 16 + 1) / n}[name]
    assert abs(a.mean() - want) < 0.02, (name, a.mean())
    if name == "mixed-heads":  # per head: 2%, 31%, 60% in some order
        assert np.allclose(np.sort(a.mean(axis=(1, 2))), [0.02, 0.31, 0.60], atol=0.02)
    if name == "topk64-10":  # top-k: the same count in every row
        assert (a.sum(-1) == round(0.1 * n)).all()


def test_uniform_case_bounds_pad_only_small_blocks():
    """64-token cases run at the length padded to whole blocks, 128-token ones unpadded."""
    CASES = bench.CASES
    b64 = CASES["topk64-10"].bounds(17550)
    assert b64[-1] == 17600 and b64.size == 276 and (np.diff(b64) == 64).all()
    b128 = CASES["random-10"].bounds(17550)
    assert b128[-1] == 17550 and b128.size == 139 and (np.diff(b128)[:-1] == 128).all()
    assert np.diff(b128)[-1] == 17550 - 137 * 128
    assert CASES["random64-30"].bounds(128)[-1] == 128


def test_run_refuses_bad_counts():
    with pytest.raises(ValueError, match="rounds"):
        bench.run(["cogvideox-5b"], ["random-10"], rounds=0)
    with pytest.raises(ValueError, match="reps"):
        bench.run(["cogvideox-5b"], ["random-10"], reps=0)


@pytest.mark.gpu
def test_run_times_the_kernels_in_interleaved_rounds():
    """Tessera's kernel and every peer found are timed in the same rounds: each has one time a
    round, its figure is their median and its ratio is taken against Tessera's."""
    pytest.importorskip("torch")
    (row,) = bench.run(["cogvideox-5b"], ["random-10"], reps=2, flex=False, heads=2, rounds=3)
    times = row["rounds_ms"]
    assert next(iter(times)) == "tessera"
    assert all(len(t) == 3 and min(t) > 0 for t in times.values())
    assert row["tessera_ms"] == statistics.median(times["tessera"])
    for name in times:
        if name != "tessera":
            assert row[f"{name}_ms"] == statistics.median(times[name])
            assert row[f"kernel_vs_{name}"] == pytest.approx(row[f"{name}_ms"] / row["tessera_ms"])
    assert min(row["tessera_call_ms"], row["tessera_request_ms"], row["tessera_b2b_ms"]) > 0
    assert row.get("sdpa_cudnn_ms", 0) > 0 or row.get("sdpa_flash_ms", 0) > 0
    (bare,) = bench.run(["cogvideox-5b"], ["random-10"], reps=1, flex=False, heads=2,
                        rounds=1, sdpa=False)
    assert not any(key.startswith("sdpa_") for key in bare)
