"""The main job's CPU behaviour: ``python -m tessera info`` works with or without a GPU."""

import subprocess
import sys

import tessera
from tessera.__main__ import main


def test_info_in_process(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"Tessera {tessera.__version__}" in out
    assert "sm_90a" in out and "Regime tables" in out and "GPU" in out


def test_info_as_module():
    res = subprocess.run([sys.executable, "-m", "tessera", "info"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Default regime for head dim 128" in res.stdout


def test_bench_table_and_chart(tmp_path):
    pytest = __import__("pytest")
    from tessera import bench

    rows = [dict(shape="wan-1.3b-480p", case="random-10", density=0.1, tessera_ms=2.0,
                 tessera_tflops=300.0, tessera_plan_ms=0.5, tessera_request_ms=2.5,
                 flex_ms=2.2, flex_tflops=270.0, flex_request_ms=3.0, kernel_vs_flex=1.1,
                 request_vs_flex=1.2, sdpa_cudnn_ms=11.0, sdpa_flash_ms=18.0)]
    text = bench.table(rows)
    assert "wan-1.3b-480p" in text and "300" in text and "1.20" in text
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    bench.chart(rows, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_without_gpu_says_why(capsys):
    import importlib.util

    from tessera.__main__ import main as cli

    rc = cli(["bench", "--shape", "wan-1.3b-480p", "--case", "random-10"])
    out = capsys.readouterr().out
    if importlib.util.find_spec("torch") is None:
        assert rc == 1 and "needs PyTorch" in out
    else:  # torch without a GPU (CI installs none; a developer machine may)
        import torch

        if not torch.cuda.is_available():
            assert rc == 1 and "needs a CUDA GPU" in out


def test_bench_rejects_unknown_shape():
    import pytest

    from tessera.bench import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--shape", "no-such-model"])


def test_demo_small_runs_on_cpu(capsys):
    from tessera.demo import run

    assert run("small") == 0
    out = capsys.readouterr().out
    assert "CPU emulator" in out and "pairs outside the mask 0" in out and "OK" in out


def test_plan_command_prints_and_draws(tmp_path, capsys):
    import pytest

    from tessera.__main__ import main as cli

    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert cli(["plan", "--shape", "cogvideox-5b", "--family", "radial", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "plan: useful" in out and png.read_bytes()[:4] == b"\x89PNG"
    assert cli(["plan", "--family", "nope"]) == 2
