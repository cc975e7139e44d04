"""``python -m tessera bench --precision int8``: its table and argument checks (CPU), the cuDNN
FP8 peer's eligibility rule (CPU), and one small run (GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.tools import bench, bench_int8, peers


def test_table_shows_a_missing_peer_as_nan():
    row = dict(shape="wan-1.3b-480p", case="random-10", density=0.1, precisions=["int8"],
               int8_ms=0.6, int8_tflops=900.0, bf16_ms=1.0, int8_speedup=1.67, int8_diff=1.5e-2)
    lines = bench_int8.table([row]).splitlines()
    assert len(lines) == 2 and "1.67" in lines[1] and "1.5e-02" in lines[1]
    assert lines[1].count("nan") == 3  # cuDNN FP8's time, its ratio, its difference


def test_table_has_a_line_per_precision():
    row = dict(shape="wan-1.3b-480p", case="random-10", density=0.1, bf16_ms=1.0,
               precisions=["int8", "int8-qk"], cudnn_fp8_ms=0.8, cudnn_fp8_diff=2e-2,
               **{"int8_ms": 0.6, "int8_tflops": 900.0, "int8_speedup": 1.67,
                  "int8_diff": 1.5e-2, "int8_vs_cudnn_fp8": 1.33, "int8-qk_ms": 0.8,
                  "int8-qk_tflops": 700.0, "int8-qk_speedup": 1.25, "int8-qk_diff": 9e-3,
                  "int8-qk_vs_cudnn_fp8": 1.0})
    lines = bench_int8.table([row]).splitlines()
    assert len(lines) == 3 and "int8 " in lines[1] and "int8-qk" in lines[2]
    assert "1.33" in lines[1] and "1.25" in lines[2] and "nan" not in "".join(lines)


def test_precision_takes_only_its_options(capsys):
    for extra in (["--backward"], ["--regime", "x"], ["--host-mask"], ["--png", "x.png"]):
        with pytest.raises(SystemExit):
            bench.main(["--precision", "int8", *extra])
        assert "--precision takes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--precision", "fp8"])
    assert "--precision: 'fp8' is not one of int8, int8-qk" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--precision", "int8,"])
    assert "--precision: '' is not one of" in capsys.readouterr().err


def test_cudnn_fp8_runs_only_fixed_counts_at_head_dim_128():
    """sm90's FP8 forward takes no per-row counts: a mask whose query blocks select different
    numbers of key blocks (random) is left out, as are head dim 64, GQA and a length that is no
    multiple of the block."""
    fixed = peers.CudnnBsaInputs(np.zeros((1, 2, 4, 3), np.int32), np.full((1, 2, 4), 3), 64, 1)
    ragged = peers.CudnnBsaInputs(fixed.index, np.array([[[3, 2, 3, 3], [3, 3, 3, 3]]]), 64, 1)
    assert peers.cudnn_fp8_runs(fixed, 256, 128, True)
    assert not peers.cudnn_fp8_runs(ragged, 256, 128, True)
    assert not peers.cudnn_fp8_runs(fixed, 256, 64, True)
    assert not peers.cudnn_fp8_runs(fixed, 256, 128, False)
    assert not peers.cudnn_fp8_runs(fixed, 250, 128, True)
    assert not peers.cudnn_fp8_runs(None, 256, 128, True)


@pytest.mark.gpu
def test_a_small_run_times_every_forward():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the 8-bit forward runs on Hopper only")
    rows = bench_int8.run(["cogvideox-2b"], ["random-10"], bench.case_blocks, heads=2, rounds=1,
                          precisions=("int8", "int8-qk"))
    (row,) = rows
    assert row["bf16_ms"] > 0 and row["int8_ms"] > 0 and row["int8-qk_ms"] > 0
    assert row["int8_diff"] < 3e-2 and row["int8-qk_diff"] < 2e-2
