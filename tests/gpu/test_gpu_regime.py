"""GPU tests of regime profiling and mask measures on the device."""

from __future__ import annotations

import numpy as np
import pytest

from tessera import BlockMask
from tessera.cuda import device as D
from tessera.runtime.regime import RegimeTable, mask_measures
from tessera.tools.cli import main
from tests.runtime.regime.regime_helpers import clean_selection  # noqa: F401 (autouse fixture)


@pytest.mark.gpu
def test_short_profile_on_the_gpu_writes_a_valid_table(tmp_path, capsys):
    """``profile --budget-minutes 1`` on a small corpus: a loadable table for this GPU whose
    entries hold measured candidates."""
    pytest.importorskip("torch")

    out = tmp_path / "t.json"
    rc = main(["profile", "--out", str(out), "--budget-minutes", "1", "--shapes",
               "cogvideox-5b", "--families", "radial,spatial_temporal", "--reps", "3"])
    assert rc == 0, capsys.readouterr().out
    t = RegimeTable.load(out)
    assert len(t) >= 1 and t.gpu and t.arch == D.device_arch()
    for e in t.entries:
        assert len(e["candidates"]) >= 18 and e["oracle_ms"] > 0
        assert e["ms"] >= e["oracle_ms"] * 0.999
        assert e["name"] in e["candidates"]


@pytest.mark.gpu
def test_device_measures_on_the_gpu():
    """The mask_pairs kernel measures device masks exactly as the host path measures the same
    selections (uniform, ragged, variable with a heavy row, per batch and head, empty)."""
    import cupy as cp

    rng = np.random.default_rng(11)
    variable = dict(q_bounds=np.r_[0, np.cumsum(rng.integers(8, 300, 40))],
                    kv_bounds=np.r_[0, np.cumsum(rng.integers(8, 200, 70))])
    heavy = rng.random((3, 40, 70)) < 0.1
    heavy[2, 7] = True
    cases = [(rng.random((12, 256, 256)) < 0.1, dict(block_size=128)),
             (rng.random((2, 30, 33)) < 0.3, dict(block_size=64, seq_len_q=1900,
                                                  seq_len_kv=2100)),
             (heavy, variable), (rng.random((2, 3, 40, 70)) < 0.5, variable),
             (np.zeros((2, 5, 5), bool), dict(block_size=64))]
    for dense, geo in cases:
        want = mask_measures(BlockMask.from_dense(dense, **geo))
        assert mask_measures(BlockMask.from_dense(cp.asarray(dense), **geo)) == want


@pytest.mark.gpu
def test_a_dense_device_mask_is_chosen_for_without_a_readback(monkeypatch):
    """At head dim 64 a dense host mask takes 192-row tiles (a half-dense one 128-row tiles),
    but the same mask on the device keeps the 64-row tiles, decided by its geometry: counting
    its blocks would be a readback, which a request at a model's shape never waits for."""
    import cupy as cp

    from tessera.runtime.regime import heuristic as H
    from tessera.runtime.regime import selection as S

    full = np.ones((2, 20, 20), bool)
    host = BlockMask.from_dense(full, block_size=128)
    assert S.heuristic_choice(host, 90, 64) == (H.SM90_ROWS192_D64, True)
    half = np.random.default_rng(5).random((2, 20, 20)) < 0.5
    assert S.heuristic_choice(BlockMask.from_dense(half, block_size=128), 90, 64) == (
        H.SM90_ROWS128, True)
    monkeypatch.setattr(H, "selects_every_block", lambda m: pytest.fail("read the mask"))
    monkeypatch.setattr(S, "selects_every_block", lambda m: pytest.fail("read the mask"))
    monkeypatch.setattr(BlockMask, "density",
                        property(lambda m: pytest.fail("read the mask's density")))
    for blocks in (full, half):
        dev = BlockMask.from_dense(cp.asarray(blocks), block_size=128)
        assert S.heuristic_choice(dev, 90, 64) == (H.SM90_ROWS64_D64, False)
