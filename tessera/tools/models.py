"""diffusers video transformers at their published sizes (and tiny versions for tests), with
random weights unless a checkpoint is given, and inputs of the right shapes: what ``python -m
tessera pipeline`` and the integration tests run. Needs torch and diffusers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelSpec", "MODELS", "build", "inputs"]


@dataclass(frozen=True)
class ModelSpec:
    """One transformer: its diffusers class, its configuration at the published size, a tiny
    one (same structure, a few layers, 64-dim heads) and its latent and text inputs.

    Attributes:
        cls: the diffusers class name.
        config: constructor arguments at the published size.
        tiny: overrides for the tiny version.
        latent: the latent video's ``(frames, height, width)`` at the published resolution
            (before patchifying); ``tiny_latent`` the tiny version's.
        text: text tokens and their embedding width (from the config's text width name).
        frames_first: the latent is ``[B, F, C, H, W]`` (CogVideoX), else ``[B, C, F, H, W]``.
    """

    cls: str
    config: dict
    tiny: dict
    latent: tuple[int, int, int]
    tiny_latent: tuple[int, int, int]
    text: int
    text_width_key: str
    frames_first: bool = False
    channels: int = 16
    notes: str = field(default="", compare=False)


_TINY = dict(num_attention_heads=2, attention_head_dim=64)
# What Wan 2.1's two sizes share; they differ in heads, FFN width and depth.
_WAN = dict(patch_size=(1, 2, 2), attention_head_dim=128, in_channels=16, out_channels=16,
            text_dim=4096, freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            eps=1e-6)
_WAN_TINY = dict(_TINY, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2)

MODELS: dict[str, ModelSpec] = {
    "wan-1.3b": ModelSpec(
        "WanTransformer3DModel", dict(_WAN, num_attention_heads=12, ffn_dim=8960, num_layers=30),
        _WAN_TINY, (21, 60, 104), (5, 12, 20), 512, "text_dim",
        notes="480p, 81 frames: 32,760 tokens"),
    "wan-14b": ModelSpec(
        "WanTransformer3DModel", dict(_WAN, num_attention_heads=40, ffn_dim=13824, num_layers=40),
        _WAN_TINY, (21, 90, 160), (5, 12, 20), 512, "text_dim",
        notes="720p, 81 frames: 75,600 tokens"),
    "hunyuan": ModelSpec(
        "HunyuanVideoTransformer3DModel",
        dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
             num_layers=20, num_single_layers=40, num_refiner_layers=2, patch_size=2,
             patch_size_t=1, text_embed_dim=4096, pooled_projection_dim=768,
             rope_axes_dim=(16, 56, 56)),
        dict(_TINY, num_layers=1, num_single_layers=1, num_refiner_layers=1, text_embed_dim=32,
             pooled_projection_dim=16, rope_axes_dim=(16, 24, 24)),
        (33, 90, 160), (5, 12, 20), 256, "text_embed_dim",
        notes="720p, 129 frames: 118,800 video tokens + 256 text slots"),
    "cogvideox-5b": ModelSpec(
        "CogVideoXTransformer3DModel",
        dict(num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16,
             text_embed_dim=4096, num_layers=42, time_embed_dim=512, sample_width=90,
             sample_height=60, sample_frames=49, patch_size=2,
             use_rotary_positional_embeddings=True),
        dict(_TINY, text_embed_dim=32, num_layers=2, time_embed_dim=32, sample_width=20,
             sample_height=12, sample_frames=17),
        (13, 60, 90), (5, 12, 20), 226, "text_embed_dim", frames_first=True,
        notes="480x720, 49 frames: 17,550 video tokens + 226 text tokens"),
}


def build(name: str, *, tiny: bool = False, device: str = "cuda", dtype: Any = None,
          weights: str | None = None, seed: int = 0, overrides: dict | None = None) -> Any:
    """The transformer ``name`` of :data:`MODELS`: random weights (seeded), or those of the
    local checkpoint folder ``weights`` (``from_pretrained``; nothing is downloaded).
    ``overrides``: config entries replacing the configuration's (e.g. more layers)."""
    import diffusers
    import torch

    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    spec = MODELS[name]
    cls = getattr(diffusers, spec.cls)
    dtype = dtype or torch.bfloat16
    if weights is not None:
        return cls.from_pretrained(weights, torch_dtype=dtype, local_files_only=True).to(device)
    config = {**spec.config, **(spec.tiny if tiny else {}), **(overrides or {})}
    torch.manual_seed(seed)
    with torch.device(device):  # initialized where it runs: no host copy of the weights
        model = cls(**config)
    torch.nn.Module.to(model, dtype)  # (the fp32 modules are restored below)
    for name in getattr(model, "_keep_in_fp32_modules", None) or ():  # as from_pretrained does
        for module_name, module in model.named_modules():
            if module_name.split(".")[-1] == name:
                module.float()
    return model.eval()


def inputs(name: str, model: Any, *, tiny: bool = False, batch: int = 1, seed: int = 0,
           text_valid: int | None = None, timestep: int = 500) -> dict:
    """Keyword inputs of one transformer forward of ``name`` (random latents and text) at
    ``timestep``."""
    import torch

    spec = MODELS[name]
    p = next(model.parameters())
    g = torch.Generator(device=p.device).manual_seed(seed)
    f, h, w = spec.tiny_latent if tiny else spec.latent
    shape = (batch, f, spec.channels, h, w) if spec.frames_first else (
        batch, spec.channels, f, h, w)

    def randn(*s):
        return torch.randn(*s, generator=g, device=p.device, dtype=p.dtype)

    width = model.config[spec.text_width_key]
    n_text = spec.text if not tiny else min(spec.text, 24)
    args = dict(hidden_states=randn(*shape), encoder_hidden_states=randn(batch, n_text, width),
                timestep=torch.full((batch,), timestep, device=p.device, dtype=torch.long),
                return_dict=False)
    if spec.cls == "CogVideoXTransformer3DModel" and model.config.use_rotary_positional_embeddings:
        # what CogVideoX's pipeline computes and passes (CogVideoX 1.0: patch_size_t None);
        # the latent has the model's sample size, so the crop region is the whole grid
        from diffusers.models.embeddings import get_3d_rotary_pos_embed

        c = model.config
        grid = (h // c.patch_size, w // c.patch_size)
        crops = ((0, 0), grid)
        cos, sin = get_3d_rotary_pos_embed(embed_dim=c.attention_head_dim, crops_coords=crops,
                                           grid_size=grid, temporal_size=f, device=p.device)
        args["image_rotary_emb"] = (cos, sin)
    if spec.cls == "HunyuanVideoTransformer3DModel":
        valid = n_text if text_valid is None else text_valid
        mask = torch.zeros(batch, n_text, device=p.device, dtype=torch.long)
        mask[:, :valid] = 1
        args.update(encoder_attention_mask=mask,
                    pooled_projections=randn(batch, model.config.pooled_projection_dim),
                    guidance=torch.full((batch,), 6000.0, device=p.device, dtype=p.dtype))
    return args
