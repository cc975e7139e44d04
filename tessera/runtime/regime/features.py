"""Mask features: the few cheap numbers (density, row imbalance, sequence length, block
geometry) and their buckets that index a regime table."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..._array import to_numpy
from ...dtypes import dtype_name
from .. import mapping, planner_launches

__all__ = ["MaskFeatures", "MaskMeasures", "mask_features", "mask_measures", "geometry_features",
           "features_from_measures", "block_bucket"]


SEQ_BUCKETS = ("<=16k", "<=32k", "<=64k", "<=128k", ">128k")


_SEQ_EDGES = (16384, 32768, 65536, 131072)  # inclusive upper edges


DENSITY_BUCKETS = ("0-5%", "5-15%", "15-30%", "30-60%", "60-100%")


_DENSITY_EDGES = (0.05, 0.15, 0.30, 0.60)  # exclusive upper edges


IMBALANCE_BUCKETS = ("<1.5", "1.5-3", ">=3")


_IMBALANCE_EDGES = (1.5, 3.0)  # exclusive upper edges


BATCH_HEADS_BUCKETS = ("<=16", "17-64", ">64")


_BATCH_HEADS_EDGES = (16, 64)  # inclusive upper edges


BLOCK_BUCKETS = ("64", "128", "256", "384+")


_BLOCK_EDGES = (64, 128, 256)  # inclusive upper edges


FEATURE_DTYPES = ("bfloat16", "float16")


_GEOMETRY = re.compile(r"^(uniform-(64|128|256|384\+)x(64|128|256|384\+)|"
                       r"variable-(64|128|256|384\+))$")


def _bucket(value: float, edges: tuple, labels: tuple, inclusive: bool) -> str:
    for edge, label in zip(edges, labels):
        if value <= edge if inclusive else value < edge:
            return label
    return labels[-1]


def block_bucket(tokens: float) -> str:
    """A block size in tokens as one of ``64``, ``128``, ``256``, ``384+`` (upper edges)."""
    return _bucket(tokens, _BLOCK_EDGES, BLOCK_BUCKETS, True)


@dataclass(frozen=True)
class MaskMeasures:
    """The raw numbers behind :class:`MaskFeatures` (what the profiler records beside them).

    ``density`` counts selected (query, key) token pairs over all pairs; ``imbalance`` is the
    heaviest logical row's pairs over the mean row's (rows: (batch, head, query block) as
    stored); ``q_block`` the median query block size; ``uniform`` the ``(q, kv)`` block size
    when the geometry is uniform (the last block may be short), else None.
    """

    seq_len: int
    density: float
    imbalance: float
    q_block: float
    uniform: tuple[int, int] | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["uniform"] = list(self.uniform) if self.uniform else None
        return d


@dataclass(frozen=True)
class MaskFeatures:
    """The cheap mask and shape features a regime table is indexed by (all categorical).

    ``geometry`` is ``uniform-<q>x<kv>`` (block sizes bucketed to 64/128/256/384+) or
    ``variable-<q>`` (the median query block, bucketed); the other fields are bucket labels of
    :data:`SEQ_BUCKETS`, :data:`DENSITY_BUCKETS`, :data:`IMBALANCE_BUCKETS` and
    :data:`BATCH_HEADS_BUCKETS`. :meth:`key` is the stable string a table stores.
    """

    arch: int
    head_dim: int
    dtype: str
    geometry: str
    seq_len: str
    density: str
    imbalance: str
    batch_heads: str

    def key(self) -> str:
        """E.g. ``sm90/d128/bfloat16/uniform-128x128/L<=32k/p5-15%/r<1.5/bh<=16``."""
        return (f"sm{self.arch}/d{self.head_dim}/{self.dtype}/{self.geometry}/L{self.seq_len}"
                f"/p{self.density}/r{self.imbalance}/bh{self.batch_heads}")

    @classmethod
    def from_key(cls, key: str) -> "MaskFeatures":
        """Parse :meth:`key` back (``ValueError`` when it is not one)."""
        m = re.fullmatch(r"sm(\d+)/d(\d+)/(\w+)/([\w+-]+)/L(.+)/p(.+)/r(.+)/bh(.+)", key)
        if not m:
            raise ValueError(f"not a feature key: {key!r}")
        return cls.from_dict(dict(arch=int(m.group(1)), head_dim=int(m.group(2)),
                                  dtype=m.group(3), geometry=m.group(4), seq_len=m.group(5),
                                  density=m.group(6), imbalance=m.group(7),
                                  batch_heads=m.group(8)))

    @property
    def group(self) -> tuple[int, int, str, str]:
        """What a nearest-entry lookup must match exactly: arch, head dim, dtype, geometry."""
        return (self.arch, self.head_dim, self.dtype, self.geometry)

    @property
    def bucket_index(self) -> tuple[int, int, int, int]:
        """Positions of the density, seq-len, imbalance and batch x heads buckets (for
        distances; in that order of priority)."""
        return (DENSITY_BUCKETS.index(self.density), SEQ_BUCKETS.index(self.seq_len),
                IMBALANCE_BUCKETS.index(self.imbalance),
                BATCH_HEADS_BUCKETS.index(self.batch_heads))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "MaskFeatures":
        """Parse and validate (``ValueError`` naming the field on any problem)."""
        if not isinstance(d, dict):
            raise ValueError(f"features must be an object, got {type(d).__name__}")
        fields = set(cls.__dataclass_fields__)
        unknown, missing = set(d) - fields, fields - set(d)
        if unknown:
            raise ValueError(f"features: unknown fields {sorted(unknown)}")
        if missing:
            raise ValueError(f"features: missing fields {sorted(missing)}")
        for name in ("arch", "head_dim"):
            v = d[name]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"features: {name} must be a positive int, got {v!r}")
        allowed = {"dtype": FEATURE_DTYPES, "seq_len": SEQ_BUCKETS, "density": DENSITY_BUCKETS,
                   "imbalance": IMBALANCE_BUCKETS, "batch_heads": BATCH_HEADS_BUCKETS}
        for name, labels in allowed.items():
            if d[name] not in labels:
                raise ValueError(f"features: {name} must be one of {list(labels)}, "
                                 f"got {d[name]!r}")
        if not isinstance(d["geometry"], str) or not _GEOMETRY.match(d["geometry"]):
            raise ValueError("features: geometry must be 'uniform-<q>x<kv>' or 'variable-<q>' "
                             f"with sizes in {list(BLOCK_BUCKETS)}, got {d['geometry']!r}")
        return cls(**d)


def mask_measures(mask: Any) -> MaskMeasures:
    """Sequence length, token-pair density, row imbalance and block geometry of ``mask``.

    Works where the mask lives. On the device the per-row reductions run there and two numbers
    (total and heaviest row pairs) come back: one synchronization, no copy of the mask; a mask
    with dense rows (built from a dense matrix) takes one kernel for it
    (:func:`~tessera.runtime.planner_launches.mask_pairs`). On the host a mask built from a
    dense matrix whose CSR arrays were never derived is measured from its dense rows (the CSR
    is not derived for this).
    """

    xp = mask.xp
    dense = mask.dense_rows
    if dense is not None and mapping.use_device_planner(xp):
        rows = mask.xp.ascontiguousarray(dense).view(np.uint8)
        return _measures(mask, *planner_launches.mask_pairs(mask, rows))
    qlen = np.diff(mask.q_bounds)
    klen = np.diff(mask.kv_bounds)
    n_bh = mask.batch_heads[0] * mask.batch_heads[1]
    if mask._indptr is None and dense is not None:
        if np.all(klen[:-1] == klen[0]):  # uniform key blocks: counts, corrected for the last
            keys = dense.sum(axis=1, dtype=np.int64) * int(klen[0])
            if klen[-1] != klen[0]:
                keys = keys + (int(klen[-1]) - int(klen[0])) * dense[:, -1].astype(np.int64)
        else:  # exact in float64 for any realistic sequence length (< 2**53 keys)
            w = xp.asarray(klen.astype(np.float64))
            keys = xp.rint(dense.astype(np.float64) @ w).astype(np.int64)
        pairs = keys * xp.tile(xp.asarray(qlen), n_bh)
    else:
        pairs = mask.row_pairs()
    total, heaviest = (int(x) for x in to_numpy(xp.stack([pairs.sum(), pairs.max()])))
    return _measures(mask, total, heaviest)


def _measures(mask: Any, total: int, heaviest: int) -> MaskMeasures:
    """:class:`MaskMeasures` from the mask's geometry and its total / heaviest-row pairs."""
    qlen = np.diff(mask.q_bounds)
    n_bh = mask.batch_heads[0] * mask.batch_heads[1]
    n_rows = n_bh * qlen.size
    lq, lkv = int(mask.q_bounds[-1]), int(mask.kv_bounds[-1])
    density = total / (n_bh * lq * lkv)
    imbalance = heaviest * n_rows / total if total else 1.0
    return MaskMeasures(seq_len=max(lq, lkv), density=density, imbalance=imbalance,
                        q_block=float(np.median(qlen)), uniform=mask.uniform_block_size())


def _geometry(uniform: tuple[int, int] | None, q_block: float) -> str:
    if uniform is not None:
        return f"uniform-{block_bucket(uniform[0])}x{block_bucket(uniform[1])}"
    return f"variable-{block_bucket(q_block)}"


def mask_geometry(mask: Any) -> str:
    """The geometry feature of ``mask`` (``uniform-<q>x<kv>`` or ``variable-<q>``), from its
    block bounds alone: no read of the mask, so a plan can ask a table before measuring."""
    return _geometry(mask.uniform_block_size(), float(np.median(np.diff(mask.q_bounds))))


def features_from_measures(m: MaskMeasures, *, head_dim: int, dtype: str, arch: int,
                           num_q_heads: int, batch: int) -> MaskFeatures:
    """Bucket :class:`MaskMeasures` (plus the attention shape) into :class:`MaskFeatures`."""
    return MaskFeatures(
        arch=int(arch), head_dim=int(head_dim), dtype=dtype,
        geometry=_geometry(m.uniform, m.q_block),
        seq_len=_bucket(m.seq_len, _SEQ_EDGES, SEQ_BUCKETS, True),
        density=_bucket(m.density, _DENSITY_EDGES, DENSITY_BUCKETS, False),
        imbalance=_bucket(m.imbalance, _IMBALANCE_EDGES, IMBALANCE_BUCKETS, False),
        batch_heads=_bucket(batch * num_q_heads, _BATCH_HEADS_EDGES, BATCH_HEADS_BUCKETS, True))


def mask_features(mask: Any, *, head_dim: int, dtype: Any, arch: int, num_q_heads: int,
                  batch: int) -> MaskFeatures:
    """The table features of planning ``mask`` for this attention shape on ``arch``.

    Cheap: a few reductions where the mask lives and one small transfer (see
    :func:`mask_measures`); the mask itself is never copied to the host.
    """

    return features_from_measures(mask_measures(mask), head_dim=head_dim,
                                  dtype=dtype_name(dtype), arch=arch,
                                  num_q_heads=num_q_heads, batch=batch)


def geometry_features(mask: Any, *, head_dim: int, dtype: Any, arch: int, num_q_heads: int,
                      batch: int) -> MaskFeatures:
    """The features of ``mask`` that its block bounds and the shape give, reading nothing of
    its selection: density and imbalance are placeholders (the lowest buckets), for lookups
    that ignore them (``RegimeTable.lookup_unread``)."""
    return features_from_measures(_measures(mask, 0, 0), head_dim=head_dim,
                                  dtype=dtype_name(dtype), arch=arch,
                                  num_q_heads=num_q_heads, batch=batch)
