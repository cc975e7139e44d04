"""Tessera as the self-attention of diffusers' video transformers, in one call.

::

    from tessera.integrations import diffusers as td
    from tessera.integrations.methods import TopKCubes, Schedule

    session = td.enable(pipe.transformer, TopKCubes(density=0.1),
                        schedule=Schedule(dense_steps=10), scheduler=pipe.scheduler)
    video = pipe(prompt, ...).frames
    td.disable(pipe.transformer)          # the model's own attention again

Supported: ``WanTransformer3DModel`` (Wan 2.1 / 2.2), ``HunyuanVideoTransformer3DModel`` and
``CogVideoXTransformer3DModel`` (diffusers 0.42). Self-attention only; cross-attention and
every other module are left alone.

How it plugs in. Each self-attention module's processor is wrapped (``set_processor``, public):
the wrapper marks the call as Tessera's and runs the model's own processor, which projects,
normalizes and rotates q/k/v as always. The processor's attention function -- diffusers'
``dispatch_attention_fn`` as the Wan and HunyuanVideo modules import it, and
``F.scaled_dot_product_attention`` as ``attention_processor`` (CogVideoX's processor) reaches
it -- is replaced in that module by a router that sends marked calls to Tessera and every
other call to the original, unchanged. diffusers has no public hook for a custom attention
function (its backend registry takes only its own names), so this is the smallest patch;
``tests/integrations/test_diffusers.py`` fails if diffusers moves either name.

The token layout comes from the transformer's inputs (a forward pre-hook): the latent's frames
and size over the patch size, the text tokens attended jointly (HunyuanVideo's after the video,
with its prompt mask's padding; CogVideoX's 226 before it). The denoising step comes from the
``timestep`` the transformer receives: the same timestep is the same step (classifier-free
guidance's second forward), a lower one the next step, a higher one a new video; given the
pipeline's ``scheduler``, the step is the timestep's place in ``scheduler.timesteps`` (two
transformers sharing one schedule, Wan 2.2's, agree on it). ``forwards_per_step=N`` counts N
forwards a step instead, where a model takes no timestep; :meth:`Session.reset` then starts a new
video.

Context parallelism. Where diffusers splits the sequence over GPUs itself
(``transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=U,
ring_degree=R))``, Wan in diffusers 0.42), each rank's self-attention gets its shard, and
Tessera runs it as :func:`tessera.integrations.distributed.sequence_parallel_attention` over
diffusers' context-parallel group: Ulysses (R = 1), the ring (U = 1) or the hybrid, with
fixed masks in the model's token order (:func:`check_context_parallel`).

On CPU tensors the CPU emulator runs the plans in float64 instead of the GPU kernels, with one
warning that it checks correctness, not speed (``torch_attention``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from ..runtime.cache import FixedMaskKey, PlanCache
from ..runtime.plan import plan
from ..runtime.regime import Regime
from ..streams import on_producer_stream
from ..cuda.device import device_cc
from ..families import invert_permutation
from . import distributed, torch_attention
from .methods import LayerMask, Method, Schedule, VideoGeometry

# Fixed-mask plans a session keeps (least recently used dropped first): one per routed layer and
# shapes -- more than the self-attention layers of the video transformers routed (Wan-14B 40,
# HunyuanVideo 60) -- so a step never replans a fixed mask.
FIXED_PLANS_KEPT = 128

__all__ = ["enable", "disable", "sparse", "session_of", "compile_blocks", "Session", "SUPPORTED",
           "check_context_parallel"]


@dataclass(frozen=True)
class _Model:
    """How one diffusers transformer class is wired to Tessera.

    Attributes:
        module: the diffusers module whose attention function the processors call.
        hook: "dispatch" (``dispatch_attention_fn``) or "sdpa" (``F.scaled_dot_product_attention``).
        layout: the q/k/v layout that function gets ("blhd" or "bhld").
        self_attention: the transformer's self-attention modules, in layer order.
        geometries: the layouts of a forward's calls from its inputs (one per batch element
            where they differ, else one).
        blocks: the transformer blocks, in order (their inputs and outputs hold the video
            tokens alone, at sequence dim 1 of argument 0 and of the output's first tensor).
        rotary: where a block takes its rotary tables (argument index, names) and their
            sequence dim; ``per_token_temb``: argument 2 may hold one time embedding per token
            (4 dims: Wan 2.2), which then follows the tokens; ``no_order_arg``: an argument
            index whose presence forbids reordering (HunyuanVideo's first-frame token
            replacement, which needs the frame-major order).
    """

    module: str
    hook: str
    layout: str
    self_attention: Callable[[Any], list]
    geometries: Callable[[Any, tuple, dict], list[VideoGeometry]]
    blocks: Callable[[Any], list] | None = None
    rotary: tuple[int, tuple[str, ...], int] = (3, ("rotary_emb",), 1)
    per_token_temb: bool = False
    no_order_arg: tuple[int, str] | None = None


def _arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    return kwargs[name] if name in kwargs else (args[i] if len(args) > i else None)


def _timestep(module: Any, args: tuple, kwargs: dict) -> float | None:
    """The timestep a transformer forward receives (its first element; None when the forward
    takes none). A device tensor is read back: one small wait at the forward's start."""
    t = kwargs.get("timestep")
    if t is None and args:
        try:
            t = inspect.signature(module.forward).bind_partial(*args).arguments.get("timestep")
        except TypeError:
            t = None
    if t is None:
        return None
    try:
        return float(t.reshape(-1)[0]) if hasattr(t, "reshape") else float(t)
    except (TypeError, ValueError, IndexError):
        return None


def _wan_geometries(model: Any, args: tuple, kwargs: dict) -> list[VideoGeometry]:
    _, _, f, h, w = _arg(args, kwargs, 0, "hidden_states").shape
    pt, ph, pw = model.config.patch_size
    return [VideoGeometry((f // pt, h // ph, w // pw))]


def _hunyuan_geometries(model: Any, args: tuple, kwargs: dict) -> list[VideoGeometry]:
    _, _, f, h, w = _arg(args, kwargs, 0, "hidden_states").shape
    p, pt = model.config.patch_size, model.config.patch_size_t
    text = _arg(args, kwargs, 2, "encoder_hidden_states")
    text_mask = _arg(args, kwargs, 3, "encoder_attention_mask")
    latent = (f // pt, h // p, w // p)
    n_text = int(text.shape[1])
    if text_mask is None:
        return [VideoGeometry(latent, n_text)]
    # The prompt lengths decide the mask's text blocks: read once per forward (the only
    # host synchronization; pass equal-length prompts to keep it cheap).
    valid = [int(x) for x in text_mask.sum(dim=1).tolist()]
    geos = [VideoGeometry(latent, n_text, v) for v in valid]
    return geos[:1] if len(set(valid)) == 1 else geos


def _cogvideox_geometries(model: Any, args: tuple, kwargs: dict) -> list[VideoGeometry]:
    _, f, _, h, w = _arg(args, kwargs, 0, "hidden_states").shape
    p, pt = model.config.patch_size, model.config.patch_size_t or 1
    text = _arg(args, kwargs, 1, "encoder_hidden_states")
    return [VideoGeometry((f // pt, h // p, w // p), int(text.shape[1]), text_first=True)]


def _hunyuan_blocks(m: Any) -> list:
    return list(m.transformer_blocks) + list(m.single_transformer_blocks)


SUPPORTED: dict[str, _Model] = {
    "WanTransformer3DModel": _Model(
        "diffusers.models.transformers.transformer_wan", "dispatch", "blhd",
        lambda m: [b.attn1 for b in m.blocks], _wan_geometries,
        blocks=lambda m: list(m.blocks), rotary=(3, ("rotary_emb",), 1), per_token_temb=True),
    "HunyuanVideoTransformer3DModel": _Model(
        "diffusers.models.transformers.transformer_hunyuan_video", "dispatch", "blhd",
        lambda m: [b.attn for b in _hunyuan_blocks(m)], _hunyuan_geometries,
        blocks=_hunyuan_blocks, rotary=(4, ("freqs_cis", "image_rotary_emb"), 0),
        no_order_arg=(5, "token_replace_emb")),
    "CogVideoXTransformer3DModel": _Model(
        "diffusers.models.attention_processor", "sdpa", "bhld",
        lambda m: [b.attn1 for b in m.transformer_blocks], _cogvideox_geometries,
        blocks=lambda m: list(m.transformer_blocks), rotary=(3, ("image_rotary_emb",), 0)),
}


@dataclass
class Stats:
    """What a session has done: attention calls run by Tessera (sparse) and left to the model
    (dense, by the schedule), and transformer forwards seen."""

    sparse_calls: int = 0
    dense_calls: int = 0
    forwards: int = 0


@dataclass
class Session:
    """Tessera's state on one transformer (what :func:`enable` returns).

    Attributes:
        method: the sparse method (:mod:`tessera.integrations.methods`).
        schedule: when attention stays the model's own (dense).
        forwards_per_step: None (the default): the step from the timestep each forward receives;
            N: every N transformer forwards are one step.
        scheduler: the pipeline's scheduler, whose ``timesteps`` place each timestep (None:
            steps counted from the first timestep seen).
        regime: an execution plan for every call (None: Tessera's own choice).
        keep_order: tokens reordered once per forward for methods with a fixed order
            (:func:`enable`).
        stats: counts (:class:`Stats`).
        attention: what runs a call's mask, ``(q, k, v, mask, layout, scale) -> out``, in the
            session's token orders (None: ``tessera.attention``; benchmarks put another
            block-sparse kernel here to compare on the same masks).
    """

    transformer: Any = field(repr=False)
    model: _Model = field(repr=False)
    method: Method
    schedule: Schedule
    forwards_per_step: int | None = None
    regime: Any = None
    keep_order: bool = False
    scheduler: Any = field(default=None, repr=False)
    stats: Stats = field(default_factory=Stats)
    attention: Callable | None = field(default=None, repr=False)
    _geometries: list = field(default_factory=list, repr=False)
    _originals: list = field(default_factory=list, repr=False)
    _hook: Any = field(default=None, repr=False)
    _indices: dict = field(default_factory=dict, repr=False)
    # The plans of fixed host masks, one a layer and shapes: a model's layers, every one kept.
    _plans: PlanCache = field(default_factory=lambda: PlanCache(FIXED_PLANS_KEPT), repr=False)
    _device_masks: dict = field(default_factory=dict, repr=False)  # host mask id -> its copy
    _video_order: Any = field(default=None, repr=False)  # this forward's, or None
    _ordered: bool = field(default=False, repr=False)  # the blocks' tokens are in it now
    _moved: dict = field(default_factory=dict, repr=False)
    _block_hooks: list = field(default_factory=list, repr=False)
    _post_hook: Any = field(default=None, repr=False)
    _step: int = field(default=0, repr=False)  # from the timesteps
    _last_t: float | None = field(default=None, repr=False)
    _calls_before: int = field(default=0, repr=False)  # routed calls when this forward began
    _warned_unrouted: bool = field(default=False, repr=False)

    @property
    def step(self) -> int:
        """The denoising step of the forward being run (from 0)."""
        if self.forwards_per_step is not None:
            return max(self.stats.forwards - 1, 0) // self.forwards_per_step
        return self._step

    def reset(self) -> None:
        """Start counting steps again (a new video; only needed with ``forwards_per_step``:
        a timestep above the last one starts a new video by itself)."""
        self.stats.forwards = 0
        self._step, self._last_t = 0, None

    def disable(self) -> None:
        """The transformer's own attention again (:func:`disable`)."""
        disable(self.transformer)

    # -- per forward and per call --------------------------------------------------------
    def _before_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        self._geometries = self.model.geometries(module, args, kwargs)
        self.stats.forwards += 1
        self._calls_before = self.stats.sparse_calls + self.stats.dense_calls
        if self.forwards_per_step is None:
            self._step_from(_timestep(module, args, kwargs))
        self._ordered = False
        self._moved = {}
        order = None
        all_dense = all(self.schedule.dense(self.step, layer)
                        for layer in range(len(self._originals)))
        if self.keep_order and self.model.blocks is not None and not all_dense:
            order = self.method.video_order(self._geometries[0])
            # its index tensors made here, eagerly: the block hooks that use them may be traced
            self._index(order, _arg(args, kwargs, 0, "hidden_states").device)
        self._video_order = order

    def _step_from(self, t: float | None) -> None:
        """This forward's step from its timestep ``t`` (None: the model took none -- one
        forward a step)."""
        if t is None:
            self._step = self.stats.forwards - 1
            return
        timesteps = getattr(self.scheduler, "timesteps", None)
        if timesteps is not None and len(timesteps) > 0:
            # (a device tensor copied back whole, not read element by element)
            ts = (timesteps.detach().double().cpu().numpy() if hasattr(timesteps, "detach")
                  else np.asarray(timesteps, dtype=np.float64))
            self._step = int(np.argmin(np.abs(ts - t)))
        elif self._last_t is None or t > self._last_t:
            self._step = 0  # the first forward, or the noise level rose again: a new video
        elif t < self._last_t:
            self._step += 1
        self._last_t = t

    def _after_forward(self, module: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """Warn once when a forward routed no self-attention call: its processors were replaced
        after :func:`enable`, or the model runs attention some other way, and the forward ran
        without Tessera."""
        routed = self.stats.sparse_calls + self.stats.dense_calls - self._calls_before
        if routed == 0 and self._originals and not self._warned_unrouted:
            self._warned_unrouted = True
            warnings.warn(f"Tessera is enabled on this {type(module).__name__}, but its forward "
                          "routed no self-attention call through it: were its attention "
                          "processors replaced after tessera.integrations.diffusers.enable? "
                          "Enable again after replacing them", stacklevel=2)

    # -- the method's token order kept from the first block to the last ---------------------
    def _reorder(self, x: Any, dim: int, inverse: bool = False) -> Any:
        idx, inv = self._index(self._video_order, x.device)
        return x.index_select(dim, inv if inverse else idx)

    def _moved_once(self, x: Any, dim: int) -> Any:
        """``x`` (a per-token input every block gets: rotary tables, Wan 2.2's per-token time
        embedding) in the method's order, reordered once per forward -- or, in a compiled block,
        at every block: a cache keyed by the tensor would make the compiled block's guards
        depend on each forward's tensors (a recompile per forward), while the compiled gather
        fuses into the block's use of the tables."""
        import torch

        if torch.compiler.is_compiling():
            return self._reorder(x, dim)
        got = self._moved.get(id(x))
        if got is None or got[0] is not x:
            got = self._moved[id(x)] = (x, self._reorder(x, dim))
        return got[1]

    def _before_block(self, first: bool, module: Any, args: tuple, kwargs: dict):
        """A block's inputs in the method's order: the hidden states at the first block (the
        later ones get the previous block's, already reordered), the per-token inputs at
        every block. Nothing between two blocks mixes tokens, so the layers in between run
        unchanged on reordered tokens."""
        if self._video_order is None:
            return None
        m = self.model
        if first:
            banned = m.no_order_arg is not None and \
                _arg(args, kwargs, *m.no_order_arg) is not None
            hidden = _arg(args, kwargs, 0, "hidden_states")
            if banned or hidden.shape[1] != self._video_order.size:
                self._video_order = None  # this forward keeps the model's order
                return None
            self._ordered = True
        elif not self._ordered:
            return None
        args, kwargs = list(args), dict(kwargs)

        def replace(i: int, names: tuple[str, ...], fn) -> None:
            for name in names:
                if name in kwargs:
                    if kwargs[name] is not None:
                        kwargs[name] = fn(kwargs[name])
                    return
            if len(args) > i and args[i] is not None:
                args[i] = fn(args[i])

        if first:
            replace(0, ("hidden_states",), lambda x: self._reorder(x, 1))
        i, names, dim = m.rotary
        replace(i, names, lambda r: tuple(self._moved_once(t, dim) for t in r)
                if isinstance(r, (tuple, list)) else self._moved_once(r, dim))
        if m.per_token_temb:
            replace(2, ("temb",), lambda t: self._moved_once(t, 1) if t.ndim == 4 else t)
        return tuple(args), kwargs

    def _after_last_block(self, module: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        """The last block's hidden states back in the model's order."""
        if not self._ordered:
            return None
        self._ordered = False
        if isinstance(out, tuple):
            return (self._reorder(out[0], 1, inverse=True), *out[1:])
        return self._reorder(out, 1, inverse=True)

    def _scheduled_dense(self, layer: int) -> bool:
        """Whether layer ``layer``'s call of this step stays the model's own (counted)."""
        if self.schedule.dense(self.step, layer):
            self.stats.dense_calls += 1
            return True
        return False

    def _layout(self) -> tuple[str, int, list]:
        """The model's q/k/v layout, its sequence dimension, this forward's geometries."""
        layout = self.model.layout
        return layout, 1 if layout == "blhd" else 2, self._geometries

    def _attend(self, layer: int, q: Any, k: Any, v: Any, scale: float | None,
                dense: Callable[[], Any], ordered: bool | None = None) -> Any:
        """One self-attention call of layer ``layer``: the model's own (``dense``) where the
        schedule says so, else Tessera with the method's mask. ``ordered``: whether the tokens
        are in the method's order already (None: as the block hooks left them)."""
        if self._scheduled_dense(layer):
            return dense()
        layout, seq, geos = self._layout()
        if not geos:
            raise RuntimeError("Tessera saw an attention call outside the transformer's "
                               "forward: call the transformer itself (its forward sets the "
                               "token layout)")
        if q.shape[seq] != geos[0].tokens or k.shape[seq] != geos[0].tokens:
            raise RuntimeError(
                f"self-attention over {q.shape[seq]} queries and {k.shape[seq]} keys, but the "
                f"transformer's inputs give {geos[0].tokens} tokens ({geos[0]}): this diffusers "
                "version lays tokens out differently from what Tessera supports")
        self.stats.sparse_calls += 1
        if len(geos) == 1:
            return self._sparse(q, k, v, geos[0], layout, scale, ordered)
        import torch

        return torch.cat([self._sparse(q[b:b + 1], k[b:b + 1], v[b:b + 1], g, layout, scale,
                                       ordered)
                          for b, g in enumerate(geos)], dim=0)

    def _attend_parallel(self, layer: int, q: Any, k: Any, v: Any, scale: float | None,
                         dense: Callable[[], Any], cp: Any) -> Any:
        """One self-attention call under diffusers' context parallelism (``cp``: the model's
        ``ContextParallelConfig``, set up by ``enable_parallelism``): ``q``/``k``/``v`` are
        this rank's sequence shard, and Tessera's sequence-parallel attention runs the
        method's mask over the whole sequence -- Ulysses, the ring, or the hybrid (Ulysses
        inside the ``ulysses_degree`` ranks of one ring position) as ``cp``'s degrees say,
        over the same ranks in the same order as diffusers' own."""
        if self._scheduled_dense(layer):
            return dense()
        layout, seq, geos = self._layout()
        if not geos or any(g != geos[0] for g in geos):
            raise RuntimeError("context parallelism needs the transformer's forward (its "
                               "inputs set the token layout) and one layout for the batch")
        geo = geos[0]
        check_context_parallel(self.method, self.keep_order, geo)
        import torch.distributed as dist

        group = cp._flattened_mesh.get_group()
        rank, ranks = dist.get_rank(group), dist.get_world_size(group)
        lo, hi = distributed.shard_ranges(geo.tokens, ranks)[rank]
        if q.shape[seq] != hi - lo or k.shape[seq] != hi - lo:
            raise RuntimeError(
                f"rank {rank} of {ranks} got {q.shape[seq]} queries and {k.shape[seq]} keys; "
                f"the transformer's {geo.tokens} tokens split over the context-parallel group "
                f"give it tokens {lo}..{hi}: this diffusers version shards differently from "
                "what Tessera supports")
        lm = self.method.layer_mask(geo)
        mask = self._device_mask(lm.mask)
        self.stats.sparse_calls += 1
        if cp.ring_degree == 1:
            mode, udeg = "ulysses", None
        elif cp.ulysses_degree == 1:
            mode, udeg = "ring", None
        else:
            mode, udeg = "hybrid", cp.ulysses_degree
        return distributed.sequence_parallel_attention(q, k, v, mask, group=group, mode=mode,
                                                       layout=layout, scale=scale,
                                                       ulysses_degree=udeg)

    def _device_mask(self, mask: Any) -> Any:
        """A fixed host mask's device copy, made once (the sequence-parallel schedule cuts and
        plans its parts on the GPU); a device mask, or any mask off the GPU path, as it is."""
        import torch

        if mask.on_device or not torch.cuda.is_available():
            return mask
        got = self._device_masks.get(id(mask))
        if got is None or got[0] is not mask:
            if len(self._device_masks) > 64:
                self._device_masks.clear()
            got = self._device_masks[id(mask)] = (mask, mask.to_device())
        return got[1]

    def _index(self, order: np.ndarray, device: Any) -> Any:
        """``order`` and its inverse as index tensors on ``device`` (made once per order)."""
        import torch

        key = (id(order), str(device))
        got = self._indices.get(key)
        if got is None or got[0] is not order:
            if len(self._indices) > 64:
                self._indices.clear()
            idx = torch.tensor(order, device=device)  # (a copy: orders may be read-only)
            inv = torch.tensor(invert_permutation(np.asarray(order)), device=device)
            got = self._indices[key] = (order, idx, inv)
        return got[1], got[2]

    def _sparse(self, q: Any, k: Any, v: Any, geo: VideoGeometry, layout: str,
                scale: float | None, ordered: bool | None = None) -> Any:
        seq = 1 if layout == "blhd" else 2
        lm = self._layer_mask(geo, q, k, layout, self._ordered if ordered is None else ordered)
        if lm.q_order is not None:
            iq, inv = self._index(lm.q_order, q.device)
            ik, _ = self._index(lm.key_order, q.device)
            q = q.index_select(seq, iq)
            k, v = k.index_select(seq, ik), v.index_select(seq, ik)
        if self.attention is not None:
            out = self.attention(q, k, v, lm.mask, layout, scale)
        else:
            out = self._run(q, k, v, lm.mask, layout, scale)
        if lm.q_order is not None:
            out = out.index_select(seq, inv)
        return out

    def _layer_mask(self, geo: VideoGeometry, q: Any, k: Any, layout: str,
                    ordered: bool) -> LayerMask:
        if not self.method.dynamic:
            return self.method.layer_mask(geo, ordered=ordered)
        qh, kh = (x.transpose(1, 2) if layout == "blhd" else x for x in (q, k))
        if not qh.is_cuda:
            return self.method.layer_mask(geo, qh.float().numpy(), kh.float().numpy(),
                                          ordered=ordered)
        import cupy as cp

        # The mask is made on torch's current stream (ordered after q and k, and the stream a
        # CUDA graph captures), with no host synchronization.
        with on_producer_stream(qh):
            return self.method.layer_mask(geo, cp.from_dlpack(qh), cp.from_dlpack(kh),
                                          ordered=ordered)


    def _run(self, q: Any, k: Any, v: Any, mask: Any, layout: str,
             scale: float | None) -> Any:
        """Tessera's attention: a device mask (made every call) as a request, which replans a
        kept plan; a fixed host mask planned once per shapes, then only run. On CPU tensors the
        float64 reference."""
        if not q.is_cuda or mask.on_device:
            return torch_attention.attention(q, k, v, mask, layout=layout, scale=scale,
                                             regime=self.regime)
        heads = 2 if layout == "blhd" else 1
        key = FixedMaskKey(id(mask), (q.shape[0], q.shape[heads], k.shape[heads], q.shape[-1],
                                      str(q.dtype), layout), q.device.index)
        p = self._plans.take(key)
        if p is None or p.mask is not mask:
            p = plan(mask, num_q_heads=q.shape[heads], num_kv_heads=k.shape[heads],
                     head_dim=q.shape[-1], batch=q.shape[0], dtype=q.dtype, layout=layout,
                     regime=self.regime, arch=device_cc())  # (this GPU's kernels)
        self._plans.keep(key, p)
        return p.run(q, k, v, scale=scale)


def check_context_parallel(method: Method, keep_order: bool,
                           geo: VideoGeometry | None = None) -> None:
    """Refuse, by name, what diffusers' context parallelism cannot run with Tessera: a rank
    holds a contiguous shard of the model's token order, so the method's mask must be in that
    order (no per-call or kept reordering; checked for layout ``geo`` when given) and made
    without q and k (which no rank holds whole)."""
    if method.dynamic:
        raise ValueError(f"method {method.name!r} makes its mask from the whole sequence's q "
                         "and k, which no rank holds under context parallelism; use a fixed "
                         "mask in the model's token order (radial, spatial_temporal)")
    if keep_order or (geo is not None and method.layer_mask(geo).q_order is not None):
        raise ValueError(f"method {method.name!r} reorders the tokens, which the sequence "
                         "shards of context parallelism do not allow; use a method in the "
                         "model's token order (radial, spatial_temporal)")


# ---- the call marking and the routers ---------------------------------------------------
# How a self-attention call reaches Tessera, eagerly and under torch.compile alike: the wrapped
# processor pushes its mark on `_calls` around the model's own processor; the router (the
# function that processor calls) sees the mark and calls the custom op ``tessera::routed_attention``
# with it, which runs the session's attention (or the model's own where the schedule keeps the
# layer dense). A plain list and an op are what dynamo traces: it follows the push and pop as
# side effects and keeps the op opaque in the graph, so ``compile_repeated_blocks(fullgraph=
# True)`` holds one graph for every block. The mark carries the layer as a CPU tensor (a graph
# input, not a constant: one compiled block serves every layer) and the transformer as the int
# key of its session in `_sessions`.
@dataclass(frozen=True)
class _Mark:
    transformer: int  # id of the transformer: its session is _sessions[transformer]
    layer: Any  # int64 CPU tensor of one element


# The marks of the self-attention calls being run, innermost last: one list for the process
# (dynamo traces no thread-local state), so transformers run Tessera from one thread at a time.
_calls: list[_Mark] = []


class _Routed:
    """A self-attention processor wrapped: marks its calls as Tessera's and runs the model's
    own. Attributes diffusers reads or sets on a processor reach the wrapped one."""

    def __init__(self, original: Any, mark: _Mark) -> None:
        object.__setattr__(self, "_tessera", (original, mark))

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_tessera")[0], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tessera[0], name, value)


_ROUTED: dict[type, type] = {}


def _routed(original: Any, mark: _Mark) -> _Routed:
    """The wrapper of ``original``: a class per processor class, whose ``__call__`` has the
    original's signature (diffusers' ``Attention.forward`` passes only the keyword arguments
    the processor's signature names)."""
    cls = type(original)
    wrapper = _ROUTED.get(cls)
    if wrapper is None:
        def __call__(self, attn, *args, **kwargs):
            original, mark = self._tessera
            _calls.append(mark)
            try:
                return original(attn, *args, **kwargs)
            finally:
                _calls.pop()

        __call__.__signature__ = inspect.signature(cls.__call__)
        wrapper = _ROUTED[cls] = type(f"Tessera{cls.__name__}", (_Routed,),
                                      {"__call__": __call__})
    return wrapper(original, mark)


def _routed_call(transformer: int, layer: int, q: Any, k: Any, v: Any, attn_mask: Any,
                 scale: float | None, enable_gqa: bool, backend: str | None,
                 ordered: bool) -> Any:
    """The routed call as the op runs it: the session's attention for ``layer``, with the
    model's own attention function (what the router replaced) for scheduled-dense layers.
    ``ordered``: whether the tokens are in the method's order, as the router saw it -- under
    torch.compile the block hooks' state when the block was traced (their writes to the
    session land after the graph has run, so the op cannot read them then)."""
    session = _sessions.get(transformer)
    if session is None:
        raise RuntimeError("a routed self-attention call of a transformer Tessera is no longer "
                           "enabled on (compiled while enabled: compile it again after "
                           "tessera.integrations.diffusers.disable)")
    original = _original_function(session.model)
    if session.model.hook == "dispatch":
        def own():
            kw = {} if backend is None else {"backend": _backend_name(backend)}
            return original(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=enable_gqa,
                            **kw)
    else:
        def own():
            return original.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                         scale=scale, enable_gqa=enable_gqa)
    # (attn_mask: HunyuanVideo's prompt padding, which the mask's text blocks encode)
    return session._attend(layer, q, k, v, scale, own, ordered).contiguous()


def _backend_name(value: str) -> Any:
    from diffusers.models.attention_dispatch import AttentionBackendName

    return AttentionBackendName(value)


_op: Any = None  # torch.ops.tessera.routed_attention once registered (_register_op)


def _register_op() -> None:
    """Registers ``tessera::routed_attention`` (once; at :func:`enable`, outside any trace:
    torch is optional, and the routers only read `_op`)."""
    global _op
    if _op is not None:
        return
    import torch

    # (the schema spelled out: this module's annotations are strings, which torch cannot read)
    @torch.library.custom_op(
        "tessera::routed_attention", mutates_args=(),
        schema="(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, Tensor layer, "
               "int transformer, float? scale, bool enable_gqa, str? backend, bool ordered) "
               "-> Tensor")
    def routed_attention(q, k, v, attn_mask, layer, transformer, scale, enable_gqa, backend,
                         ordered):
        return _routed_call(transformer, int(layer), q, k, v, attn_mask, scale, enable_gqa,
                            backend, ordered)

    @routed_attention.register_fake
    def _(q, k, v, attn_mask, layer, transformer, scale, enable_gqa, backend, ordered):
        # the output: q's shape with v's head dim, contiguous (the real op returns it so)
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    _op = torch.ops.tessera.routed_attention


def _dispatch_router(original: Callable) -> Callable:
    def dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0,
                              is_causal=False, scale=None, enable_gqa=False,
                              attention_kwargs=None, *, backend=None, parallel_config=None):
        def own():
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                            attention_kwargs=attention_kwargs, backend=backend,
                            parallel_config=parallel_config)

        if not _calls or dropout_p or is_causal:
            return own()
        mark = _calls[-1]
        if parallel_config is not None:
            cp = getattr(parallel_config, "context_parallel_config", None)
            if cp is None:  # tensor parallelism alone: each rank's heads, the model's own
                return own()
            return _sessions[mark.transformer]._attend_parallel(int(mark.layer), query, key,
                                                                value, scale, own, cp)
        name = None if backend is None else getattr(backend, "value", backend)
        return _op(query, key, value, attn_mask, mark.layer, mark.transformer, scale,
                   enable_gqa, name, _sessions[mark.transformer]._ordered)

    dispatch_attention_fn._tessera_original = original
    return dispatch_attention_fn


class _RoutedFunctional:
    """``torch.nn.functional`` as one diffusers module sees it: the same functions, with
    ``scaled_dot_product_attention`` routed for Tessera's calls."""

    def __init__(self, functional: Any) -> None:
        self._tessera_original = functional

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tessera_original, name)

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if not _calls or attn_mask is not None or dropout_p or is_causal:
            return self._tessera_original.scaled_dot_product_attention(
                query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        mark = _calls[-1]
        return _op(query, key, value, None, mark.layer, mark.transformer, scale, enable_gqa,
                   None, _sessions[mark.transformer]._ordered)


def _original_function(model: _Model) -> Any:
    """What the router replaced in ``model``'s module: ``dispatch_attention_fn``, or ``F``."""
    mod = importlib.import_module(model.module)
    if model.hook == "dispatch":
        return mod.dispatch_attention_fn._tessera_original
    return mod.F._tessera_original


_installed: dict[str, int] = {}  # module -> sessions using its router


def _install(model: _Model) -> None:
    mod = importlib.import_module(model.module)
    if _installed.get(model.module, 0) == 0:
        if model.hook == "dispatch":
            fn = getattr(mod, "dispatch_attention_fn", None)
            if fn is None:
                raise RuntimeError(f"{model.module} has no dispatch_attention_fn: this diffusers "
                                   "version is not one Tessera supports (0.42)")
            mod.dispatch_attention_fn = _dispatch_router(fn)
        else:
            fn = getattr(mod, "F", None)
            if fn is None or not hasattr(fn, "scaled_dot_product_attention"):
                raise RuntimeError(f"{model.module} has no F.scaled_dot_product_attention: this "
                                   "diffusers version is not one Tessera supports (0.42)")
            mod.F = _RoutedFunctional(fn)
    _installed[model.module] = _installed.get(model.module, 0) + 1


def _uninstall(model: _Model) -> None:
    n = _installed.get(model.module, 0) - 1
    _installed[model.module] = max(n, 0)
    if n == 0:
        name = "dispatch_attention_fn" if model.hook == "dispatch" else "F"
        setattr(importlib.import_module(model.module), name, _original_function(model))


# ---- the public calls -------------------------------------------------------------------
_sessions: dict[int, Session] = {}


def enable(transformer: Any, method: Method, *, schedule: Schedule | None = None,
           scheduler: Any = None, forwards_per_step: int | None = None, keep_order: bool = False,
           regime: Any = None) -> Session:
    """Run ``transformer``'s self-attention through Tessera with ``method``'s masks; returns the
    :class:`Session` (counts, :meth:`Session.reset`, :meth:`Session.disable`). Enabling again
    replaces the method and schedule. The step each forward is at comes from the timestep it
    receives, placed in ``scheduler.timesteps`` when the pipeline's ``scheduler`` is given
    (``forwards_per_step=N``: N forwards a step, counted). ``keep_order``: for methods with a
    fixed token order
    (sliding tiles, cubes), reorder the tokens once per forward -- before the first block,
    back after the last -- instead of around every attention call (1.5% of a Wan-1.3B
    forward on the H200; off by default: docs/integrations.md)."""
    if regime is not None and not isinstance(regime, Regime):
        raise TypeError(f"regime must be a tessera.Regime or None, got {type(regime).__name__}")
    name = type(transformer).__name__
    if name not in SUPPORTED:
        raise TypeError(f"transformer must be one of {', '.join(SUPPORTED)}, got {name}")
    if not isinstance(method, Method):
        raise TypeError(f"method must be a tessera.integrations.methods.Method (SlidingTile, "
                        f"TopKCubes, ...), got {type(method).__name__}")
    schedule = Schedule() if schedule is None else schedule
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a tessera.integrations.methods.Schedule, got "
                        f"{type(schedule).__name__}")
    if forwards_per_step is not None and (isinstance(forwards_per_step, bool) or not isinstance(
            forwards_per_step, int) or forwards_per_step < 1):
        raise ValueError(f"forwards_per_step must be None (steps from the timesteps) or an int "
                         f">= 1, got {forwards_per_step!r}")
    if scheduler is not None and not hasattr(scheduler, "timesteps"):
        raise TypeError(f"scheduler must be the pipeline's scheduler (with .timesteps) or None, "
                        f"got {type(scheduler).__name__}")
    if not isinstance(keep_order, bool):
        raise TypeError(f"keep_order must be True or False, got {keep_order!r}")
    parallel = getattr(transformer, "_parallel_config", None)
    if getattr(parallel, "context_parallel_config", None) is not None:
        check_context_parallel(method, keep_order)  # (the token order: at the first call)
    if id(transformer) in _sessions:
        disable(transformer)
    model = SUPPORTED[name]
    _install(model)
    session = Session(transformer, model, method, schedule, forwards_per_step, regime,
                      keep_order=keep_order, scheduler=scheduler)
    import torch

    _register_op()
    try:
        for layer, attn in enumerate(model.self_attention(transformer)):
            original = attn.processor
            session._originals.append((attn, original))
            mark = _Mark(id(transformer), torch.tensor(layer, dtype=torch.int64))
            attn.set_processor(_routed(original, mark))
        # (run eagerly where the whole transformer is compiled: it reads the inputs' layout on
        # the host -- a graph break there, its blocks compiled whole)
        session._hook = transformer.register_forward_pre_hook(
            torch.compiler.disable(session._before_forward), with_kwargs=True)
        session._post_hook = transformer.register_forward_hook(
            torch.compiler.disable(session._after_forward), with_kwargs=True)
        blocks = model.blocks(transformer) if keep_order and model.blocks is not None else []
        for i, block in enumerate(blocks):
            session._block_hooks.append(block.register_forward_pre_hook(
                functools.partial(session._before_block, i == 0), with_kwargs=True))
        if blocks:
            session._block_hooks.append(blocks[-1].register_forward_hook(
                session._after_last_block, with_kwargs=True))
    except Exception:
        _unhook(session)
        _uninstall(model)
        raise
    _sessions[id(transformer)] = session
    return session


@contextlib.contextmanager
def sparse(pipe: Any, method: Method, *, schedule: Schedule | None = None,
           keep_order: bool = False, regime: Any = None) -> Iterator[list[Session]]:
    """Tessera on a pipeline's transformers for a ``with`` block, the model's own attention
    after it::

        with td.sparse(pipe, SlidingTile(window=(2, 3, 3)), schedule=Schedule(dense_steps=10)):
            video = pipe(prompt).frames[0]

    Every transformer of ``pipe`` (``transformer``, and Wan 2.2's ``transformer_2``) is enabled
    with the pipeline's ``scheduler`` for the steps; ``pipe`` may also be a transformer alone.
    Yields the sessions, one a transformer."""
    transformers = [t for t in (getattr(pipe, "transformer", None),
                                getattr(pipe, "transformer_2", None)) if t is not None]
    if not transformers:
        transformers = [pipe]
    scheduler = getattr(pipe, "scheduler", None)
    enabled = []
    try:
        for t in transformers:
            enabled.append(t)
            enable(t, method, schedule=schedule, scheduler=scheduler, keep_order=keep_order,
                   regime=regime)
        yield [_sessions[id(t)] for t in transformers]
    finally:
        for t in enabled:
            disable(t)


def disable(transformer: Any) -> None:
    """``transformer``'s own attention again, exactly as before :func:`enable` (a no-op when
    Tessera is not enabled on it)."""
    session = _sessions.pop(id(transformer), None)
    if session is None:
        return
    _unhook(session)
    _uninstall(session.model)


def _unhook(session: Session) -> None:
    for attn, original in session._originals:
        attn.set_processor(original)
    for h in [session._hook, session._post_hook, *session._block_hooks]:
        if h is not None:
            h.remove()


def session_of(transformer: Any) -> Session | None:
    """The session enabled on ``transformer``, or None."""
    return _sessions.get(id(transformer))


def compile_blocks(transformer: Any, **compile_kwargs: Any) -> None:
    """``torch.compile`` each of ``transformer``'s blocks (regional compilation, as diffusers'
    ``compile_repeated_blocks`` does for the models that declare their blocks; CogVideoX's
    too), with ``compile_kwargs`` (e.g. ``fullgraph=True``). With Tessera enabled, before or
    after, a routed self-attention is one opaque op in each block's graph: one compiled block
    serves every layer, and the block compiles whole."""
    name = type(transformer).__name__
    if name not in SUPPORTED:
        raise TypeError(f"transformer must be one of {', '.join(SUPPORTED)}, got {name}")
    for block in SUPPORTED[name].blocks(transformer):
        block.compile(**compile_kwargs)
