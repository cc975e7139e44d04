"""CPU tests of ``python -m tessera bench``'s mask cases (the timing needs a GPU)."""

from __future__ import annotations

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
            "random64-30": 0.30, "variable-10": 0.10,
            "band-16": (2 * 16 + 1) / n}[name]
    assert abs(a.mean() - want) < 0.02, (name, a.mean())
    if name == "topk64-10":  # top-k: the same count in every row
        assert (a.sum(-1) == round(0.1 * n)).all()
