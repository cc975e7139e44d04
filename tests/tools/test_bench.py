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
