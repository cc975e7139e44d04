"""Published sparse-attention methods as ready configurations for a video transformer's
self-attention, built on :mod:`tessera.families`.

A method says, for one attention call of a known token layout (:class:`VideoGeometry`), which
key blocks each query block attends and in which token order (:class:`LayerMask`). Methods whose
mask depends only on the layout (sliding tiles, spatial/temporal bands, radial) build it once per
layout; the data-dependent ones (top-k cubes, semantic clusters) build it from each call's q and
k, on the GPU when q and k are there. A :class:`Schedule` keeps the first steps and layers dense.

Nothing here needs torch or diffusers: :mod:`tessera.integrations.diffusers` plugs these into
diffusers' transformers, and any other caller can use them with ``tessera.attention``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from .. import families
from ..checks import check_fraction, check_int, is_int
from ..families.common import check_latent, check_triple, per_head
from ..mask import BlockMask

__all__ = ["VideoGeometry", "LayerMask", "Method", "SlidingTile", "SpatialTemporal", "Radial",
           "TopKCubes", "SemanticClusters", "Schedule", "METHODS", "method_from_name",
           "SparseConfig"]


@dataclass(frozen=True)
class VideoGeometry:
    """The token layout of one self-attention call of a video transformer.

    Attributes:
        latent: ``(t, h, w)`` video tokens after patchifying, frame-major.
        text_tokens: text tokens attended jointly with the video (0 where the model attends
            text by cross-attention, as Wan does).
        text_valid: how many of them are the prompt's; the rest are padding slots, which attend
            only each other and which no other token attends (None: all valid).
        text_first: the text precedes the video (CogVideoX) instead of following it
            (HunyuanVideo).
    """

    latent: tuple[int, int, int]
    text_tokens: int = 0
    text_valid: int | None = None
    text_first: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "latent", check_latent(self.latent))
        if not is_int(self.text_tokens) or self.text_tokens < 0:
            raise ValueError(f"text_tokens must be an int >= 0, got {self.text_tokens!r}")
        if self.text_valid is not None and (
                not is_int(self.text_valid) or not 0 <= self.text_valid <= self.text_tokens):
            raise ValueError(f"text_valid must be None or an int in [0, text_tokens="
                             f"{self.text_tokens}], got {self.text_valid!r}")
        if not isinstance(self.text_first, bool):
            raise TypeError(f"text_first must be True or False, got {self.text_first!r}")

    @property
    def video_tokens(self) -> int:
        return int(np.prod(self.latent))

    @property
    def tokens(self) -> int:
        return self.video_tokens + self.text_tokens

    def sequence_order(self, video_order: np.ndarray | None) -> np.ndarray | None:
        """A video-token order extended to the whole sequence in the model's layout (text kept
        where it is): position ``p`` holds sequence token ``order[p]``; None stays None."""
        if video_order is None or self.text_tokens == 0:
            return video_order
        n, t = self.video_tokens, self.text_tokens
        if self.text_first:
            return np.concatenate([np.arange(t), video_order + t]).astype(np.int64)
        return np.concatenate([video_order, np.arange(n, n + t)]).astype(np.int64)


@dataclass(frozen=True)
class LayerMask:
    """What one attention call runs: the logical mask and the token orders it is expressed in.

    Attributes:
        mask: the :class:`~tessera.BlockMask`, over the reordered sequence.
        q_order: int64 ``[L]`` or None: position ``p`` of the reordered queries holds sequence
            token ``q_order[p]`` (None: the sequence's own order).
        kv_order: the same for keys and values (None: ``q_order``).
    """

    mask: BlockMask
    q_order: np.ndarray | None = field(default=None, repr=False)
    kv_order: np.ndarray | None = field(default=None, repr=False)

    @property
    def key_order(self) -> np.ndarray | None:
        return self.kv_order if self.kv_order is not None else self.q_order


def _text_first(mask: BlockMask, text_blocks: int) -> BlockMask:
    """``mask`` (text blocks last, as the families build it) with its last ``text_blocks``
    query and key blocks moved to the front, for models whose text precedes the video. Only
    blocks move (bounds recomputed from the sizes); no host synchronization on the device."""
    if text_blocks == 0:
        return mask
    dense = mask.to_dense()
    xp = mask.xp
    nq, nk = mask.num_q_blocks, mask.num_kv_blocks
    oq = np.r_[np.arange(nq - text_blocks, nq), np.arange(nq - text_blocks)]
    ok = np.r_[np.arange(nk - text_blocks, nk), np.arange(nk - text_blocks)]
    moved = dense[..., xp.asarray(oq), :][..., xp.asarray(ok)]
    qb = np.r_[0, np.cumsum(np.diff(mask.q_bounds)[oq])].astype(np.int64)
    kb = np.r_[0, np.cumsum(np.diff(mask.kv_bounds)[ok])].astype(np.int64)
    return BlockMask.from_dense(moved, q_bounds=qb, kv_bounds=kb)


def _text_blocks(geo: VideoGeometry) -> int:
    valid = geo.text_tokens if geo.text_valid is None else geo.text_valid
    return int(valid > 0) + int(geo.text_tokens - valid > 0)


class Method:
    """A sparse-attention method: which key blocks each query block of a call attends.

    Subclasses set ``name`` and ``dynamic`` (the mask depends on q and k) and implement
    :meth:`video_order` and :meth:`_family_mask`; :meth:`layer_mask` is what callers use.
    """

    name: ClassVar[str] = ""
    dynamic: ClassVar[bool] = False
    # Whether the family reads q and k with the text first and puts the text blocks first
    # itself (else the method hands it a copy with the text last and moves the blocks after).
    text_first_family: ClassVar[bool] = False

    def video_order(self, geo: VideoGeometry) -> np.ndarray | None:
        """The order of the video tokens that the method's masks are expressed in, fixed per
        layout: position ``p`` holds frame-major video token ``order[p]`` (None: frame-major).
        A caller may keep its tokens in this order across layers and skip the per-call
        reordering (:meth:`layer_mask` with ``ordered=True``)."""
        return None

    def _family_mask(self, geo: VideoGeometry, q: Any, k: Any,
                     ordered: bool) -> families.VideoMask:
        raise NotImplementedError

    def layer_mask(self, geo: VideoGeometry, q: Any = None, k: Any = None,
                   ordered: bool = False) -> LayerMask:
        """The mask of one call with layout ``geo``; ``q``/``k`` (``[B, H, L, D]``, needed by
        dynamic methods) are in the sequence's order, or in :meth:`video_order` when
        ``ordered`` -- the returned orders are then None."""
        if not isinstance(geo, VideoGeometry):
            raise TypeError(f"geo must be a VideoGeometry, got {type(geo).__name__}")
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be True or False, got {ordered!r}")
        if self.dynamic and (q is None or k is None):
            raise ValueError(f"method {self.name!r} builds its mask from q and k: pass both")
        if not self.dynamic:  # one LayerMask per layout: the same mask object every call,
            # which tessera.attention's kept plans recognize
            return _memo(self, "_layer_masks", (geo, ordered),
                         lambda: self._layer_mask(geo, None, None, ordered))
        return self._layer_mask(geo, q, k, ordered)

    def _layer_mask(self, geo: VideoGeometry, q: Any, k: Any, ordered: bool) -> LayerMask:
        moved = geo.text_first and not self.text_first_family
        if moved and self.dynamic and geo.text_tokens:
            # the family reads text after the video: a reordered copy for it (the attention
            # reads the caller's own q and k)
            order = _text_last_order(geo)
            q, k = q[:, :, order], k[:, :, order]
        vm = self._family_mask(geo, q, k, ordered)
        mask = _text_first(vm.mask, _text_blocks(geo)) if moved else vm.mask
        if ordered:
            return LayerMask(mask)
        if self.video_order(geo) is not None or (vm.permutation is None and
                                                 vm.kv_permutation is None):
            # one order per layout: the same array every call (a caller caches its device copy)
            return LayerMask(mask, _memo(self, "_orders", geo, lambda: geo.sequence_order(
                self.video_order(geo))))
        q_order = _sequence_from_family(geo, vm.permutation)
        kv_order = (None if vm.kv_permutation is None
                    else _sequence_from_family(geo, vm.kv_permutation))
        return LayerMask(mask, q_order, kv_order)


def _text_last_order(geo: VideoGeometry) -> np.ndarray:
    """For a text-first sequence: the order that puts its text after the video."""
    t, n = geo.text_tokens, geo.video_tokens
    return np.r_[np.arange(t, t + n), np.arange(t)].astype(np.int64)


def _sequence_from_family(geo: VideoGeometry, perm: np.ndarray | None) -> np.ndarray | None:
    """A family permutation (video then text) as an order of the model's sequence, with the
    text moved to where the model has it."""
    if perm is None:
        return None
    perm = np.asarray(perm, dtype=np.int64)
    if not geo.text_first or geo.text_tokens == 0:
        return perm
    n = geo.video_tokens
    video, text = perm[:n], perm[n:]
    to_model = _text_last_order(geo)  # family position -> model token
    return np.concatenate([to_model[text], to_model[video]])


def _memo(method: Method, table: str, key: Any, build) -> Any:
    """``build()`` kept in the method's ``table`` under ``key`` (a layout, mostly): made once
    per layout, the same object every call."""
    cache = method.__dict__.setdefault(table, {})
    if key not in cache:
        if len(cache) > 32:  # layouts of past videos
            cache.clear()
        cache[key] = build()
    return cache[key]


def _cached(method: Method, geo: VideoGeometry, build) -> families.VideoMask:
    """The family mask of a fixed-mask method for layout ``geo``, made once."""
    return _memo(method, "_masks", geo, build)


def _set(method: Method, **fields: Any) -> None:
    """Fields of a frozen method, as its checks normalise them (tuples, ints, floats)."""
    for name, value in fields.items():
        object.__setattr__(method, name, value)


@dataclass(frozen=True)
class SlidingTile(Method):
    """Sliding tile attention (STA): tokens in 3D tiles (``tile``, 6x8x8 = 384 tokens), each
    query tile attending a ``window`` of tiles around it (one window, or a list: one per head).
    Needs the tile order (:meth:`video_order`). Methods are frozen values, checked when made:
    ``dataclasses.replace(m, window=...)`` makes another (with masks of its own)."""

    tile: Sequence[int] = (6, 8, 8)
    window: Any = (3, 3, 3)
    name: ClassVar[str] = "sliding_tile"

    def __post_init__(self) -> None:
        windows, single = per_head(self.window, lambda v: isinstance(v, (list, tuple)) and
                                   len(v) > 0 and not isinstance(v[0], (list, tuple)), "window")
        windows = tuple(check_triple(w, "window") for w in windows)
        _set(self, tile=check_triple(self.tile, "tile"),
             window=windows[0] if single else windows)

    def video_order(self, geo: VideoGeometry) -> np.ndarray:
        return families.tile_permutation(geo.latent, self.tile)[0]

    def _family_mask(self, geo, q, k, ordered):
        return _cached(self, geo, lambda: families.sliding_tile(
            geo.latent, self.tile, self.window, geo.text_tokens, geo.text_valid))


@dataclass(frozen=True)
class SpatialTemporal(Method):
    """Sparse VideoGen's spatial and temporal heads at ``block``-token blocks: ``heads`` is
    "spatial", "temporal" or a list of those, one per head; ``width`` frames either side;
    ``temporal_rule`` "band" or "position" (:func:`tessera.families.spatial_temporal`)."""

    block: int = 128
    heads: Any = "spatial"
    width: int = 1
    temporal_rule: str = "band"
    name: ClassVar[str] = "spatial_temporal"

    def __post_init__(self) -> None:
        kinds, single = per_head(self.heads, lambda v: isinstance(v, str), "heads")
        for kind in kinds:
            if kind not in ("spatial", "temporal"):
                raise ValueError(f"heads must be 'spatial', 'temporal' or a list of them, got "
                                 f"{kind!r}")
        if self.temporal_rule not in ("band", "position"):
            raise ValueError(f"temporal_rule must be 'band' or 'position', got "
                             f"{self.temporal_rule!r}")
        _set(self, block=check_int(self.block, "block", 1), width=check_int(self.width,
                                                                              "width", 0),
             heads=kinds[0] if single else tuple(kinds))

    def _build(self, geo):
        return families.spatial_temporal(geo.latent, self.block, self.heads, self.width,
                                         self.temporal_rule, "auto", geo.text_tokens,
                                         geo.text_valid)

    def video_order(self, geo: VideoGeometry) -> np.ndarray | None:
        perm = _cached(self, geo, lambda: self._build(geo)).permutation
        return None if perm is None else perm[:geo.video_tokens]

    def _family_mask(self, geo, q, k, ordered):
        return _cached(self, geo, lambda: self._build(geo))


@dataclass(frozen=True)
class Radial(Method):
    """Radial attention: dense for frames within ``dense_distance``, a band halving with each
    doubling of the frame distance beyond, key frame 0 kept (``sink_frame``)."""

    block: int = 128
    dense_distance: int = 1
    sink_frame: bool = True
    name: ClassVar[str] = "radial"

    def __post_init__(self) -> None:
        if not isinstance(self.sink_frame, bool):
            raise TypeError(f"sink_frame must be True or False, got {self.sink_frame!r}")
        _set(self, block=check_int(self.block, "block", 1),
             dense_distance=check_int(self.dense_distance, "dense_distance", 0))

    def _family_mask(self, geo, q, k, ordered):
        return _cached(self, geo, lambda: families.radial(
            geo.latent, self.block, self.dense_distance, self.sink_frame, geo.text_tokens,
            geo.text_valid))


@dataclass(frozen=True)
class TopKCubes(Method):
    """Top-k key cubes per query cube from mean-pooled q and k, every call (VSA): ``cube``
    tokens (4x4x4 = 64; edge cubes partial), ``density`` of the key cubes kept per query cube
    (0.1 unless ``topk`` -- exactly that many -- or ``top_p`` -- by cumulative probability --
    is given). Needs the cube order."""

    cube: Sequence[int] = (4, 4, 4)
    density: float | None = None
    topk: int | None = None
    top_p: float | None = None
    name: ClassVar[str] = "topk_cubes"
    dynamic: ClassVar[bool] = True
    text_first_family: ClassVar[bool] = True

    def __post_init__(self) -> None:
        given = [v for v in (self.density, self.topk, self.top_p) if v is not None]
        if len(given) > 1:
            raise ValueError("give one of density, topk or top_p, not several")
        _set(self, cube=check_triple(self.cube, "cube"),
             density=(check_fraction(self.density, "density") if self.density is not None
                      else None if given else 0.1),
             topk=None if self.topk is None else check_int(self.topk, "topk", 1),
             top_p=None if self.top_p is None else check_fraction(self.top_p, "top_p"))

    def video_order(self, geo: VideoGeometry) -> np.ndarray:
        return families.tile_permutation(geo.latent, self.cube)[0]

    def _family_mask(self, geo, q, k, ordered):
        topk = self.topk
        if self.density is not None:
            cubes = math.prod(-(-n // c) for n, c in zip(geo.latent, self.cube))
            topk = max(1, round(self.density * cubes))
        return families.topk_pooled(q, k, geo.latent, self.cube, topk, self.top_p,
                                    geo.text_tokens, geo.text_valid, ordered=ordered,
                                    text_first=geo.text_first)


@dataclass(frozen=True)
class SemanticClusters(Method):
    """Semantic clusters (SVG2): k-means on q and on k, tokens permuted by cluster every call
    (variable blocks), key clusters kept by cumulative probability ``top_p``, at least
    ``min_fraction`` of them. Its orders change every call: no ``video_order``."""

    q_clusters: int = 200
    kv_clusters: int = 1000
    top_p: float = 0.9
    min_fraction: float = 0.1
    iters: int = 10
    name: ClassVar[str] = "semantic_clusters"
    dynamic: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _set(self, q_clusters=check_int(self.q_clusters, "q_clusters", 1),
             kv_clusters=check_int(self.kv_clusters, "kv_clusters", 1),
             top_p=check_fraction(self.top_p, "top_p"),
             min_fraction=check_fraction(self.min_fraction, "min_fraction", zero=True),
             iters=check_int(self.iters, "iters", 1))

    def _family_mask(self, geo, q, k, ordered):
        if ordered:
            raise ValueError("semantic clusters reorder tokens every call: ordered=True does "
                             "not apply")
        return families.semantic_clusters(q, k, self.q_clusters, self.kv_clusters, self.top_p,
                                          self.min_fraction, self.iters, 0, geo.text_tokens,
                                          geo.text_valid)


METHODS: dict[str, type[Method]] = {m.name: m for m in (
    SlidingTile, SpatialTemporal, Radial, TopKCubes, SemanticClusters)}


def method_from_name(name: str, **params: Any) -> Method:
    """The method called ``name`` (one of :data:`METHODS`) with ``params``."""
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return METHODS[name](**params)


@dataclass(frozen=True)
class Schedule:
    """When attention stays dense (the model's own attention): in the first ``dense_steps``
    denoising steps, and in the first ``dense_layers`` self-attention layers of every step --
    sparse methods lose quality there (the early steps fix the layout)."""

    dense_steps: int = 0
    dense_layers: int = 0

    def __post_init__(self) -> None:
        for name in ("dense_steps", "dense_layers"):
            v = getattr(self, name)
            if not is_int(v) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")

    def dense(self, step: int, layer: int) -> bool:
        """Whether layer ``layer`` of step ``step`` (both from 0) runs dense."""
        for name, v in (("step", step), ("layer", layer)):
            if not is_int(v) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        return step < self.dense_steps or layer < self.dense_layers


# The "format" of a saved configuration (SparseConfig.to_json); "version" counts its changes.
CONFIG_FORMAT = "tessera-sparse-attention"
CONFIG_VERSION = 1


@dataclass(frozen=True)
class SparseConfig:
    """A method and its schedule as one value that saves to JSON and loads back: what a model's
    sparse attention ran with, to keep beside its videos, share, or start a sweep from.
    ``source`` says where the settings come from (a paper's table, a sweep)."""

    method: Method
    schedule: Schedule = field(default_factory=Schedule)
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.method, Method) or type(self.method) not in METHODS.values():
            raise TypeError(f"method must be one of the methods {', '.join(METHODS)}, got "
                            f"{type(self.method).__name__}")
        if not isinstance(self.schedule, Schedule):
            raise TypeError(f"schedule must be a Schedule, got {type(self.schedule).__name__}")
        if not isinstance(self.source, str):
            raise TypeError(f"source must be a str, got {type(self.source).__name__}")

    def to_json(self) -> dict[str, Any]:
        """The configuration as JSON values (tuples as lists)."""
        params = {f.name: _json_value(getattr(self.method, f.name))
                  for f in fields(self.method)}
        return {"format": CONFIG_FORMAT, "version": CONFIG_VERSION,
                "method": {"name": self.method.name, "params": params},
                "schedule": {"dense_steps": self.schedule.dense_steps,
                             "dense_layers": self.schedule.dense_layers},
                "source": self.source}

    @classmethod
    def from_json(cls, obj: Any) -> "SparseConfig":
        """The configuration ``to_json`` wrote; ValueError naming what is missing or unknown."""
        if not isinstance(obj, dict) or obj.get("format") != CONFIG_FORMAT:
            raise ValueError(f"a sparse-attention configuration is a JSON object with "
                             f"\"format\": \"{CONFIG_FORMAT}\"")
        if obj.get("version") != CONFIG_VERSION:
            raise ValueError(f"configuration version {obj.get('version')!r} is not "
                             f"{CONFIG_VERSION}, the one this Tessera reads")
        unknown = sorted(set(obj) - {"format", "version", "method", "schedule", "source"})
        if unknown:
            raise ValueError(f"configuration keys {unknown} are unknown")
        method = obj.get("method")
        if not isinstance(method, dict) or set(method) != {"name", "params"} or \
                not isinstance(method["params"], dict):
            raise ValueError('"method" must be {"name": ..., "params": {...}}')
        name = method["name"]
        if name not in METHODS:
            raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
        known = {f.name for f in fields(METHODS[name])}
        extra = sorted(set(method["params"]) - known)
        if extra:
            raise ValueError(f"method {name!r} takes no parameter {', '.join(extra)} (its "
                             f"parameters: {', '.join(sorted(known))})")
        schedule = obj.get("schedule", {})
        if not isinstance(schedule, dict) or set(schedule) - {"dense_steps", "dense_layers"}:
            raise ValueError('"schedule" must be {"dense_steps": int, "dense_layers": int}')
        return cls(method_from_name(name, **method["params"]), Schedule(**schedule),
                   obj.get("source", ""))

    def save(self, path: str | os.PathLike) -> None:
        """Write the configuration to ``path`` as JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SparseConfig":
        """Read a configuration :meth:`save` wrote; ValueError naming the file when it is not
        one."""
        try:
            obj = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read a configuration from {path}: {exc}") from exc
        try:
            return cls.from_json(obj)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{path}: {exc}") from exc


def _json_value(v: Any) -> Any:
    """A method parameter as JSON: tuples (per-head lists of triples too) as lists."""
    if isinstance(v, (tuple, list)):
        return [_json_value(x) for x in v]
    return v
