"""diffusers video transformers at their published sizes (and tiny versions for tests), with
random weights unless a checkpoint is given, and inputs of the right shapes: what ``python -m
tessera pipeline`` and the integration tests run. Needs torch and diffusers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

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
        latent_layout: ``"cfhw"`` (``[B, C, F, H, W]``), ``"fchw"`` (CogVideoX) or
            ``"tokens"`` (LTX: ``[B, F*H*W, C]``, the sizes passed beside it).
        channels: the latent's channels (the config's ``in_channels`` when None).
        extra: the model's further inputs, ``extra(model, batch, n_text, text_valid, latent,
            randn, tiny) -> dict`` (masks, pooled text, control latents, audio).
        float_timestep: the timestep in the model's dtype (what its pipeline passes and its
            time embedding takes), else an integer.
        vae: the diffusers class of the model's VAE (``quality --vae``); ``tiny_vae``: a tiny
            one's configuration (random weights, for ``quality --tiny --frames``), or None.
    """

    cls: str
    config: dict
    tiny: dict
    latent: tuple[int, int, int]
    tiny_latent: tuple[int, int, int]
    text: int
    text_width_key: str
    latent_layout: str = "cfhw"
    channels: int | None = 16
    extra: Callable[..., dict] | None = field(default=None, compare=False)
    float_timestep: bool = False
    vae: str = ""
    tiny_vae: dict | None = field(default=None, compare=False)
    notes: str = field(default="", compare=False)


def _text_mask(batch: int, n_text: int, valid: int | None, device: Any) -> Any:
    import torch

    mask = torch.zeros(batch, n_text, device=device, dtype=torch.long)
    mask[:, :n_text if valid is None else valid] = 1
    return mask


def _cogvideox_extra(model, batch, n_text, text_valid, latent, randn, tiny) -> dict:
    # what CogVideoX's pipeline computes and passes (CogVideoX 1.0: patch_size_t None);
    # the latent has the model's sample size, so the crop region is the whole grid
    if not model.config.use_rotary_positional_embeddings:
        return {}
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    c, (f, h, w) = model.config, latent
    grid = (h // c.patch_size, w // c.patch_size)
    cos, sin = get_3d_rotary_pos_embed(embed_dim=c.attention_head_dim, crops_coords=((0, 0), grid),
                                       grid_size=grid, temporal_size=f, device=model.device)
    return dict(image_rotary_emb=(cos, sin))


def _hunyuan_extra(model, batch, n_text, text_valid, latent, randn, tiny) -> dict:
    import torch

    mask = _text_mask(batch, n_text, text_valid, model.device)
    return dict(encoder_attention_mask=mask,
                pooled_projections=randn(batch, model.config.pooled_projection_dim),
                guidance=torch.full((batch,), 6000.0, device=model.device, dtype=model.dtype))


# HunyuanVideo 1.5's second text stream (ByT5 glyphs) and image tokens (SigLIP), beside its
# main prompt: the pipeline's lengths, and the tiny model's
_HY15_STREAMS = {"published": (256, 729), "tiny": (8, 9)}


def _hunyuan15_extra(model, batch, n_text, text_valid, latent, randn, tiny) -> dict:
    c = model.config
    glyphs, image = _HY15_STREAMS["tiny" if tiny else "published"]
    return dict(encoder_attention_mask=_text_mask(batch, n_text, text_valid, model.device),
                encoder_hidden_states_2=randn(batch, glyphs, c.text_embed_2_dim),
                encoder_attention_mask_2=_text_mask(batch, glyphs, 0, model.device),
                image_embeds=randn(batch, image, c.image_embed_dim) * 0)  # text-to-video


def _mochi_extra(model, batch, n_text, text_valid, latent, randn, tiny) -> dict:
    return dict(encoder_attention_mask=_text_mask(batch, n_text, text_valid, model.device))


def _vace_extra(model, batch, n_text, text_valid, latent, randn, tiny) -> dict:
    return dict(control_hidden_states=randn(batch, model.config.vace_in_channels, *latent))


def _ltx_extra(model, batch, n_text, text_valid, latent, randn, tiny) -> dict:
    f, h, w = latent
    return dict(encoder_attention_mask=_text_mask(batch, n_text, text_valid, model.device),
                num_frames=f, height=h, width=w)


# LTX-2's audio: 25 latent frames a second (16 kHz, hop 160, 4x), beside 121 frames at 24 fps
_LTX2_AUDIO_FRAMES = 126


def _ltx2_extra(model, batch, n_text, text_valid, latent, randn, tiny) -> dict:
    c, (f, h, w) = model.config, latent
    audio = 8 if tiny else _LTX2_AUDIO_FRAMES
    return dict(audio_hidden_states=randn(batch, audio, c.audio_in_channels),
                audio_encoder_hidden_states=randn(batch, n_text, c.caption_channels),
                encoder_attention_mask=_text_mask(batch, n_text, text_valid, model.device),
                audio_encoder_attention_mask=_text_mask(batch, n_text, text_valid,
                                                        model.device),
                num_frames=f, height=h, width=w, audio_num_frames=audio)


_TINY = dict(num_attention_heads=2, attention_head_dim=64)
# What Wan 2.1's two sizes share; they differ in heads, FFN width and depth.
_WAN = dict(patch_size=(1, 2, 2), attention_head_dim=128, in_channels=16, out_channels=16,
            text_dim=4096, freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            eps=1e-6)
_WAN_TINY = dict(_TINY, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2)
_WAN_13B = dict(_WAN, num_attention_heads=12, ffn_dim=8960, num_layers=30)
# Wan's VAE at a tiny width, its published latent statistics kept (16 latent channels)
_WAN_TINY_VAE = dict(base_dim=16, z_dim=16, dim_mult=[1, 1], num_res_blocks=1,
                     temperal_downsample=[False, True], attn_scales=[])
_WAN_VAE = dict(vae="AutoencoderKLWan", tiny_vae=_WAN_TINY_VAE)
# LTX-Video and LTX-2 latents: 8x in time, 32x in space (121 frames -> 16)
_LTX_TINY = dict(_TINY, num_layers=2, in_channels=16, out_channels=16, cross_attention_dim=128,
                 caption_channels=32)

MODELS: dict[str, ModelSpec] = {
    "wan-1.3b": ModelSpec(
        "WanTransformer3DModel", _WAN_13B, _WAN_TINY, (21, 60, 104), (5, 12, 20), 512,
        "text_dim", **_WAN_VAE, notes="480p, 81 frames: 32,760 tokens"),
    "wan-14b": ModelSpec(
        "WanTransformer3DModel", dict(_WAN, num_attention_heads=40, ffn_dim=13824, num_layers=40),
        _WAN_TINY, (21, 90, 160), (5, 12, 20), 512, "text_dim", **_WAN_VAE,
        notes="720p, 81 frames: 75,600 tokens"),
    "wan-vace-1.3b": ModelSpec(
        "WanVACETransformer3DModel",
        dict(_WAN_13B, vace_layers=list(range(0, 30, 2)), vace_in_channels=96),
        dict(_WAN_TINY, vace_layers=[0, 1], vace_in_channels=16), (21, 60, 104), (5, 12, 20),
        512, "text_dim", extra=_vace_extra, **_WAN_VAE,
        notes="480p, 81 frames: 32,760 tokens, 15 control blocks"),
    "skyreels-v2-1.3b": ModelSpec(
        "SkyReelsV2Transformer3DModel", _WAN_13B, _WAN_TINY, (25, 68, 120), (5, 12, 20), 512,
        "text_dim", **_WAN_VAE, notes="540p, 97 frames: 51,000 tokens"),
    "hunyuan": ModelSpec(
        "HunyuanVideoTransformer3DModel",
        dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
             num_layers=20, num_single_layers=40, num_refiner_layers=2, patch_size=2,
             patch_size_t=1, text_embed_dim=4096, pooled_projection_dim=768,
             rope_axes_dim=(16, 56, 56)),
        dict(_TINY, num_layers=1, num_single_layers=1, num_refiner_layers=1, text_embed_dim=32,
             pooled_projection_dim=16, rope_axes_dim=(16, 24, 24)),
        (33, 90, 160), (5, 12, 20), 256, "text_embed_dim", extra=_hunyuan_extra,
        vae="AutoencoderKLHunyuanVideo",
        notes="720p, 129 frames: 118,800 video tokens + 256 text slots"),
    "hunyuan-1.5": ModelSpec(
        "HunyuanVideo15Transformer3DModel", {},
        dict(_TINY, num_layers=2, num_refiner_layers=1, text_embed_dim=32, text_embed_2_dim=16,
             image_embed_dim=16, rope_axes_dim=(16, 24, 24)),
        (31, 30, 53), (5, 12, 20), 1000, "text_embed_dim", channels=None,
        extra=_hunyuan15_extra, float_timestep=True, vae="AutoencoderKLHunyuanVideo15",
        notes="480p, 121 frames: 49,290 video tokens + 1,985 text and image slots"),
    "cogvideox-5b": ModelSpec(
        "CogVideoXTransformer3DModel",
        dict(num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16,
             text_embed_dim=4096, num_layers=42, time_embed_dim=512, sample_width=90,
             sample_height=60, sample_frames=49, patch_size=2,
             use_rotary_positional_embeddings=True),
        dict(_TINY, text_embed_dim=32, num_layers=2, time_embed_dim=32, sample_width=20,
             sample_height=12, sample_frames=17),
        (13, 60, 90), (5, 12, 20), 226, "text_embed_dim", latent_layout="fchw",
        extra=_cogvideox_extra, vae="AutoencoderKLCogVideoX",
        notes="480x720, 49 frames: 17,550 video tokens + 226 text tokens"),
    "mochi": ModelSpec(
        "MochiTransformer3DModel", {},
        dict(_TINY, num_layers=2, pooled_projection_dim=16, text_embed_dim=32, time_embed_dim=32),
        (28, 60, 106), (5, 12, 20), 256, "text_embed_dim", channels=None, extra=_mochi_extra,
        vae="AutoencoderKLMochi",
        notes="480x848, 163 frames: 44,520 video tokens + the prompt's text tokens"),
    # Cosmos-1.0-Diffusion-7B-Text2World's configuration, without the padding-mask channel
    # (its resize needs torchvision; the attention is the same)
    "cosmos-7b": ModelSpec(
        "CosmosTransformer3DModel", dict(concat_padding_mask=False),
        dict(_TINY, num_layers=2, text_embed_dim=32, adaln_lora_dim=16, max_size=(16, 48, 48),
             encoder_hidden_states_channels=32, crossattn_proj_in_channels=32),
        (16, 88, 160), (5, 12, 20), 512, "text_embed_dim", float_timestep=True,
        vae="AutoencoderKLCosmos",
        notes="704x1280, 121 frames: 56,320 tokens"),
    "ltx-video": ModelSpec(
        "LTXVideoTransformer3DModel", {}, _LTX_TINY, (16, 16, 24), (5, 6, 10), 128,
        "caption_channels", latent_layout="tokens", channels=None, extra=_ltx_extra,
        vae="AutoencoderKLLTXVideo",
        notes="512x768, 121 frames: 6,144 tokens"),
    "ltx-2": ModelSpec(
        "LTX2VideoTransformer3DModel", {},
        dict(_LTX_TINY, audio_num_attention_heads=2, audio_attention_head_dim=32,
             audio_cross_attention_dim=64, audio_in_channels=16, audio_out_channels=16),
        (16, 22, 40), (5, 6, 10), 256, "caption_channels", latent_layout="tokens",
        channels=None, extra=_ltx2_extra, vae="AutoencoderKLLTX2Video",
        notes="704x1280, 121 frames: 14,080 video tokens (and 126 audio tokens)"),
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
    ``timestep``; ``text_valid``: the prompt's tokens of the text slots (None: all)."""
    import torch

    spec = MODELS[name]
    p = next(model.parameters())
    g = torch.Generator(device=p.device).manual_seed(seed)
    f, h, w = spec.tiny_latent if tiny else spec.latent
    c = spec.channels or model.config.in_channels
    shape = {"cfhw": (batch, c, f, h, w), "fchw": (batch, f, c, h, w),
             "tokens": (batch, f * h * w, c)}[spec.latent_layout]

    def randn(*s):
        return torch.randn(*s, generator=g, device=p.device, dtype=p.dtype)

    width = model.config[spec.text_width_key]
    n_text = spec.text if not tiny else min(spec.text, 24)
    args = dict(hidden_states=randn(*shape), encoder_hidden_states=randn(batch, n_text, width),
                timestep=torch.full((batch,), timestep, device=p.device,
                                    dtype=p.dtype if spec.float_timestep else torch.long),
                return_dict=False)
    if spec.extra is not None:
        args.update(spec.extra(model, batch, n_text, text_valid, (f, h, w), randn, tiny))
    return args
