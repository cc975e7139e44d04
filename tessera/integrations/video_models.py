"""What each family of diffusers video transformers is, as Tessera routes it: which modules are
its self-attention, the latent grid a forward's inputs give, and where jointly attended text
sits. A transformer belongs to a family by class -- its own or a base class (subclasses
belong) -- never by name alone; which calls reach Tessera is decided per call from the shapes
(:mod:`tessera.integrations.diffusers`). Needs diffusers only to look the classes up."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Family", "FAMILIES", "TESTED_DIFFUSERS", "is_tested", "family_of", "forward_inputs"]

# The diffusers minor releases the integration's tests run on (the two newest on the index);
# others are checked at enable for what Tessera needs, and warned about once.
TESTED_DIFFUSERS = ("0.41", "0.42")


def is_tested(version: str) -> bool:
    """Whether diffusers ``version`` (e.g. "0.42.1") is of a tested minor release."""
    return ".".join(version.split(".")[:2]) in TESTED_DIFFUSERS


def forward_inputs(module: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A forward's inputs by parameter name (positional ones named from the signature)."""
    if not args:
        return dict(kwargs)
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    except TypeError:
        return dict(kwargs)
    return dict(bound.arguments)


def _patch(config: Any) -> tuple[int, int, int]:
    """The patch ``(t, h, w)``: a tuple ``patch_size`` (Wan), or a spatial ``patch_size`` and an
    optional ``patch_size_t`` (HunyuanVideo, CogVideoX 1.5, LTX; absent or None: 1)."""
    p = config.patch_size
    if isinstance(p, (tuple, list)):
        return int(p[0]), int(p[1]), int(p[2])
    return int(getattr(config, "patch_size_t", None) or 1), int(p), int(p)


def _grid_of_latent(frames_first: bool) -> Callable[[Any, dict], tuple[int, int, int] | None]:
    """The grid of a 5-D latent ``[B, C, F, H, W]`` (``[B, F, C, H, W]``: CogVideoX)."""
    def grid(model: Any, inputs: dict) -> tuple[int, int, int] | None:
        x = inputs.get("hidden_states")
        if x is None or getattr(x, "ndim", 0) != 5:
            return None
        f, h, w = (x.shape[1], x.shape[3], x.shape[4]) if frames_first else x.shape[2:]
        pt, ph, pw = _patch(model.config)
        return int(f) // pt, int(h) // ph, int(w) // pw
    return grid


def _grid_of_sizes(model: Any, inputs: dict) -> tuple[int, int, int] | None:
    """The grid of packed tokens (LTX): the latent's ``num_frames``, ``height``, ``width``
    inputs over the patch (None when the caller leaves them out)."""
    sizes = [inputs.get(n) for n in ("num_frames", "height", "width")]
    if any(s is None for s in sizes):
        return None
    pt, ph, pw = _patch(model.config)
    return int(sizes[0]) // pt, int(sizes[1]) // ph, int(sizes[2]) // pw


@dataclass(frozen=True)
class Family:
    """How one family of diffusers video transformers reaches Tessera.

    Attributes:
        name: what users call it.
        classes: its diffusers classes (their subclasses belong too).
        self_attention: its self-attention modules over the video, in layer order (the
            schedule's layers).
        grid: the latent grid ``(t, h, w)`` after patchifying, frame-major, from a forward's
            inputs by name (None: this forward's calls stay the model's own).
        text: where tokens attended jointly with the video sit: "after" or "before" the video,
            None where text comes by cross-attention only (a longer call is not routed).
        padding: how a call's attention mask marks padded text: "keys" (one row for every
            query), or "outer" (valid queries by valid keys, HunyuanVideo 1.5's; read at a
            video query's row). A mask of any other form leaves the call to the model.
        blocks: the transformer blocks, in order, for ``keep_order`` (their inputs and outputs
            hold the video tokens alone, at sequence dim 1 of argument 0 and of the output's
            first tensor); None: the family keeps no order across blocks.
        rotary: where a block takes its rotary tables (argument index, names) and their
            sequence dim; ``per_token_temb``: argument 2 may hold one time embedding per token
            (4 dims: Wan 2.2), which then follows the tokens; ``no_order_arg``: a first block's
            argument (index, name) whose presence forbids reordering (HunyuanVideo's
            first-frame token replacement, which needs the frame-major order).
    """

    name: str
    classes: tuple[str, ...]
    self_attention: Callable[[Any], list]
    grid: Callable[[Any, dict], tuple[int, int, int] | None]
    text: str | None = None
    padding: str = "keys"
    blocks: Callable[[Any], list] | None = None
    rotary: tuple[int, tuple[str, ...], int] = (3, ("rotary_emb",), 1)
    per_token_temb: bool = False
    no_order_arg: tuple[int, str] | None = None


def _attn1(blocks: str) -> Callable[[Any], list]:
    return lambda m: [b.attn1 for b in getattr(m, blocks)]


def _hunyuan_blocks(m: Any) -> list:
    return list(m.transformer_blocks) + list(m.single_transformer_blocks)


_LATENT, _LATENT_FRAMES_FIRST = _grid_of_latent(False), _grid_of_latent(True)

FAMILIES: tuple[Family, ...] = (
    Family("Wan 2.1 / 2.2", ("WanTransformer3DModel",), _attn1("blocks"), _LATENT,
           blocks=lambda m: list(m.blocks), rotary=(3, ("rotary_emb",), 1),
           per_token_temb=True),
    # the control blocks attend over the control latent, patched to the same grid
    Family("Wan VACE", ("WanVACETransformer3DModel",),
           lambda m: [b.attn1 for b in m.blocks] + [b.attn1 for b in m.vace_blocks], _LATENT),
    Family("SkyReels-V2", ("SkyReelsV2Transformer3DModel",), _attn1("blocks"), _LATENT),
    Family("HunyuanVideo", ("HunyuanVideoTransformer3DModel",),
           lambda m: [b.attn for b in _hunyuan_blocks(m)], _LATENT, text="after",
           blocks=_hunyuan_blocks, rotary=(4, ("freqs_cis", "image_rotary_emb"), 0),
           no_order_arg=(5, "token_replace_emb")),
    Family("HunyuanVideo 1.5", ("HunyuanVideo15Transformer3DModel",),
           lambda m: [b.attn for b in m.transformer_blocks], _LATENT, text="after",
           padding="outer"),
    Family("CogVideoX", ("CogVideoXTransformer3DModel",), _attn1("transformer_blocks"),
           _LATENT_FRAMES_FIRST, text="before", blocks=lambda m: list(m.transformer_blocks),
           rotary=(3, ("image_rotary_emb",), 0)),
    Family("Mochi", ("MochiTransformer3DModel",), _attn1("transformer_blocks"), _LATENT,
           text="after"),
    Family("Cosmos (Predict 1)", ("CosmosTransformer3DModel",), _attn1("transformer_blocks"),
           _LATENT),
    Family("LTX-Video", ("LTXVideoTransformer3DModel",), _attn1("transformer_blocks"),
           _grid_of_sizes),
    # the video self-attention; the audio stream's attention stays the model's own
    Family("LTX-2", ("LTX2VideoTransformer3DModel",), _attn1("transformer_blocks"),
           _grid_of_sizes),
)


def family_of(transformer: Any) -> Family:
    """The family of ``transformer``: the nearest class in its bases that a family names.
    Raises TypeError naming the families (and those this diffusers version lacks)."""
    import diffusers

    known = {}
    for fam in FAMILIES:
        for name in fam.classes:
            cls = getattr(diffusers, name, None)
            if cls is not None:
                known[cls] = fam
    for cls in type(transformer).__mro__:
        if cls in known:
            return known[cls]
    lacking = [f"{f.name} ({', '.join(f.classes)})" for f in FAMILIES if f not in
               known.values()]
    note = (f"; diffusers {diffusers.__version__} lacks {', '.join(lacking)}" if lacking
            else "")
    raise TypeError(f"transformer must be a diffusers video transformer of a family Tessera "
                    f"routes ({', '.join(f.name for f in FAMILIES)}: their classes or "
                    f"subclasses), got {type(transformer).__name__}{note}")
