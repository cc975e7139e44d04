"""``python -m tessera bench --backward``: its table and argument checks (CPU), and one small run
whose peers' gradients were compared before they were timed (GPU)."""

from __future__ import annotations

import math

import pytest

from tessera.tools import bench, bench_backward


def test_table_shows_missing_peers_as_nan():
    row = dict(shape="wan-1.3b-480p", case="random-10", density=0.1, tessera_ms=6.0,
               tessera_tflops=300.0, tessera_fwdbwd_ms=9.0, tessera_request_ms=40.0,
               flex_ms=4.5, bwd_vs_flex=0.75, fwdbwd_vs_flex=0.8)
    text = bench_backward.table([row])
    lines = text.splitlines()
    assert len(lines) == 2 and "wan-1.3b-480p" in lines[1] and "0.75" in lines[1]
    assert lines[1].count("nan") == 7  # alt and its ratio, bsa, its ratios, fa4 and its ratio


def test_backward_takes_only_its_options(capsys):
    for extra in (["--regime", "x"], ["--host-mask"], ["--png", "x.png"]):
        with pytest.raises(SystemExit):
            bench.main(["--backward", *extra])
        assert "--backward takes" in capsys.readouterr().err
    for argv, said in ((["--kv-heads", "2"], "options of --backward"),
                       (["--dtype", "float16"], "options of --backward"),
                       (["--backward", "--shape", "wan-1.3b-480p", "--kv-heads", "5"],
                        "does not divide wan-1.3b-480p's 12 query heads"),
                       (["--backward", "--dtype", "float32"], "invalid choice")):
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert said in capsys.readouterr().err


def test_table_marks_gqa_and_fp16_rows():
    row = dict(shape="wan-1.3b-480p", case="random-10", density=0.1, tessera_ms=6.0,
               tessera_tflops=300.0, tessera_fwdbwd_ms=9.0, tessera_request_ms=7.0, heads=12,
               kv_heads=4, dtype="float16")
    assert "wan-1.3b-480p/kv4/fp16" in bench_backward.table([row])
    mha = dict(row, kv_heads=12, dtype="bfloat16")
    assert bench_backward.table([mha]).splitlines()[1].split()[0] == "wan-1.3b-480p"


@pytest.mark.gpu
def test_a_small_run_times_what_agrees():
    """Tessera's backward, forward + backward and request are timed; a peer is timed only where
    its gradients agreed with Tessera's (its difference is in the row either way)."""
    pytest.importorskip("torch")
    (row,) = bench_backward.run(["cogvideox-5b"], ["random-10"], bench.case_blocks, heads=2,
                                rounds=2, reps=2)
    assert min(row["tessera_ms"], row["tessera_fwdbwd_ms"], row["tessera_request_ms"]) > 0
    assert row["tessera_fwdbwd_ms"] > row["tessera_ms"]
    if "flex_diff" in row and not row.get("flex_differs"):
        assert row["flex_diff"] < 2e-2 and row["flex_ms"] > 0
        assert row["bwd_vs_flex"] == pytest.approx(row["flex_ms"] / row["tessera_ms"])
    assert math.isfinite(row["useful_tflop"])
    if "other_ms" in row:  # (sm_90: both dQ modes)
        assert row["other_diff"] < 1e-2 and row["other_ms"] > 0


@pytest.mark.gpu
def test_a_gqa_fp16_run_leaves_cudnn_out():
    """GQA (two query heads on one kv head) in fp16: Tessera's rows are timed, Flex (with
    enable_gqa) only where its gradients agreed, and cuDNN's backward -- MHA bf16 only -- never."""
    pytest.importorskip("torch")
    (row,) = bench_backward.run(["cogvideox-5b"], ["random-10"], bench.case_blocks, heads=2,
                                rounds=1, reps=1, kv_heads=1, dtype="float16")
    assert (row["heads"], row["kv_heads"], row["dtype"]) == (2, 1, "float16")
    assert row["tessera_ms"] > 0 and "cudnn_bsa_ms" not in row
    if "flex_diff" in row and not row.get("flex_differs"):
        assert row["flex_diff"] < 2e-2 and row["flex_ms"] > 0
