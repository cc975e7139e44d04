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


def test_decoded_frames_and_conditioning_channels(capsys, monkeypatch):
    """``--frames``: both runs' final latents decoded by a (tiny) VAE, the frames compared --
    equal frames for a mask of every pair, further apart for a sparse one -- and LPIPS
    reported where the ``lpips`` package runs (a stand-in here), said to be unavailable
    where it does not. HunyuanVideo 1.5's conditioning channels ride along every step, and
    LTX's packed tokens are compared as frames."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    import sys
    import types

    from tessera.integrations import methods as M

    device = "cuda" if torch.cuda.is_available() else "cpu"
    equal = 60 if device == "cpu" else 40  # dB: float32 on the CPU, bf16 kernels on a GPU
    full = M.SparseConfig(M.SlidingTile(tile=(2, 4, 4), window=(9, 9, 9)))
    monkeypatch.setitem(sys.modules, "lpips", None)  # (import fails: not installed)
    same = quality.run("wan-1.3b", full, steps=2, tiny=True, device=device, frames=True)
    assert same["frames"]["psnr"] > equal and same["frames"]["lpips"] is None
    assert "LPIPS unavailable" in same["frames"]["lpips_note"]
    seen = []

    class FakeLPIPS(torch.nn.Module):
        def forward(self, a, b):
            seen.append((a.shape, float(a.min()), float(a.max())))
            return (a - b).abs().mean(dim=(1, 2, 3))

    monkeypatch.setitem(sys.modules, "lpips", types.SimpleNamespace(
        LPIPS=lambda net, verbose: FakeLPIPS()))
    apart = quality.run("wan-1.3b", M.SparseConfig(M.TopKCubes(topk=1)), steps=2, tiny=True,
                        device=device, frames=True)
    assert apart["frames"]["psnr"] < same["frames"]["psnr"] and apart["frames"]["lpips"] > 0
    assert seen and seen[0][0][1] == 3 and -1 <= seen[0][1] and seen[0][2] <= 1  # RGB in [-1, 1]
    assert "decoded frames" in quality.table(apart)
    for name in ("hunyuan-1.5", "ltx-video"):
        got = quality.run(name, full, steps=2, tiny=True, device=device)
        assert got["final"]["psnr"] > equal, (name, got["final"])
    with pytest.raises(SystemExit) as stop:
        quality.main(["--tiny", "--frames", "--model", "mochi"])
    assert stop.value.code == 2 and "--vae DIR" in capsys.readouterr().err
