"""Published sparse-attention settings as Tessera configurations: per model and resolution,
the method and schedule a paper's or project's own scripts run, expressed with Tessera's
methods, each with its source and with what Tessera's version leaves out. A starting point
to judge with ``python -m tessera quality`` on one's own prompts, not a quality guarantee.

::

    from tessera.integrations import diffusers as td, presets
    method, schedule = presets.get("hunyuan-768p-radial").arguments()
    with td.sparse(pipe, method, schedule=schedule):
        video = pipe(prompt, height=768, width=1280, num_frames=117).frames[0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .methods import Radial, Schedule, SlidingTile, SparseConfig, SpatialTemporal, TopKCubes

__all__ = ["Preset", "PRESETS", "get"]


@dataclass(frozen=True)
class Preset:
    """One published setting.

    Attributes:
        name: the preset's name (``--preset``).
        model: the model it was published for; ``resolution``: height x width, frames.
        latent: the video tokens ``(t, h, w)`` after patchifying at that resolution.
        config: the method and schedule (``config.source``: where the values are published).
        differs: what Tessera's method does differently from the published one ("" if
            nothing).
    """

    name: str
    model: str
    resolution: str
    latent: tuple[int, int, int]
    config: SparseConfig
    differs: str = ""

    def arguments(self) -> tuple[Any, Schedule]:
        """``(method, schedule)``, as :func:`tessera.integrations.diffusers.sparse` and
        ``enable`` take them (``sparse(pipe, method, schedule=schedule)``)."""
        return self.config.method, self.config.schedule


_STA = "Sliding Tile Attention (hao-ai-lab/FastVideo, branch sta_do_not_delete)"
_RADIAL = "Radial Attention (mit-han-lab/radial-attention)"
_SVG = "Sparse VideoGen (svg-project/Sparse-VideoGen)"
_VSA = "Video Sparse Attention (hao-ai-lab/FastVideo)"
_SVG_HEADS = ("Sparse VideoGen picks each head's kind (spatial or temporal) every step from "
              "sampled rows; the preset makes every head spatial")

PRESETS: tuple[Preset, ...] = (
    Preset("hunyuan-768p-sta", "HunyuanVideo", "768x1280, 117 frames", (30, 48, 80),
           SparseConfig(SlidingTile(tile=(6, 8, 8), window=(5, 3, 3)), Schedule(dense_steps=15),
                        f"{_STA}: tile 6x8x8 (sliding_tile_attn.py), the first 15 of 50 steps "
                        "dense and window 5x3x3 tiles, the most common per-head window after "
                        "them (assets/mask_strategy_hunyuan.json)"),
           "the published mask gives each head and layer its own searched window; the preset "
           "uses the most common one (40% of heads) for all"),
    Preset("wan-14b-768p-sta", "Wan 2.1 14B", "768x1280, 69 frames", (18, 48, 80),
           SparseConfig(SlidingTile(tile=(6, 8, 8), window=(3, 3, 3)), Schedule(dense_steps=12),
                        f"{_STA}: tile 6x8x8, window 3x3x3 tiles (one of the mask search's "
                        "candidates, fastvideo/pipelines/stages/denoising.py), 12 dense steps "
                        "(examples/inference/sta_mask_search/inference_wan_sta.sh)"),
           "the published mask searches a window per head among six candidates"),
    *(Preset(name, model, resolution, latent,
             SparseConfig(Radial(block=128), Schedule(dense_steps=steps, dense_layers=layers),
                          f"{_RADIAL}: scripts/{script}: dense_timesteps {steps}, dense_layers "
                          f"{layers}, decay_factor {decay}, block 128, {total} steps"),
             f"Tessera's band halves with each doubling of the frame distance (no decay "
             f"factor; {decay} published)")
      for name, model, resolution, latent, steps, layers, decay, total, script in (
          ("hunyuan-768p-radial", "HunyuanVideo", "768x1280, 117 frames", (30, 48, 80), 12, 0,
           0.95, 50, "hunyuan_t2v_inference.sh"),
          ("wan-14b-768p-radial", "Wan 2.1 14B", "768x1280, 69 frames", (18, 48, 80), 12, 1,
           0.2, 50, "wan_t2v_inference.sh"),
          ("wan22-a14b-768p-radial", "Wan 2.2 A14B", "768x1280, 77 frames", (20, 48, 80), 11,
           1, 0.8, 40, "wan_22_t2v_inference.sh"))),
    Preset("hunyuan-720p-svg", "HunyuanVideo", "720x1280, 129 frames", (33, 45, 80),
           SparseConfig(SpatialTemporal(block=128, heads="spatial", width=2),
                        Schedule(dense_steps=5, dense_layers=1),
                        f"{_SVG}: scripts/hyvideo/hyvideo_t2v_720p_svg.sh: first_times_fp 0.1 "
                        "(5 of 50 steps), first_layers_fp 0.03 (1 of 60 layers), sparsity 0.25 "
                        "(about 4.4 of 33 frames: 2 either side)"),
           _SVG_HEADS),
    Preset("wan-14b-720p-svg", "Wan 2.1 14B", "720x1280, 81 frames", (21, 45, 80),
           SparseConfig(SpatialTemporal(block=128, heads="spatial", width=1),
                        Schedule(dense_steps=10, dense_layers=1),
                        f"{_SVG}: scripts/wan/wan_t2v_720p_svg.sh: first_times_fp 0.2 (10 of "
                        "50 steps), first_layers_fp 0.03 (1 of 40 layers), sparsity 0.3 (about "
                        "3.4 of 21 frames: 1 either side)"),
           _SVG_HEADS),
    Preset("wan-1.3b-480p-vsa", "Wan 2.1 1.3B (VSA fine-tuned)", "480x832, 81 frames",
           (21, 30, 52),
           SparseConfig(TopKCubes(cube=(4, 4, 4), density=0.1), Schedule(),
                        f"{_VSA}: 4x4x4 cubes (video_sparse_attn.py), sparsity 0.9, no dense "
                        "steps (examples/training/finetune/Wan2.1-VSA/Wan-Syn-Data/"
                        "T2V-1.3B-VSA.slurm)"),
           "VSA's weights are fine-tuned for its sparsity; on the base model expect a quality "
           "loss"),
    Preset("fastwan-1.3b-480p-vsa", "FastWan 2.1 1.3B (VSA, 3 steps)", "480x832, 81 frames",
           (21, 30, 52),
           SparseConfig(TopKCubes(cube=(4, 4, 4), density=0.2), Schedule(),
                        f"{_VSA}: scripts/inference/inference_wan_VSA_DMD_1_3B.yaml: sparsity "
                        "0.8, timesteps 1000, 757, 522"),
           "for the distilled FastWan weights and their 3-step schedule"),
)


def get(name: str) -> Preset:
    """The preset ``name``; ValueError naming the presets when there is none."""
    for p in PRESETS:
        if p.name == name:
            return p
    raise ValueError(f"unknown preset {name!r}; choose from {', '.join(p.name for p in PRESETS)}")
