"""Tessera as the self-attention of diffusers' video transformers, in one call.

::

    from tessera.integrations import diffusers as td
    from tessera.integrations.methods import TopKCubes, Schedule

    session = td.enable(pipe.transformer, TopKCubes(density=0.1),
                        schedule=Schedule(dense_steps=10), scheduler=pipe.scheduler)
    video = pipe(prompt, ...).frames
    td.disable(pipe.transformer)          # the model's own attention again

Supported: the families of :mod:`tessera.integrations.video_models` -- Wan 2.1 / 2.2 and Wan
VACE, SkyReels-V2, HunyuanVideo and HunyuanVideo 1.5, CogVideoX, Mochi, Cosmos, LTX-Video, LTX-2
(their image-to-video variants are the same classes), and subclasses of their classes;
diffusers 0.41 and 0.42 are tested, others checked at :func:`enable`. Self-attention over the
video only; cross-attention, LTX-2's audio stream and every other module are left alone.

How it plugs in. Each self-attention module's processor is wrapped (``set_processor``, public):
the wrapper marks the call as Tessera's and runs the model's own processor, which projects,
normalizes and rotates q/k/v as always. The attention function that processor calls -- diffusers'
``dispatch_attention_fn`` or ``F.scaled_dot_product_attention``, whichever the module defining
the processor's class holds -- is replaced in that module by a router that sends marked calls
to Tessera and every other call to the original, unchanged (its arguments read by name from the
original's own signature; a call setting anything Tessera does not take -- dropout, causality,
a keyword it does not know -- goes to the original as made). diffusers has no public hook for a
custom attention function (its backend registry takes only its own names), so this is the
smallest patch; ``tests/integrations/test_diffusers.py`` fails if diffusers moves either name.

Which calls Tessera runs is read per call: one over this forward's video tokens (with the
family's jointly attended text, and a mask that marks only text padding) is Tessera's; any
other (audio, a bias or per-query mask, another length) stays the model's own and is counted
in ``session.stats.unrouted_calls``.

The token layout comes from the transformer's inputs (a forward pre-hook): the latent's frames
and size over the patch size; the text tokens attended jointly (HunyuanVideo's and Mochi's after
the video, CogVideoX's 226 before it) and their padding come from each call's length and mask
(read back once a forward). The denoising step comes from the ``timestep`` the transformer
receives: the same timestep is the same step (classifier-free guidance's second forward), a
lower one the next step, a higher one a new video; given the
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
from ..api import PRECISIONS
from ..runtime.regime import Regime
from ..runtime.regime.heuristic import INT8_REGIME
from ..streams import on_producer_stream
from ..cuda.device import device_cc
from ..families import invert_permutation
from . import distributed, torch_attention
from .methods import LayerMask, Method, Schedule, VideoGeometry
from .video_models import (FAMILIES, TESTED_DIFFUSERS, Family, family_of, forward_inputs,
                           is_tested)

# Fixed-mask plans a session keeps (least recently used dropped first): one per routed layer and
# shapes -- more than the self-attention layers of the video transformers routed (Wan-14B 40,
# HunyuanVideo 60) -- so a step never replans a fixed mask.
FIXED_PLANS_KEPT = 128

__all__ = ["enable", "disable", "sparse", "session_of", "self_attention_layers", "compile_blocks",
           "Session", "Family", "FAMILIES", "check_context_parallel"]


def _arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    return kwargs[name] if name in kwargs else (args[i] if len(args) > i else None)


def _timestep(inputs: dict) -> float | None:
    """The timestep a transformer forward receives (its first element; None when the forward
    takes none). A device tensor is read back: one small wait at the forward's start."""
    t = inputs.get("timestep")
    if t is None:
        return None
    try:
        return float(t.reshape(-1)[0]) if hasattr(t, "reshape") else float(t)
    except (TypeError, ValueError, IndexError):
        return None


def _capturing() -> bool:
    """Whether torch's current CUDA stream is being captured into a graph (no reads back)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _allowed_keys(mask: Any, batch: int, length: int, padding: str) -> np.ndarray | None:
    """Which keys a call's attention ``mask`` lets every query attend, ``[batch or 1, length]``
    booleans read back to the host -- or None where the mask says more than which keys are
    padding (a per-query mask of another form, a bias, weights), which Tessera does not
    encode: the call then stays the model's own."""
    if mask.ndim not in (2, 3, 4) or mask.shape[-1] != length:
        return None
    m = mask.reshape(mask.shape[0], *(1,) * (4 - mask.ndim), *mask.shape[1:])  # [b, h, q, k]
    if m.shape[0] not in (1, batch) or m.shape[1] != 1:
        return None
    if m.shape[2] != 1 and not (m.shape[2] == length and padding == "outer"):
        return None
    keys = m[:, 0, 0, :]  # (an "outer" mask: row 0, a video query's, is the valid keys)
    if keys.dtype.is_floating_point:
        # an additive mask: 0 keeps a key, a large negative value drops it; anything else
        # weighs keys, which a block mask cannot say
        keep, drop = keys == 0, keys <= -1e4
        if not bool((keep | drop).all()):
            return None
        keys = keep
    return keys.bool().cpu().numpy()


def _valid_text(keys: np.ndarray, video: int, text: int, text_first: bool) -> list | None:
    """Each batch element's prompt tokens (None: all ``text``) from the keys its queries may
    attend: every video key, then the text's first tokens (the rest padding) -- or None where
    the keys say anything else."""
    valid = []
    for row in keys:
        vid, txt = (row[text:], row[:text]) if text_first else (row[:video], row[video:])
        n = int(txt.sum())
        if not vid.all() or not txt[:n].all():
            return None
        valid.append(None if n == text else n)
    return valid


@dataclass
class Stats:
    """What a session has done: self-attention calls run by Tessera (sparse), left to the model
    by the schedule (dense) or because Tessera cannot run them (unrouted: not over this
    forward's video and text tokens, or with a mask that says more than padding), and
    transformer forwards seen."""

    sparse_calls: int = 0
    dense_calls: int = 0
    unrouted_calls: int = 0
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
        precision: None (the model's 16-bit type) or "int8" (the 8-bit forward of
            ``tessera.attention``: inference only, Hopper GPUs, head dims 64 and 128).
        keep_order: tokens reordered once per forward for methods with a fixed order
            (:func:`enable`).
        stats: counts (:class:`Stats`).
        attention: what runs a call's mask, ``(q, k, v, mask, layout, scale) -> out``, in the
            session's token orders (None: ``tessera.attention``; benchmarks put another
            block-sparse kernel here to compare on the same masks).
    """

    transformer: Any = field(repr=False)
    family: Family = field(repr=False)
    method: Method
    schedule: Schedule
    forwards_per_step: int | None = None
    regime: Any = None
    precision: str | None = None
    keep_order: bool = False
    scheduler: Any = field(default=None, repr=False)
    stats: Stats = field(default_factory=Stats)
    attention: Callable | None = field(default=None, repr=False)
    _latent: tuple | None = field(default=None, repr=False)  # this forward's grid
    _seen: bool = field(default=False, repr=False)  # a forward has run (its grid read)
    _geometry_reads: dict = field(default_factory=dict, repr=False)  # this forward's
    _originals: list = field(default_factory=list, repr=False)  # (module, processor)
    _routes: list = field(default_factory=list, repr=False)  # each layer's _Route
    _hooked: list = field(default_factory=list, repr=False)  # (module, function) routed
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
    _unrouted_before: int = field(default=0, repr=False)  # and calls left to the model
    _warned_unrouted: bool = field(default=False, repr=False)
    _replaying: bool = field(default=False, repr=False)  # a compiled backward's recomputation

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

    def __deepcopy__(self, memo: dict) -> "Session":
        # A deep copy of an enabled transformer reaches its session through the hooks: the
        # session is shared, not copied (it holds plans and locks), and the copy adopts a
        # session of its own at its first forward (_adopt_copy).
        return self

    # -- per forward and per call --------------------------------------------------------
    def _before_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        if module is not self.transformer:
            # a deep copy made after enable carries this session's hooks and marks: it gets a
            # session of its own, with this one's settings, and this forward runs in it
            _adopt_copy(module, self)._before_forward(module, args, kwargs)
            return
        inputs = forward_inputs(module, args, kwargs)
        self._latent = self.family.grid(module, inputs)
        self._seen, self._geometry_reads = True, {}
        self.stats.forwards += 1
        self._calls_before = self.stats.sparse_calls + self.stats.dense_calls
        self._unrouted_before = self.stats.unrouted_calls
        if self.forwards_per_step is None and not _capturing():
            # (a forward captured into a CUDA graph cannot read its timestep back: it keeps the
            # step of the forward before it, the step its graph runs at every replay)
            self._step_from(_timestep(inputs))
        self._ordered = False
        self._moved = {}
        order = None
        all_dense = all(self.schedule.dense(self.step, layer)
                        for layer in range(len(self._originals)))
        if self.keep_order and self._latent is not None and not all_dense:
            order = self.method.video_order(VideoGeometry(self._latent))
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
        after :func:`enable`, the model runs attention some other way, or every call was one
        Tessera cannot run exactly -- and the forward ran without Tessera."""
        routed = self.stats.sparse_calls + self.stats.dense_calls - self._calls_before
        if routed > 0 or not self._originals or self._warned_unrouted:
            return
        self._warned_unrouted = True
        name = type(module).__name__
        if self.stats.unrouted_calls > self._unrouted_before:
            warnings.warn(f"Tessera is enabled on this {name}, but it left every self-attention "
                          "call of its forward to the model: none was over the forward's video "
                          "tokens with a mask that marks only text padding (session.stats."
                          "unrouted_calls; a per-query mask or bias, or other inputs)",
                          stacklevel=2)
            return
        warnings.warn(f"Tessera is enabled on this {name}, but its forward routed no "
                      "self-attention call through it: were its attention processors replaced "
                      "after tessera.integrations.diffusers.enable? Enable again after "
                      "replacing them", stacklevel=2)

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
        m = self.family
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
            self._count("dense_calls")
            return True
        return False

    def _count(self, calls: str) -> None:
        """One more call in ``stats.<calls>``, but for a compiled backward's recomputation of
        a call the forward counted already."""
        if not self._replaying:
            setattr(self.stats, calls, getattr(self.stats, calls) + 1)

    def _geometries(self, q: Any, k: Any, mask: Any, layout: str) -> list | None:
        """This call's token layouts (one, or one per batch element where they differ), from
        this forward's latent grid and the call's length and mask -- or None where the call
        is not one Tessera runs exactly: not over this forward's video (and joint text)
        tokens, or masked by more than text padding."""
        if not self._seen:
            raise RuntimeError("Tessera saw an attention call outside the transformer's "
                               "forward: call the transformer itself (its forward sets the "
                               "token layout)")
        seq = 1 if layout == "blhd" else 2
        length, fam = q.shape[seq], self.family
        if self._latent is None or k.shape[seq] != length:
            return None
        text = length - int(np.prod(self._latent))
        if text < 0 or (text > 0 and fam.text is None):
            return None
        key = (length, None if mask is None else (mask.data_ptr(), tuple(mask.shape),
                                                    str(mask.dtype)), q.shape[0])
        if key in self._geometry_reads:  # (a mask read back once a forward, not once a layer)
            return self._geometry_reads[key]
        valid: list = [None]
        if mask is not None:
            if _capturing():
                raise RuntimeError("a self-attention call with a text padding mask cannot be "
                                   "captured into a CUDA graph: Tessera reads the padding "
                                   "back once a forward; capture the model's forward without "
                                   "Tessera, or run it eagerly")
            keys = _allowed_keys(mask, q.shape[0], length, fam.padding)
            valid = None if keys is None else _valid_text(keys, length - text, text,
                                                          fam.text == "before")
        geos = None
        if valid is not None:
            geos = [VideoGeometry(self._latent, text, n, text_first=fam.text == "before")
                    for n in valid]
            geos = geos[:1] if len(set(valid)) == 1 else geos
        self._geometry_reads[key] = geos
        return geos

    def _attend(self, layer: int, q: Any, k: Any, v: Any, mask: Any, scale: float | None,
                own: Callable[[], Any], ordered: bool | None = None) -> Any:
        """One self-attention call of layer ``layer``: the model's own (``own``) where the
        call is not one Tessera runs exactly or the schedule keeps it dense, else Tessera with
        the method's mask. ``ordered``: whether the tokens are in the method's order already
        (None: as the block hooks left them)."""
        layout = self._routes[layer].layout
        geos = self._geometries(q, k, mask, layout)
        if geos is None:
            self._count("unrouted_calls")
            return own()
        if self._scheduled_dense(layer):
            return own()
        self._count("sparse_calls")
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
        layout = self._routes[layer].layout
        seq = 1 if layout == "blhd" else 2
        if self._latent is None or self.family.text is not None:
            raise RuntimeError("context parallelism needs the transformer's forward (its "
                               "inputs set the token layout) and a model that attends text by "
                               "cross-attention (Wan)")
        geo = VideoGeometry(self._latent)
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
        self._count("sparse_calls")
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
        # (the mask is chosen, not differentiated: no gradient flows into the selection)
        qh, kh = (x.detach().transpose(1, 2) if layout == "blhd" else x.detach()
                  for x in (q, k))
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
                                             regime=self.regime, precision=self.precision)
        heads = 2 if layout == "blhd" else 1
        key = FixedMaskKey(id(mask), (q.shape[0], q.shape[heads], k.shape[heads], q.shape[-1],
                                      str(q.dtype), layout), q.device.index)
        p = self._plans.take(key)
        if p is None or p.mask is not mask:
            p = plan(mask, num_q_heads=q.shape[heads], num_kv_heads=k.shape[heads],
                     head_dim=q.shape[-1], batch=q.shape[0], dtype=q.dtype, layout=layout,
                     regime=INT8_REGIME if self.precision else self.regime,
                     arch=device_cc())  # (this GPU's kernels)
        self._plans.keep(key, p)
        return p.run(q, k, v, scale=scale, precision=self.precision)


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
    model's own attention function (what the router replaced) for the calls Tessera leaves.
    ``ordered``: whether the tokens are in the method's order, as the router saw it -- under
    torch.compile the block hooks' state when the block was traced (their writes to the
    session land after the graph has run, so the op cannot read them then)."""
    session = _sessions.get(transformer)
    if session is None:
        raise RuntimeError("a routed self-attention call of a transformer Tessera is no longer "
                           "enabled on (compiled while enabled: compile it again after "
                           "tessera.integrations.diffusers.disable)")
    route = session._routes[layer]
    original = _original_function(route)
    if route.kind == "dispatch":
        def own():
            kw = {} if backend is None else {"backend": _backend_name(backend)}
            return original(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=enable_gqa,
                            **kw)
    else:
        def own():
            return original.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                         scale=scale, enable_gqa=enable_gqa)
    # (attn_mask: text padding, which the mask's text blocks encode, or a mask that leaves
    # the call to the model)
    return session._attend(layer, q, k, v, attn_mask, scale, own, ordered).contiguous()


def _route_call(q: Any, k: Any, v: Any, mask: Any, mark: _Mark, scale: float | None,
                enable_gqa: bool, backend: str | None) -> Any:
    """A marked call routed: through the custom op (one opaque node of a compiled block), or,
    eagerly where autograd records (q, k or v require grad: a fine-tuning step), by the same
    call made directly, so that the gradient flows through the reorders and Tessera's
    attention (``torch_attention``: the GPU kernels' backward on CUDA tensors, float64 on CPU
    ones) with nothing computed twice. Under torch.compile such a call stays the op, whose
    autograd formula recomputes the call with gradients (:func:`_register_op`)."""
    import torch

    ordered = _sessions[mark.transformer]._ordered
    if (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            and not torch.compiler.is_compiling()):
        return _routed_call(mark.transformer, int(mark.layer), q, k, v, mask, scale,
                            enable_gqa, backend, ordered)
    return _op(q, k, v, mask, mark.layer, mark.transformer, scale, enable_gqa, backend,
               ordered)


def _backend_name(value: str) -> Any:
    from diffusers.models.attention_dispatch import AttentionBackendName

    return AttentionBackendName(value)


_op: Any = None  # torch.ops.tessera.routed_attention once registered (_register_op)


@contextlib.contextmanager
def _recording_in_op() -> Iterator[None]:
    """Autograd recording inside a custom op's implementation, which torch runs below the
    autograd dispatch keys: the routed call's backward recomputes the call there. (torch's
    private dispatch-key guard, which the public API does not expose.)"""
    import torch

    c = torch._C
    excluded = c._dispatch_tls_local_exclude_set()
    for key in (c.DispatchKey.ADInplaceOrView, c.DispatchKey.AutogradOther,
                c.DispatchKey.AutogradCPU, c.DispatchKey.AutogradCUDA):
        excluded = excluded.remove(key)
    with c._ForceDispatchKeyGuard(c._dispatch_tls_local_include_set(), excluded), \
            torch.enable_grad():
        yield


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
        with torch.no_grad():  # (the op's gradient is its registered formula's)
            return _routed_call(transformer, int(layer), q, k, v, attn_mask, scale,
                                enable_gqa, backend, ordered)

    @routed_attention.register_fake
    def _(q, k, v, attn_mask, layer, transformer, scale, enable_gqa, backend, ordered):
        # the output: q's shape with v's head dim, contiguous (the real op returns it so)
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    # The op's gradient, an op itself (a compiled backward holds it as one opaque node): the
    # call recomputed with autograd recording -- the same route, Tessera's backward pass where
    # Tessera ran it -- and differentiated; the recomputation is not counted in the stats.
    @torch.library.custom_op(
        "tessera::routed_attention_backward", mutates_args=(),
        schema="(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? attn_mask, Tensor layer, "
               "int transformer, float? scale, bool enable_gqa, str? backend, bool ordered) "
               "-> (Tensor, Tensor, Tensor)")
    def routed_attention_backward(grad, q, k, v, attn_mask, layer, transformer, scale,
                                  enable_gqa, backend, ordered):
        session = _sessions.get(transformer)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        replaying = session is not None and not session._replaying
        if replaying:
            session._replaying = True
        try:
            with _recording_in_op():
                out = _routed_call(transformer, int(layer), *leaves, attn_mask, scale,
                                   enable_gqa, backend, ordered)
                grads = torch.autograd.grad(out, leaves, grad, allow_unused=True)
        finally:
            if replaying:
                session._replaying = False
        return tuple(torch.zeros_like(x) if g is None else g.contiguous()
                     for g, x in zip(grads, (q, k, v)))

    @routed_attention_backward.register_fake
    def _(grad, q, k, v, attn_mask, layer, transformer, scale, enable_gqa, backend, ordered):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        q, k, v, attn_mask, layer, *rest = inputs
        ctx.save_for_backward(q, k, v, attn_mask, layer)
        ctx.rest = rest

    def backward(ctx, grad):
        q, k, v, attn_mask, layer = ctx.saved_tensors
        grads = torch.ops.tessera.routed_attention_backward(grad, q, k, v, attn_mask, layer,
                                                            *ctx.rest)
        return (*grads, None, None, None, None, None, None, None)

    routed_attention.register_autograd(backward, setup_context=setup_context)
    _op = torch.ops.tessera.routed_attention


# What a routed call may carry besides q, k and v; a call setting anything else (dropout,
# causality, extra attention arguments, a keyword a newer diffusers adds) is the model's own.
_ROUTABLE = {"query", "key", "value", "attn_mask", "scale", "enable_gqa", "backend",
             "parallel_config"}


def _named(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict | None:
    """A call's arguments by name, its positional ones named by ``names`` (the function's
    positional parameters), or None where the call does not fit them (too many positional
    arguments, or one given twice: the original then answers it as it would). Plain loops and
    lookups: dynamo traces this inside a compiled block."""
    if len(args) > len(names):
        return None
    named = dict(zip(names, args))
    if any(name in named for name in kwargs):
        return None
    named.update(kwargs)
    return named


def _routable(arguments: dict) -> bool:
    def unset(value: Any) -> bool:  # None, False, 0 (dropout), {} (attention_kwargs)
        return value is None or (isinstance(value, (bool, int, float, dict)) and not value)

    # (plain loops and lookups, as _named's)
    return all(name in arguments for name in ("query", "key", "value")) and all(
        name in _ROUTABLE or unset(value) for name, value in arguments.items())


def _dispatch_router(original: Callable) -> Callable:
    """``original`` (a module's ``dispatch_attention_fn``) with Tessera's marked calls routed:
    its arguments read by name from its own signature, every call Tessera does not take passed
    on exactly as made."""
    positional = tuple(p.name for p in inspect.signature(original).parameters.values()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))

    @functools.wraps(original)
    def dispatch_attention_fn(*args, **kwargs):
        # the arguments by name, as the original's signature names them (read once, above:
        # inspect's binding is not traced inside a compiled block)
        a = _named(positional, args, kwargs) if _calls else None
        if a is None or not _routable(a):
            return original(*args, **kwargs)
        mark = _calls[-1]
        q, k, v, backend = a["query"], a["key"], a["value"], a.get("backend")
        parallel = a.get("parallel_config")
        if parallel is not None:
            cp = getattr(parallel, "context_parallel_config", None)
            if cp is None:  # tensor parallelism alone: each rank's heads, the model's own
                return original(*args, **kwargs)
            return _sessions[mark.transformer]._attend_parallel(
                int(mark.layer), q, k, v, a.get("scale"), lambda: original(*args, **kwargs),
                cp)
        name = None if backend is None else getattr(backend, "value", backend)
        return _route_call(q, k, v, a.get("attn_mask"), mark, a.get("scale"),
                           bool(a.get("enable_gqa", False)), name)

    dispatch_attention_fn._tessera_original = original
    return dispatch_attention_fn


# torch's scaled_dot_product_attention, its arguments in order (torch's public signature)
_SDPA_ARGUMENTS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                   "enable_gqa")


class _RoutedFunctional:
    """``torch.nn.functional`` as one diffusers module sees it: the same functions, with
    ``scaled_dot_product_attention`` routed for Tessera's calls."""

    def __init__(self, functional: Any) -> None:
        self._tessera_original = functional

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tessera_original, name)

    def scaled_dot_product_attention(self, *args, **kwargs):
        sdpa = self._tessera_original.scaled_dot_product_attention
        a = _named(_SDPA_ARGUMENTS, args, kwargs) if _calls else None
        if a is None or not _routable(a):
            return sdpa(*args, **kwargs)
        return _route_call(a["query"], a["key"], a["value"], a.get("attn_mask"), _calls[-1],
                           a.get("scale"), bool(a.get("enable_gqa", False)), None)


@dataclass(frozen=True)
class _Route:
    """Where a self-attention module's processor takes its attention function: the module
    whose global it reads, and which function -- "dispatch" (diffusers'
    ``dispatch_attention_fn``, q/k/v ``[B, L, H, D]``) or "sdpa" (``F.scaled_dot_product_
    attention``, ``[B, H, L, D]``)."""

    module: str
    kind: str

    @property
    def layout(self) -> str:
        return "blhd" if self.kind == "dispatch" else "bhld"


def _route_of(processor: Any) -> _Route:
    """The route of ``processor``, read from the module its class's ``__call__`` is defined in
    (a subclass defined elsewhere reads its own module; a processor Tessera wraps, its own)."""
    if isinstance(processor, _Routed):
        processor = processor._tessera[0]
    call = getattr(type(processor), "__call__", None)
    found = getattr(call, "__globals__", None) or {}
    module = found.get("__name__", type(processor).__module__)
    if "dispatch_attention_fn" in found:
        return _Route(module, "dispatch")
    functional = found.get("F")
    if functional is not None and hasattr(functional, "scaled_dot_product_attention"):
        return _Route(module, "sdpa")
    raise TypeError(f"the attention processor {type(processor).__name__} ({module}) calls "
                    "neither diffusers' dispatch_attention_fn nor F.scaled_dot_product_"
                    "attention, the functions Tessera routes; set the model's default "
                    "processors (model.set_default_attn_processor()) before enabling")


def _original_function(route: _Route) -> Any:
    """What the router replaced in ``route``'s module: ``dispatch_attention_fn``, or ``F``."""
    mod = importlib.import_module(route.module)
    if route.kind == "dispatch":
        return mod.dispatch_attention_fn._tessera_original
    return mod.F._tessera_original


_installed: dict[_Route, int] = {}  # route -> sessions using its router


def _install(route: _Route) -> None:
    mod = importlib.import_module(route.module)
    if _installed.get(route, 0) == 0:
        if route.kind == "dispatch":
            mod.dispatch_attention_fn = _dispatch_router(mod.dispatch_attention_fn)
        else:
            mod.F = _RoutedFunctional(mod.F)
    _installed[route] = _installed.get(route, 0) + 1


def _uninstall(route: _Route) -> None:
    n = _installed.get(route, 0) - 1
    _installed[route] = max(n, 0)
    if n == 0:
        name = "dispatch_attention_fn" if route.kind == "dispatch" else "F"
        setattr(importlib.import_module(route.module), name, _original_function(route))


def _check_diffusers() -> None:
    """Warn once where the installed diffusers is outside the tested range (enable still
    checks, model by model, what Tessera needs: the family's classes, each processor's
    attention function)."""
    import diffusers

    global _warned_version
    if not is_tested(diffusers.__version__) and not _warned_version:
        _warned_version = True
        warnings.warn(f"diffusers {diffusers.__version__} is outside the releases Tessera's "
                      f"integration is tested on ({', '.join(TESTED_DIFFUSERS)}); a "
                      "self-attention call it cannot read stays the model's own "
                      "(session.stats.unrouted_calls)", stacklevel=3)


_warned_version = False


# ---- the public calls -------------------------------------------------------------------
_sessions: dict[int, Session] = {}


def enable(transformer: Any, method: Method, *, schedule: Schedule | None = None,
           scheduler: Any = None, forwards_per_step: int | None = None, keep_order: bool = False,
           regime: Any = None, precision: str | None = None) -> Session:
    """Run ``transformer``'s self-attention through Tessera with ``method``'s masks; returns the
    :class:`Session` (counts, :meth:`Session.reset`, :meth:`Session.disable`). Enabling again
    replaces the method and schedule. The step each forward is at comes from the timestep it
    receives, placed in ``scheduler.timesteps`` when the pipeline's ``scheduler`` is given
    (``forwards_per_step=N``: N forwards a step, counted). ``keep_order``: for methods with a
    fixed token order (sliding tiles, cubes), reorder the tokens once per forward -- before
    the first block, back after the last -- instead of around every attention call (1.5% of a
    Wan-1.3B forward on the H200; off by default: docs/integrations.md). ``precision="int8"``
    or ``"int8-qk"``: an 8-bit forward for every sparse call (inference only:
    ``tessera.attention``'s)."""
    if regime is not None and not isinstance(regime, Regime):
        raise TypeError(f"regime must be a tessera.Regime or None, got {type(regime).__name__}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision is not None and regime is not None:
        raise ValueError(f"regime must be None with precision={precision!r} (the 8-bit "
                         f"forwards run their own regime, {INT8_REGIME.name})")
    family = family_of(transformer)
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
    if keep_order and family.blocks is None:
        ordering = [f.name for f in FAMILIES if f.blocks is not None]
        raise ValueError(f"keep_order=True is supported for {', '.join(ordering)}; "
                         f"{family.name} keeps the model's token order between calls "
                         "(keep_order=False)")
    parallel = getattr(transformer, "_parallel_config", None)
    if getattr(parallel, "context_parallel_config", None) is not None:
        check_context_parallel(method, keep_order)  # (the token order: at the first call)
    _check_diffusers()
    attention = family.self_attention(transformer)
    routes = [_route_of(attn.processor) for attn in attention]  # (refused before any change)
    if id(transformer) in _sessions:
        disable(transformer)
    session = Session(transformer, family, method, schedule, forwards_per_step, regime,
                      precision, keep_order=keep_order, scheduler=scheduler)
    _register_op()
    try:
        _wire(session, attention, routes)
    except Exception:
        _unhook(session)
        raise
    _sessions[id(transformer)] = session
    return session


def _wire(session: Session, attention: list, routes: list[_Route]) -> None:
    """Routes each self-attention module of ``session`` through Tessera (its processor
    wrapped, its module's attention function replaced) and hooks the transformer's forward
    (and its blocks, for ``keep_order``)."""
    import torch

    transformer = session.transformer
    for layer, (attn, route) in enumerate(zip(attention, routes)):
        original = attn.processor
        if isinstance(original, _Routed):  # (a deep copy of an enabled transformer's)
            original = original._tessera[0]
        if route not in session._hooked:
            _install(route)
            session._hooked.append(route)
        session._originals.append((attn, original))
        session._routes.append(route)
        mark = _Mark(id(transformer), torch.tensor(layer, dtype=torch.int64))
        _set_processor(attn, _routed(original, mark))
    # (run eagerly where the whole transformer is compiled: it reads the inputs' layout on
    # the host -- a graph break there, its blocks compiled whole)
    session._hook = transformer.register_forward_pre_hook(
        torch.compiler.disable(session._before_forward), with_kwargs=True)
    session._post_hook = transformer.register_forward_hook(
        torch.compiler.disable(session._after_forward), with_kwargs=True)
    blocks = session.family.blocks(transformer) if session.keep_order else []
    for i, block in enumerate(blocks):
        session._block_hooks.append(block.register_forward_pre_hook(
            functools.partial(session._before_block, i == 0), with_kwargs=True))
    if blocks:
        session._block_hooks.append(blocks[-1].register_forward_hook(
            session._after_last_block, with_kwargs=True))


@contextlib.contextmanager
def sparse(pipe: Any, method: Method, *, schedule: Schedule | None = None,
           keep_order: bool = False, regime: Any = None,
           precision: str | None = None) -> Iterator[list[Session]]:
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
                   regime=regime, precision=precision)
        yield [_sessions[id(t)] for t in transformers]
    finally:
        for t in enabled:
            disable(t)


def disable(transformer: Any) -> None:
    """``transformer``'s own attention again, exactly as before :func:`enable` (a no-op when
    Tessera is not enabled on it)."""
    session = _sessions.pop(id(transformer), None)
    if session is not None:
        _unhook(session)


def _adopt_copy(copy: Any, session: Session) -> Session:
    """Tessera enabled on ``copy``, a deep copy of ``session``'s transformer made after
    :func:`enable`, with the same settings: the hooks it inherited (which belong to
    ``session``) removed first, its wrapped processors rewrapped with marks of its own."""
    for module in copy.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key, fn in list(hooks.items()):
                target = getattr(fn, "func", fn)  # (a block hook: a partial of a method)
                target = getattr(target, "__wrapped__", target)  # (torch.compiler.disable)
                if isinstance(getattr(target, "__self__", None), Session):
                    del hooks[key]
    return enable(copy, session.method, schedule=session.schedule, scheduler=session.scheduler,
                  forwards_per_step=session.forwards_per_step, keep_order=session.keep_order,
                  regime=session.regime, precision=session.precision)


def _set_processor(attn: Any, processor: Any) -> None:
    """``attn``'s processor replaced: by ``set_processor`` where the module has it, else by
    its ``processor`` attribute (Mochi's attention module, which diffusers defines without
    the processor mixin)."""
    if hasattr(attn, "set_processor"):
        attn.set_processor(processor)
    else:
        attn.processor = processor


def _unhook(session: Session) -> None:
    for attn, original in session._originals:
        _set_processor(attn, original)
    for h in [session._hook, session._post_hook, *session._block_hooks]:
        if h is not None:
            h.remove()
    for route in session._hooked:
        _uninstall(route)
    session._originals, session._hooked, session._block_hooks = [], [], []
    session._hook = session._post_hook = None


def session_of(transformer: Any) -> Session | None:
    """The session enabled on ``transformer``, or None."""
    return _sessions.get(id(transformer))


def self_attention_layers(transformer: Any) -> list:
    """``transformer``'s self-attention modules, in the order of the schedule's layers."""
    return family_of(transformer).self_attention(transformer)


def compile_blocks(transformer: Any, **compile_kwargs: Any) -> None:
    """``torch.compile`` each of ``transformer``'s blocks (regional compilation, as diffusers'
    ``compile_repeated_blocks`` does: the family's blocks, or those the model declares
    repeated; CogVideoX's too), with ``compile_kwargs`` (e.g. ``fullgraph=True``). With Tessera
    enabled, before or after, a routed self-attention is one opaque op in each block's graph: one
    compiled block serves every layer, and the block compiles whole."""
    family = family_of(transformer)
    blocks = family.blocks(transformer) if family.blocks is not None else []
    if not blocks:
        repeated = set(getattr(transformer, "_repeated_blocks", None) or ())
        blocks = [m for m in transformer.modules() if type(m).__name__ in repeated]
    if not blocks:
        raise TypeError(f"{type(transformer).__name__} declares no repeated blocks to compile; "
                        "compile the whole transformer instead")
    for block in blocks:
        block.compile(**compile_kwargs)
