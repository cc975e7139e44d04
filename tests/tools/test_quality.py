"""``python -m tessera quality``: the metrics (CPU, no torch), and the dense-against-sparse
denoising run on a tiny transformer (with torch and diffusers, on the CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tessera.tools import quality


def test_psnr_and_ssim():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 3, 4, 24, 32)).cumsum(axis=-1)  # images with structure
    assert quality.psnr(ref, ref) == float("inf") and quality.ssim(ref, ref) == pytest.approx(1)
    small, large = (ref + s * rng.standard_normal(ref.shape) for s in (0.05, 0.5))
    peak = ref.max() - ref.min()
    mse = np.mean((small - ref) ** 2)
    assert quality.psnr(small, ref) == pytest.approx(10 * np.log10(peak ** 2 / mse))
    assert quality.psnr(small, ref) > quality.psnr(large, ref)
    assert 1 > quality.ssim(small, ref) > quality.ssim(large, ref) > -1
    assert quality.ssim(np.roll(ref, 7, axis=-2), ref) < quality.ssim(large, ref)  # moved


def test_bad_options_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as stop:
        quality.main(["--steps", "0"])
    assert stop.value.code == 2 and "--steps: expected a positive int" in capsys.readouterr().err


def test_a_tiny_run_compares_the_sparse_trajectory_with_the_dense_one(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from tessera.integrations import methods as M

    full = quality.run("wan-1.3b", M.SparseConfig(M.SlidingTile(tile=(2, 4, 4),
                                                                window=(9, 9, 9))),
                       steps=3, tiny=True, device=device)
    assert len(full["per_step"]) == 3
    assert all(m["psnr"] > 60 and m["ssim"] > 0.9999 for m in full["per_step"])  # all pairs
    sparse = quality.run("wan-1.3b", M.SparseConfig(M.TopKCubes(topk=1), M.Schedule(1)),
                         steps=3, tiny=True, device=device)
    first, *rest = sparse["per_step"]
    assert first["psnr"] > 60  # the dense first step
    assert all(m["psnr"] < full["final"]["psnr"] for m in rest)
    assert sparse["speedup"] > 0 and sparse["config"]["schedule"]["dense_steps"] == 1
    rc = quality.main(["--tiny", "--steps", "2", "--method", "radial",
                       "--json", str(tmp_path / "q.json")])
    assert rc == 0 and "final: PSNR" in capsys.readouterr().out
    assert json.loads((tmp_path / "q.json").read_text())["method"] == "radial"
