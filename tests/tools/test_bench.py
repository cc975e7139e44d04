"""CPU tests of ``python -m tessera bench``'s mask cases (the timing needs a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.tools import bench


@pytest.mark.parametrize("length", [1000, 32_760, 17_776])
def test_variable_bounds_cover_the_sequence_in_sizes_of_the_range(length):
    rng = np.random.default_rng(3)
    b = bench._variable_bounds(rng, length, 32, 256)
    sizes = np.diff(b)
    assert b[0] == 0 and b[-1] == length
    assert (sizes[:-1] >= 32).all() and (sizes <= 256).all() and sizes[-1] >= 1
    assert abs(sizes[:-1].mean() - 144) < 40  # uniform in [32, 256]


@pytest.mark.parametrize("name", list(bench.CASES))
def test_every_case_makes_a_block_matrix_near_its_density(name):
    rng = np.random.default_rng(0)
    m = bench.CASES[name].make(rng, 2, 60)
    assert m.dtype == bool and m.shape == (2, 60, 60)
    want = {"dense": 1.0, "band-16": None}.get(name)
    if name not in ("dense", "band-16"):
        want = float(name.split("-")[-1]) / 100
    if want is not None:
        assert abs(m.mean() - want) < 0.03, m.mean()
