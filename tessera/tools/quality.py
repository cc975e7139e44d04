"""``python -m tessera quality``: what a sparse method costs in quality. One denoising run of a
diffusers video transformer with its own attention and one with the method's, from the same
initial noise and the same prompt embeddings, on the same flow-matching Euler schedule; per step
and at the end, the PSNR and SSIM of the sparse run's latents against the dense run's, beside
the speed-up of a transformer forward. With ``--vae DIR`` (the model's VAE checkpoint folder;
``--tiny --frames``: a tiny random one) both runs' final latents are decoded, and the frames
are compared too: PSNR, SSIM, and LPIPS where the ``lpips`` package and its weights are
installed. Conditioning channels of the transformer's input beyond its output (HunyuanVideo
1.5's, Wan image-to-video's) are held as given for every step.
The sampler is diffusers' ``FlowMatchEulerDiscreteScheduler`` for every model (Wan's and
HunyuanVideo's own; CogVideoX samples with DDIM), so the figures show how far the method moves
the trajectory, not a model's published sampling. ``--tiny`` runs the tiny configuration with
random weights, on the CPU where there is no GPU (Tessera's calls on the CPU emulator).

    python -m tessera quality --model wan-1.3b --method sliding_tile --window 2 3 3 \\
        --dense-steps 10 --steps 50 --weights /models/Wan2.1-T2V-1.3B-Diffusers/transformer
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
from scipy.ndimage import gaussian_filter

from ..distribution import install_hint
from ..integrations import diffusers as td
from ..integrations import methods as M
from .args import positive_int
from .models import MODELS, build, inputs
from .pipeline import add_method_arguments, parse_run

__all__ = ["psnr", "ssim", "load_vae", "decode", "lpips_distance", "run", "table", "main"]


def psnr(x: np.ndarray, ref: np.ndarray) -> float:
    """Peak signal-to-noise ratio of ``x`` against ``ref`` in dB, the peak being ``ref``'s
    range; infinite when they are equal."""
    mse = float(np.mean((x - ref) ** 2))
    peak = float(ref.max() - ref.min())
    if mse == 0.0:
        return float("inf")
    return 10.0 * np.log10(peak ** 2 / mse) if peak > 0 else float("-inf")


def ssim(x: np.ndarray, ref: np.ndarray, sigma: float = 1.5) -> float:
    """Mean structural similarity of ``x`` against ``ref`` over their last two axes (each
    leading index one image: a channel of a frame), Gaussian windows of ``sigma``, the
    constants at ``ref``'s range (Wang et al. 2004: K1 0.01, K2 0.03)."""
    peak = float(ref.max() - ref.min()) or 1.0
    c1, c2 = (0.01 * peak) ** 2, (0.03 * peak) ** 2
    x = x.reshape(-1, *x.shape[-2:]).astype(np.float64)
    ref = ref.reshape(-1, *ref.shape[-2:]).astype(np.float64)
    blur = lambda a: gaussian_filter(a, sigma=(0, sigma, sigma), mode="reflect")  # noqa: E731
    mx, mr = blur(x), blur(ref)
    vx, vr, cov = blur(x * x) - mx * mx, blur(ref * ref) - mr * mr, blur(x * ref) - mx * mr
    s = ((2 * mx * mr + c1) * (2 * cov + c2)) / ((mx * mx + mr * mr + c1) * (vx + vr + c2))
    return float(s.mean())


def _video(latent: Any, spec: Any, grid: tuple[int, int, int]) -> Any:
    """A latent as ``[B, C, F, H, W]``: CogVideoX's ``[B, F, C, H, W]`` and LTX's packed
    tokens ``[B, F*H*W, C]`` (``grid``: F, H, W) rearranged."""
    if spec.latent_layout == "fchw":
        return latent.permute(0, 2, 1, 3, 4)
    if spec.latent_layout == "tokens":
        b, _, c = latent.shape
        return latent.reshape(b, *grid, c).permute(0, 4, 1, 2, 3)
    return latent


def _host(latent: Any) -> np.ndarray:
    """A ``[B, C, F, H, W]`` latent or video as float64 numpy (images on the last two axes)."""
    return latent.detach().double().cpu().numpy()


def _denoise(model: Any, x: dict, steps: int, shift: float, timer: Any) -> tuple[list, list]:
    """Latents after each step of a flow-matching Euler run from ``x``'s noise, and each
    forward's milliseconds. Input channels beyond the model's output (conditioning) are held
    fixed and joined to the latents at every step."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps, device=x["hidden_states"].device)
    hidden = x["hidden_states"]
    dim = 2 if hidden.ndim == 3 else 1  # (packed tokens: channels last)
    out_channels = getattr(model.config, "out_channels", None) or hidden.shape[dim]
    latents, cond = hidden.narrow(dim, 0, out_channels).clone(), hidden.narrow(
        dim, out_channels, hidden.shape[dim] - out_channels)
    out, ms = [], []
    with torch.no_grad():
        # the scheduler's float timesteps, as pipelines pass them -- in the model's dtype where
        # its inputs give one (HunyuanVideo 1.5's time embedding takes no float32)
        dtype = x["timestep"].dtype if x["timestep"].is_floating_point() else None
        for t in scheduler.timesteps:
            given = torch.cat([latents, cond], dim=dim) if cond.shape[dim] else latents
            step = t.expand(latents.shape[0])
            args = dict(x, hidden_states=given, timestep=step if dtype is None else step.to(dtype))
            start = timer()
            pred = model(**args)[0]
            ms.append(timer() - start)
            latents = scheduler.step(pred, t, latents, return_dict=False)[0]
            out.append(latents)
    return out, ms


def load_vae(model_name: str, vae: str | None, tiny: bool, device: str, dtype: Any) -> Any:
    """The model's VAE from the local folder ``vae`` (nothing is downloaded), or with
    ``tiny`` and no folder a tiny random one of its class."""
    import diffusers

    spec = MODELS[model_name]
    cls = getattr(diffusers, spec.vae)
    if vae is not None:
        return cls.from_pretrained(vae, torch_dtype=dtype, local_files_only=True).to(device)
    if not tiny or spec.tiny_vae is None:
        raise ValueError(f"frames of {model_name} need its VAE: --vae DIR (a local "
                         f"{spec.vae} checkpoint folder)")
    import torch

    torch.manual_seed(0)
    return cls(**spec.tiny_vae).to(device=device, dtype=dtype).eval()


def decode(vae: Any, latent: Any) -> Any:
    """Frames ``[B, 3, F, H, W]`` in [-1, 1] from a ``[B, C, F, H, W]`` latent: the VAE's
    latent statistics undone (per-channel mean and std, or its scaling factor), decoded."""
    import torch

    c = vae.config
    z = latent.to(next(vae.parameters()).dtype)
    mean, std = getattr(c, "latents_mean", None), getattr(c, "latents_std", None)
    if mean is not None and std is not None and len(mean) == z.shape[1]:
        shape = (1, -1, 1, 1, 1)
        z = z * torch.tensor(std, device=z.device, dtype=z.dtype).view(shape) + torch.tensor(
            mean, device=z.device, dtype=z.dtype).view(shape)
    elif getattr(c, "scaling_factor", None):
        z = z / c.scaling_factor
    with torch.no_grad():
        return vae.decode(z).sample.clamp(-1, 1)


def lpips_distance(frames: Any, ref: Any) -> tuple[float | None, str]:
    """Mean LPIPS (AlexNet) of ``frames`` against ``ref`` (``[B, 3, F, H, W]`` in [-1, 1]),
    frame by frame -- or None and why, where the ``lpips`` package or its weights are
    missing."""
    try:
        import lpips  # noqa: PLC0415 - optional: not a dependency of Tessera

        net = lpips.LPIPS(net="alex", verbose=False).to(frames.device)
    except Exception as exc:  # (not installed, or its weights cannot be fetched offline)
        return None, f"LPIPS unavailable ({type(exc).__name__}: {exc})"[:160]
    import torch

    flat = lambda v: v.permute(0, 2, 1, 3, 4).flatten(0, 1).float()  # noqa: E731
    with torch.no_grad():
        return float(net(flat(frames), flat(ref)).mean()), ""


def run(model_name: str, config: M.SparseConfig, steps: int = 20, *, tiny: bool = False,
        weights: str | None = None, shift: float = 3.0, device: str = "cuda",
        vae: str | None = None, frames: bool = False) -> dict:
    """The dense and the sparse denoising runs of ``model_name``, compared step by step;
    ``frames`` (or a ``vae`` folder): their final latents decoded and compared too."""
    import torch

    cpu = device == "cpu"
    model = build(model_name, tiny=tiny, weights=weights, device=device,
                  dtype=torch.float32 if cpu else None)
    x = inputs(model_name, model, tiny=tiny)
    spec = MODELS[model_name]
    grid = spec.tiny_latent if tiny else spec.latent

    def timer() -> float:
        if not cpu:
            torch.cuda.synchronize()
        return time.perf_counter() * 1e3

    dense, dense_ms = _denoise(model, x, steps, shift, timer)
    with td.sparse(model, config.method, schedule=config.schedule):
        sparse, sparse_ms = _denoise(model, x, steps, shift, timer)
    per_step = []
    for d, s in zip(dense, sparse):
        ref, got = _host(_video(d, spec, grid)), _host(_video(s, spec, grid))
        per_step.append(dict(psnr=psnr(got, ref), ssim=ssim(got, ref)))
    # (the first forward of each run loads kernels and builds masks: left out)
    d_ms = statistics.median(dense_ms[1:] or dense_ms)
    s_ms = statistics.median(sparse_ms[1:] or sparse_ms)
    result = dict(model=model_name, method=config.method.name, config=config.to_json(),
                  steps=steps, device="the CPU" if cpu else "GPU", per_step=per_step,
                  final=per_step[-1], dense_forward_ms=d_ms, sparse_forward_ms=s_ms,
                  speedup=d_ms / s_ms, frames=None)
    if frames or vae is not None:
        v = load_vae(model_name, vae, tiny, device, torch.float32 if cpu else model.dtype)
        ref, got = (decode(v, _video(r[-1], spec, grid)) for r in (dense, sparse))
        distance, why = lpips_distance(got, ref)
        ref64, got64 = _host(ref), _host(got)  # (each copied back once)
        result["frames"] = dict(psnr=psnr(got64, ref64), ssim=ssim(got64, ref64),
                                lpips=distance, lpips_note=why, shape=list(got.shape))
    return result


def table(result: dict) -> str:
    """The report as text: per step PSNR and SSIM, then the final ones and the speed-up."""
    lines = [f"{result['model']}, {result['method']}, {result['steps']} steps on "
             f"{result['device']}: sparse latents against dense (flow-matching Euler)",
             f"{'step':>4} {'PSNR dB':>8} {'SSIM':>7}"]
    for i, m in enumerate(result["per_step"]):
        lines.append(f"{i:4d} {m['psnr']:8.2f} {m['ssim']:7.4f}")
    f = result["final"]
    lines.append(f"final: PSNR {f['psnr']:.2f} dB, SSIM {f['ssim']:.4f}; a forward "
                 f"{result['dense_forward_ms']:.1f} ms dense, {result['sparse_forward_ms']:.1f} "
                 f"ms sparse ({result['speedup']:.2f}x)")
    fr = result.get("frames")
    if fr is not None:
        lp = f"LPIPS {fr['lpips']:.4f}" if fr["lpips"] is not None else fr["lpips_note"]
        lines.append(f"decoded frames {'x'.join(map(str, fr['shape'][2:]))}: PSNR "
                     f"{fr['psnr']:.2f} dB, SSIM {fr['ssim']:.4f}, {lp}")
    return "\n".join(lines)


def chart(result: dict, path: str) -> None:
    """Per-step PSNR and SSIM of the sparse run against the dense one."""
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    steps = range(len(result["per_step"]))
    a.plot(steps, [m["psnr"] for m in result["per_step"]])
    a.set_xlabel("step")
    a.set_ylabel("PSNR, dB")
    b.plot(steps, [m["ssim"] for m in result["per_step"]])
    b.set_xlabel("step")
    b.set_ylabel("SSIM")
    fig.suptitle(f"{result['model']}, {result['method']}: sparse against dense latents")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera quality",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=list(MODELS), default="wan-1.3b")
    add_method_arguments(ap)
    ap.add_argument("--steps", type=positive_int, default=20, help="denoising steps")
    ap.add_argument("--weights", help="a local transformer checkpoint folder (from_pretrained)")
    ap.add_argument("--tiny", action="store_true",
                    help="the tiny configuration, random weights (on the CPU without a GPU)")
    ap.add_argument("--vae", metavar="DIR",
                    help="the model's VAE checkpoint folder: decode both runs' final latents "
                         "and compare the frames")
    ap.add_argument("--frames", action="store_true",
                    help="compare decoded frames (with --tiny: a tiny random VAE)")
    ap.add_argument("--json", help="write the report as JSON here")
    ap.add_argument("--png", help="plot PSNR and SSIM per step here (matplotlib)")
    args, config, missing = parse_run(ap, argv)
    if missing:
        print(f"quality needs {' and '.join(missing)} ({install_hint('diffusers')})")
        return 1
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.tiny:
        print("quality needs a CUDA GPU but for --tiny, which runs on the CPU")
        return 1
    if args.frames and args.vae is None and not (args.tiny and MODELS[args.model].tiny_vae):
        ap.error(f"--frames of {args.model} needs --vae DIR (its {MODELS[args.model].vae} "
                 "checkpoint folder)")
    result = run(args.model, config, args.steps, tiny=args.tiny, weights=args.weights,
                 device=device, vae=args.vae, frames=args.frames)
    print(table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if args.png:
        chart(result, args.png)
    return 0
