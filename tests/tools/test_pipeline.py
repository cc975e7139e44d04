"""CPU tests of ``python -m tessera pipeline``'s pieces: the FlexAttention runner computes the
Tessera mask it is given (variable blocks, partial and full tiles), the table and chart print,
and the command says what it needs where it cannot run. Skipped without torch."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import reference
from tessera.tools import pipeline


def test_flex_runner_computes_the_tessera_mask():
    """Variable blocks that straddle the 128-token tiles (partial tiles with the mask_mod,
    full tiles without), per-head masks, blhd and bhld: eager Flex equals the float64
    reference on the same BlockMask."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    sizes = rng.integers(20, 300, size=9)
    bounds = np.r_[0, np.cumsum(sizes)]
    dense = rng.random((2, 9, 9)) < 0.4
    dense[:, :, 0] = True  # key block 0 (258 tokens) for every query: full 128x128 tiles
    dense[1, 4] = True
    mask = tessera.BlockMask.from_dense(dense, q_bounds=bounds, kv_bounds=bounds)
    run = pipeline.flex_attention_runner(compiled=False)
    for layout in ("bhld", "blhd"):
        shape = (1, 2, int(bounds[-1]), 16) if layout == "bhld" else (1, int(bounds[-1]), 2, 16)
        q, k, v = (torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
                   for _ in range(3))
        got = run(q, k, v, mask, layout, None).numpy()
        want = reference.attention(q.numpy(), k.numpy(), v.numpy(), mask, layout=layout)
        assert np.abs(got - want).max() < 1e-4


def test_table_and_chart(tmp_path):
    pytest.importorskip("matplotlib")
    r = dict(model="wan-1.3b", layers=30, method="sliding_tile", steps=3, gpu="a GPU")
    for name, ms in (("dense", 600.0), ("tessera", 300.0), ("flex", 450.0)):
        r[name] = dict(step_ms=ms, attention_ms=ms / 2, per_layer_ms=[ms / 60] * 30,
                       share=0.5, vs_dense=600.0 / ms, vs_flex=450.0 / ms,
                       diff_vs_dense=0.01, diff_vs_flex=0.005)
    r["tessera"].update(run_ms=120.0, overhead_ms=30.0, overhead_share=0.1)
    text = pipeline.table(r)
    assert "tessera     300.0    150.0    50%   120.0    10.0%     2.00    1.50" in text
    assert "dense       600.0    300.0    50%     nan              1.00" in text
    pipeline.chart(r, str(tmp_path / "layers.png"))
    assert (tmp_path / "layers.png").stat().st_size > 1000


def test_without_a_gpu_the_command_says_what_it_needs(capsys):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is here: the command would run")
    except ImportError:
        pass
    assert pipeline.main(["--model", "hunyuan"]) == 1
    out = capsys.readouterr().out
    assert "pipeline needs" in out and "118,800 video tokens" in out


def test_the_tiny_check_runs_without_a_gpu(capsys):
    """``pipeline --tiny`` on a machine without a GPU: the tiny transformer on the CPU, Tessera on
    the CPU emulator, dense and Tessera agreeing (a window over the whole tiny grid), the table
    printed; without --tiny it says what it needs."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the tiny check runs there")
    rc = pipeline.main(["--tiny", "--model", "wan-1.3b", "--method", "sliding_tile", "--window",
                        "9", "9", "9", "--steps", "1", "--no-flex"])
    out = capsys.readouterr().out
    assert rc == 0 and "the tiny check runs on the CPU" in out and "tessera" in out
    line = next(x for x in out.splitlines() if x.startswith("tessera")).split()
    assert float(line[-2]) < 1e-5  # diff/dense (then diff/flex): the full window is dense
    assert pipeline.main(["--model", "wan-1.3b", "--steps", "1"]) == 1
    assert "but for --tiny" in capsys.readouterr().out
