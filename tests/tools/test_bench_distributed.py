"""CPU tests of ``python -m tessera bench --distributed`` (tessera.tools.bench_distributed):
its cases, the modes it times, its table, and what it says without GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.tools import bench_distributed as B
from tessera.tools.bench import main as bench_main


def test_cases_have_the_densities_they_promise():
    rng = np.random.default_rng(0)
    assert abs(B.case_blocks("random-10", rng, 4, 200).mean() - 0.10) < 0.01
    mixed = B.case_blocks("mixed-heads", rng, 24, 200).mean(axis=(1, 2))
    assert mixed.min() < 0.03 and mixed.max() > 0.57
    assert np.allclose(np.sort(mixed), np.linspace(0.02, 0.60, 24), atol=0.01)
    with pytest.raises(ValueError, match="case must be one of"):
        B.case_blocks("band", rng, 4, 10)


def test_modes_for_a_group():
    assert B.modes_for(4, 24) == [("ulysses", None, "pairs"), ("ulysses", None, "heads"),
                                  ("ring", None, "pairs"), ("hybrid", 2, "pairs")]
    assert B.modes_for(8, 4) == [("ring", None, "pairs"), ("hybrid", 4, "pairs")]
    assert B.modes_for(2, 24) == [("ulysses", None, "pairs"), ("ulysses", None, "heads"),
                                  ("ring", None, "pairs")]


def test_table_lists_every_row():
    row = dict(shape="hunyuan-720p", case="mixed-heads", ranks=4, mode="ulysses/plain",
               one_gpu_ms=30.0, max_ms=10.0, mean_ms=8.0, balance=1.4, ring_skipped=0.0,
               speedup=3.0, rel_diff=1e-3)
    text = B.table([row, dict(row, mode="ring", ring_skipped=0.25)])
    lines = text.splitlines()
    assert len(lines) == 3 and "ulysses/plain" in lines[1] and "0.25" in lines[2]
    assert "3.00" in lines[1]


def test_without_gpus_it_says_why(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the bench would run")
    assert bench_main(["--distributed", "--shape", "hunyuan-720p"]) == 1
    assert "needs CUDA GPUs and NCCL" in capsys.readouterr().out


def test_bad_arguments_are_refused(capsys):
    assert bench_main(["--distributed", "--case", "random-30"]) == 2
    assert "unknown case 'random-30'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["--distributed", "--family", "radial"])
    with pytest.raises(SystemExit):
        bench_main(["--distributed", "--shape", "no-such-model"])
