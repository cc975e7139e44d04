"""The main job's CPU behaviour: ``python -m tessera info`` works with or without a GPU."""

import subprocess
import sys

import numpy as np
import pytest

import tessera
from tessera.tools.cli import main


def test_info_in_process(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"Tessera {tessera.__version__}" in out
    assert "sm_90a" in out and "Regime tables" in out and "GPU" in out
    from tessera.cuda.tma import _driver_encoder

    # Whether TMA copies are possible here, as the driver lookup answers.
    assert ("the driver encodes tensor maps" in out) == (_driver_encoder() is not None)
    assert "TMA copies" in out
    assert "Backward pass (tessera.attention_backward, torch autograd, jax.grad): the " in out
    assert ("8-bit forwards (tessera.attention(..., precision=\"int8\" or \"int8-qk\"), "
            "opt-in): ") in out


def test_info_names_the_backward_kernels_of_a_gpu():
    from tessera.tools import cli

    assert cli._backward_line(90).startswith(
        "the sm90 (wgmma) kernels on this GPU (bwd_sm90_128_atomics_tma: 128-row")
    assert "portable_backward" in cli._backward_line(90)
    assert "64 for masks of blocks up to 64 tokens" in cli._backward_line(90)
    assert "chunks by TMA" in cli._backward_line(90)
    assert cli._backward_line(86) == ("the sm80 (mma.sync) kernels on this GPU "
                                      "(bwd_sm80_64_passes: 64-row tasks)")


def test_info_says_the_diffusers_release_and_the_families(monkeypatch):
    """``info`` names the installed diffusers release against the tested ones (from the
    package metadata), or how to install it, and the families the integration routes."""
    import importlib.metadata as md

    from tessera.tools import cli

    versions = {"diffusers": "0.42.1"}

    def version(name):
        if name not in versions:
            raise md.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(md, "version", version)
    line = cli._diffusers_line()
    assert line.startswith("diffusers: 0.42.1 (tested); families routed: Wan 2.1 / 2.2")
    assert "LTX-2" in line and "HunyuanVideo 1.5" in line
    versions["diffusers"] = "0.45.0"
    assert "(outside the tested 0.41, 0.42: enable checks each model)" in cli._diffusers_line()
    versions.clear()
    assert cli._diffusers_line() == ("diffusers: not installed (pip install "
                                     "'tessera-attention[diffusers]')")


def test_info_as_module():
    res = subprocess.run([sys.executable, "-m", "tessera", "info"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Default regime for head dim 128" in res.stdout
    # and what masks of 64-token query blocks take (on Hopper at head dim 128: the two-CTA
    # 64-row producer variant)
    assert "64-token query blocks" in res.stdout and "sm90_64x64_w8_s3" in res.stdout
    # Off Hopper it also says what a Hopper GPU would take.
    assert "sm90_128x128_w12_s3" in res.stdout


def test_bench_table_and_chart(tmp_path):
    pytest = __import__("pytest")
    from tessera.tools import bench

    rows = [dict(shape="wan-1.3b-480p", case="random-10", density=0.1, tessera_ms=2.0,
                 tessera_tflops=300.0, tessera_plan_ms=0.5, tessera_request_ms=2.5,
                 flex_ms=2.2, flex_tflops=270.0, flex_request_ms=3.0, kernel_vs_flex=1.1,
                 request_vs_flex=1.2, sdpa_cudnn_ms=11.0, sdpa_flash_ms=18.0,
                 tessera_call_ms=2.125, flex_call_ms=2.375, call_vs_flex=1.117)]
    text = bench.table(rows)
    assert "wan-1.3b-480p" in text and "300" in text and "1.20" in text
    assert "2.12" in text and "2.38" in text and "1.12" in text  # the lone-call columns
    # A row of an earlier run (no lone-call figures) still prints.
    old = {k: v for k, v in rows[0].items() if "call" not in k}
    assert "nan" in bench.table([old])
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    bench.chart(rows, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_cases():
    """Every --case makes a block matrix of its block size at the density its name says; the
    top-k case keeps the same number of key blocks in every row; a 64-token case padded to
    whole blocks is one the peers run as it is (uniform blocks for Flex's 64x64 tiles and
    cuDNN's blk64)."""
    from tessera.tools import bench

    rng = np.random.default_rng(0)
    for name, case in bench.CASES.items():
        n = 300
        blocks = case.make(rng, 3, n)
        assert blocks.shape == (3, n, n) and blocks.dtype == bool
        want = {"dense": 1.0, "mixed-heads": 0.31}.get(name) or int(name.rsplit("-", 1)[1]) / 100
        if name.startswith("band"):
            want = 2 * int(0.08 * n) / n
        assert abs(blocks.mean() - want) < 0.02, name
        assert case.block in (64, 128) or case.sizes is not None  # (variable: their mean)
    top = bench.CASES["topk64-10"].make(rng, 2, 512)
    assert (top.sum(-1) == 51).all()
    bounds = np.arange(513) * 64
    m = tessera.BlockMask.from_dense(top, q_bounds=bounds, kv_bounds=bounds)
    assert m.uniform_block_size() == (64, 64) and m.seq_len_q % 64 == 0


def test_bench_without_gpu_says_why(capsys):
    import importlib.util

    from tessera.tools.cli import main as cli

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

    from tessera.tools.bench import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--shape", "no-such-model"])


def test_demo_small_runs_on_cpu(capsys):
    from tessera.tools.demo import run

    assert run("small") == 0
    out = capsys.readouterr().out
    assert "CPU emulator" in out and "pairs outside the mask 0" in out and "OK" in out


def test_plan_command_prints_and_draws(tmp_path, capsys):
    import pytest

    from tessera.tools.cli import main as cli

    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert cli(["plan", "--shape", "cogvideox-5b", "--family", "radial", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "plan: useful" in out and png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit) as stop:
        cli(["plan", "--family", "nope"])
    assert stop.value.code == 2


def test_bench_rejects_unknown_family():
    from tessera.tools.bench import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--family", "no-such-family"])


def test_bench_regime_option(capsys):
    """--regime takes a regime name (checked before anything else runs): a bad one is refused
    with the expected form, a good one passes to the GPU check."""
    from tessera.tools.bench import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--case", "random-10", "--regime", "sm90_128x128_w12_s3[no_such=1]"])
    assert "not a regime name" in capsys.readouterr().err
    from tessera.cuda.device import device_arch

    if device_arch() is not None:
        return  # with a GPU a good name would run the whole bench
    rc = bench_main(["--case", "random-10", "--regime",
                     "sm90_128x128_w12_s3[combine_threshold=0.0,align_tiles=True]"])
    assert rc == 1  # no GPU (or no torch) here: it says why instead of running
    assert "bench needs" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["plan", "--family", "no-such-family"], "invalid choice: 'no-such-family' (choose from"),
    (["plan", "--shape", "wan"], "invalid choice: 'wan' (choose from 'wan-1.3b-480p'"),
    (["plan", "--heads", "2", "--head", "5"], "--head must be in [0, 2)"),
    (["plan", "--head-dim", "80"], "--head-dim: expected one of 64, 96, 128, got '80'"),
    (["plan", "--head-dim", "0"], "--head-dim: expected one of 64, 96, 128, got '0'"),
    (["plan", "--block-m", "100"], "--block-m: expected one of 32, 64, 128, 192, 256"),
    (["plan", "--heads", "0"], "--heads: expected a positive int, got '0'"),
    (["bench", "--reps", "0"], "--reps: expected a positive int, got '0'"),
    (["bench", "--rounds", "x"], "--rounds: expected a positive int, got 'x'"),
    (["pipeline", "--density", "1.5"], "--density: expected a number in (0, 1], got '1.5'"),
    (["pipeline", "--window", "0", "3", "3"], "--window: expected a positive int, got '0'"),
    (["pipeline", "--heads", "both"], "invalid choice: 'both'"),
    (["pipeline", "--dense-steps", "-1"], "--dense-steps: expected an int >= 0, got '-1'"),
    (["profile", "--budget-minutes", "0"], "--budget-minutes: expected a positive number"),
    (["pipeline", "--config", "/no/such/file.json"], "--config: cannot read a configuration"),
    (["quality", "--preset", "nope"], "--preset: unknown preset 'nope'; choose from"),
])
def test_bad_values_are_usage_errors_before_any_work(argv, words, capsys, monkeypatch):
    """Every bad value is an argparse usage error (exit 2) saying what is accepted, printed
    before any work starts (the workload's mask is never built)."""
    from tessera.tools import cli

    monkeypatch.setattr(cli, "example_mask", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(SystemExit) as stop:
        main(argv)
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == "" and words in err, err


def test_png_without_matplotlib_is_refused_before_the_work(capsys, monkeypatch):
    import importlib.util

    from tessera.tools import cli

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find(name, *a))
    monkeypatch.setattr(cli, "example_mask", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(SystemExit) as stop:
        main(["plan", "--png", "x.png"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--png needs matplotlib: pip install 'tessera-attention[plot]'" in err


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_cli_piped_into_a_reader_that_closed(unbuffered):
    """``python -m tessera info | head -1``: the reader gone, the command ends quietly (no
    BrokenPipeError traceback, nor Python's "Exception ignored" at exit) whether the broken
    pipe shows in a print or in the final flush."""
    import os

    read, write = os.pipe()
    os.close(read)  # every write to the pipe fails with EPIPE
    env = dict(os.environ, PYTHONUNBUFFERED=unbuffered)
    proc = subprocess.run([sys.executable, "-m", "tessera", "info"], stdout=write,
                          stderr=subprocess.PIPE, env=env, timeout=120)
    os.close(write)
    err = proc.stderr.decode()
    assert "BrokenPipe" not in err and "Traceback" not in err and "ignored" not in err, err
    assert proc.returncode == 1


def test_pipeline_saves_the_configuration_it_runs_and_reads_it_back(tmp_path, capsys):
    """``pipeline --save-config`` writes the method and schedule before anything else (here,
    without torch or a GPU, it then says what it needs); ``--config`` reads one back."""
    from tessera.integrations import methods as M

    path = tmp_path / "sta.json"
    # (--tiny: where torch, diffusers and a GPU are present, the run is the tiny check)
    main(["pipeline", "--tiny", "--steps", "1", "--no-flex", "--method", "sliding_tile",
          "--window", "2", "3", "3", "--dense-steps", "10", "--save-config", str(path)])
    saved = M.SparseConfig.load(path)
    assert saved == M.SparseConfig(M.SlidingTile(window=(2, 3, 3)), M.Schedule(10, 0))
    again = tmp_path / "again.json"
    main(["pipeline", "--tiny", "--steps", "1", "--no-flex", "--config", str(path), "--method",
          "radial", "--save-config", str(again)])
    assert M.SparseConfig.load(again) == saved  # the file's method, not --method's
    capsys.readouterr()


def test_pipeline_runs_a_preset_as_its_configuration(tmp_path, capsys):
    """``--preset NAME`` is the published setting's configuration, source included."""
    from tessera.integrations import methods as M
    from tessera.integrations import presets

    path = tmp_path / "preset.json"
    main(["pipeline", "--tiny", "--steps", "1", "--no-flex", "--preset", "wan-14b-768p-radial",
          "--save-config", str(path)])
    assert M.SparseConfig.load(path) == presets.get("wan-14b-768p-radial").config
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:  # a preset or a file, not both
        main(["pipeline", "--config", str(path), "--preset", "wan-14b-768p-radial"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err

