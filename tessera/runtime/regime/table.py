"""The regime table: its file format (``tables/<gpu>.json``), validation and lookup."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...cuda.device import smem_limit_bytes
from .backward import backward_regime_from_name, checked_backward_regime
from .features import (BATCH_HEADS_BUCKETS, BLOCK_BUCKETS, DENSITY_BUCKETS, IMBALANCE_BUCKETS,
                       SEQ_BUCKETS, MaskFeatures)
from .slots import regime_fits
from .value import Regime, checked_regime, regime_from_name

__all__ = ["RegimeTable", "TABLE_FORMAT", "TABLE_VERSION", "TABLES_DIR", "gpu_slug",
           "write_json_atomic"]


TABLE_FORMAT = "tessera-regime-table"


TABLE_VERSION = 1


ENTRY_REQUIRED = ("features", "regime", "ms", "oracle_ms")


# Committed tables live in tables/ beside the package (the repository root).
TABLES_DIR = Path(__file__).resolve().parents[3] / "tables"


def gpu_slug(name: str) -> str:
    """A file-name slug of a GPU name: ``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# Smoothed lookup: one block-size bucket of geometry counts as this many bucket steps of the
# other features (leave-one-out on the H200 table). Uniform and variable geometries never vote
# for each other: a table profiled on variable blocks at head dim 64 picked 64x128 packed tiles
# for uniform 64-token masks that ran 0.71-0.89x the heuristic's (docs/decisions.md).
GEOMETRY_STEP = 3


ALL_GEOMETRIES = tuple([f"uniform-{q}x{k}" for q in BLOCK_BUCKETS for k in BLOCK_BUCKETS]
                       + [f"variable-{q}" for q in BLOCK_BUCKETS])


def _geometry_position(geometry: str) -> tuple[int, int, int]:
    """(variable?, query block bucket, key block bucket) of a geometry label, for distances
    (a variable geometry's key bucket is taken equal to its query bucket)."""
    kind, sizes = geometry.split("-", 1)
    q, _, k = sizes.partition("x")
    qi = BLOCK_BUCKETS.index(q)
    return (int(kind == "variable"), qi, BLOCK_BUCKETS.index(k) if k else qi)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# What a table's entries hold, by section: the forward's regimes, or (the ``backward`` section)
# backward regimes. (parse an entry's regime, parse a candidate's name, whether it runs.)
_SECTIONS = {
    "forward": (checked_regime, regime_from_name,
                lambda r, head_dim, arch: regime_fits(r, head_dim, arch)),
    "backward": (checked_backward_regime, backward_regime_from_name,
                 lambda r, head_dim, arch: r.runs_on(arch)),
}


class RegimeTable:
    """A profiled map from :class:`MaskFeatures` to the fastest :class:`Regime`.

    File format (JSON)::

        {"format": "tessera-regime-table", "version": 1,
         "provenance": {"gpu": ..., "arch": ..., "driver": ..., "cuda": ..., "cupy": ...,
                        "tessera": ..., "date": ..., "corpus": {...}},
         "entries": [{"features": {MaskFeatures fields}, "regime": {Regime fields},
                      "ms": <chosen regime's time>, "oracle_ms": <best time per mask>, ...}]}

    Entries may carry more fields (the profiler writes the heuristic's time, the masks behind
    the entry and every candidate's time). All entries share one architecture. An optional
    ``"backward": {"provenance": ..., "entries": [...]}`` holds the same kind of entries whose
    regimes are :class:`~tessera.runtime.regime.backward.BackwardRegime` (``python -m tessera
    profile --backward``); it is :attr:`backward`, a table of ``section="backward"``.

    :meth:`lookup`, for tables whose entries carry every candidate's measurements (what the
    profiler writes): a smoothed vote. Each entry of the same arch, head dim and dtype weighs
    ``masks x 0.5**distance`` (distance: bucket steps of density, sequence length, imbalance
    and batch x heads, plus :data:`GEOMETRY_STEP` per step of block size; only entries of the
    same kind of geometry, uniform or variable blocks, vote), and the regime with
    the lowest weighted mean relative time (time / that entry's oracle) wins. One profiled
    mask per key is a noisy vote; pooling the neighbours' evidence picked better regimes in
    leave-one-out tests on the H200 table (docs/decisions.md). Tables without candidate
    data (written by hand): the entry with the same key; else, among entries with the same
    arch, head dim, dtype and geometry, the nearest by bucket distance (density first, then
    sequence length, then imbalance, then batch x heads; ties by key). Else None. Every
    answer is precomputed when the table is built, so a lookup is one key format and one
    dict read.
    """

    def __init__(self, entries: list[dict], provenance: dict | None = None, *,
                 source: str = "<table>", section: str = "forward",
                 backward: "RegimeTable | None" = None) -> None:
        self.source = source
        if section not in _SECTIONS:
            raise ValueError(f"section must be one of {list(_SECTIONS)}, got {section!r}")
        self.section = section
        checked, self._from_name, fits = _SECTIONS[section]
        if provenance is None:
            provenance = {}
        if not isinstance(provenance, dict):
            raise ValueError(f"{source}: provenance must be an object, "
                             f"got {type(provenance).__name__}")
        if not isinstance(entries, list):
            raise ValueError(f"{source}: entries must be a list, got {type(entries).__name__}")
        self.provenance = dict(provenance)
        self._entries: dict[str, dict] = {}
        self._features: dict[str, MaskFeatures] = {}
        self._regimes: dict[str, Any] = {}
        for i, e in enumerate(entries):
            self._add_entry(e, f"{source}: entry {i}", checked, fits)
        archs = {f.arch for f in self._features.values()}
        if "arch" in self.provenance:
            archs.add(self.provenance["arch"])
        if backward is not None:
            if backward.section != "backward":
                raise ValueError(f"{source}: the backward section must hold backward regimes")
            if backward.arch is not None:
                archs.add(backward.arch)
        if len(archs) > 1:
            raise ValueError(f"{source}: entries and provenance name several architectures "
                             f"{sorted(archs, key=str)}; a table is for one GPU")
        self.arch: int | None = archs.pop() if archs else None
        #: The backward regimes' section (a table of ``section="backward"``), or None.
        self.backward = backward
        self._index = self._precompute()
        # Backward sections: the answers among bitwise-repeatable regimes only
        # (config.deterministic_backward), and those for a mask nothing is read of.
        self._deterministic = (self._precompute(lambda r: r.deterministic)
                               if section == "backward" else self._index)
        self._unread = ({**self._precompute_smoothed(unread=True),
                         **self._precompute_smoothed(lambda r: r.deterministic, unread=True,
                                                     tag="deterministic")}
                        if section == "backward" and self._smoothed else {})
        # The (arch, head dim, dtype, geometry) groups some lookup answers: with the smoothed
        # rule a geometry without evidence of its kind has none.
        # (One key parsed a group: a key's last four parts are its buckets.)
        one_key = {k.rsplit("/", 4)[0]: k for k in self._index}
        self._answered = {MaskFeatures.from_key(k).group for k in one_key.values()}

    def _add_entry(self, e: Any, where: str, checked: Callable[[Any], Any],
                   fits: Callable[[Any, int, int], bool]) -> None:
        """Validate one entry (``ValueError`` saying ``where`` and what is wrong) and keep it."""
        if not isinstance(e, dict):
            raise ValueError(f"{where}: must be an object, got {type(e).__name__}")
        missing = [f for f in ENTRY_REQUIRED if f not in e]
        if missing:
            raise ValueError(f"{where}: missing fields {missing}")
        try:
            feats = MaskFeatures.from_dict(e["features"])
            regime = checked(e["regime"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not fits(regime, feats.head_dim, feats.arch):
            raise ValueError(f"{where}: regime {regime.name} does not run at head dim "
                             f"{feats.head_dim} on sm_{feats.arch} (its family, or more "
                             f"shared memory than the {smem_limit_bytes(feats.arch)} "
                             f"bytes a block there)")
        for f in ("ms", "oracle_ms"):
            v = e[f]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not \
                    math.isfinite(v) or v < 0:
                raise ValueError(f"{where}: {f} must be a finite number >= 0, got {v!r}")
        key = feats.key()
        if "key" in e and e["key"] != key:
            raise ValueError(f"{where}: key {e['key']!r} does not match its features "
                             f"({key!r})")
        if key in self._entries:
            raise ValueError(f"{where}: duplicate features {key!r}")
        entry = dict(e)
        entry["key"] = key
        entry["features"] = feats.to_dict()
        entry["regime"] = regime.to_dict()
        self._entries[key] = entry
        self._features[key] = feats
        self._regimes[key] = regime

    # ------------------------------------------------------------------ lookup
    @property
    def _smoothed(self) -> bool:
        """Whether every entry carries its candidates' measurements (the smoothed rule)."""
        return bool(self._entries) and all(isinstance(e.get("candidates"), dict)
                                           and e["candidates"] for e in self._entries.values())

    def _precompute(self, keep: Callable[[Any], bool] | None = None) -> dict[str, Any]:
        """Every key a lookup can answer (see the class docstring for the two rules), among
        the regimes ``keep`` accepts (None: all)."""
        if self._smoothed:
            return self._precompute_smoothed(keep)
        return self._precompute_nearest(keep)

    def _precompute_smoothed(self, keep: Callable[[Any], bool] | None = None, *,
                             unread: bool = False, tag: str = "") -> dict[str, Any]:
        """The smoothed rule's answers. ``unread``: for masks whose density and imbalance are
        not known (nothing read of them): every entry of the geometry votes whatever its
        density and imbalance, keyed by :meth:`_unread_key` (``tag`` keeps two such indexes
        apart)."""
        keys = sorted(self._entries)
        feats = [self._features[k] for k in keys]
        regimes: dict[str, Any] = {}
        for k in keys:  # candidate names -> regimes: the entry's own, else parsed from the name
            for name in self._entries[k]["candidates"]:
                if name not in regimes:
                    own = self._regimes[k]
                    regimes[name] = own if own.name == name else self._from_name(name)
        names = sorted(n for n, r in regimes.items()
                       if r is not None and (keep is None or keep(r)))
        col = {n: i for i, n in enumerate(names)}
        rel = np.zeros((len(keys), len(names)))
        seen = np.zeros((len(keys), len(names)))
        for i, k in enumerate(keys):
            for name, c in self._entries[k]["candidates"].items():
                if name in col and isinstance(c, dict) and _finite(c.get("rel")):
                    rel[i, col[name]] = float(c["rel"])
                    seen[i, col[name]] = 1.0
        weight0 = np.array([max(len(self._entries[k].get("masks", [])), 1) for k in keys],
                           dtype=np.float64)
        pos = np.array([f.bucket_index for f in feats], dtype=np.float64)
        geo = np.array([_geometry_position(f.geometry) for f in feats], dtype=np.float64)
        index: dict[str, Regime] = {}
        groups: dict[tuple, list[int]] = {}
        for i, f in enumerate(feats):
            groups.setdefault((f.arch, f.head_dim, f.dtype), []).append(i)
        grid = np.array(list(itertools.product(range(len(DENSITY_BUCKETS)),
                                               range(len(SEQ_BUCKETS)),
                                               range(len(IMBALANCE_BUCKETS)),
                                               range(len(BATCH_HEADS_BUCKETS)))),
                        dtype=np.float64)
        # Which bucket distances count: all four, or (unread) sequence length and batch x heads.
        counted = np.array([0.0, 1.0, 0.0, 1.0] if unread else [1.0] * 4)
        if not names:
            return {}
        for (arch, hd, dt), members in groups.items():
            for geometry in ALL_GEOMETRIES:
                g = np.array(_geometry_position(geometry), dtype=np.float64)
                # Only evidence of the same kind (uniform or variable blocks) answers: which
                # key walk and tiling pays differs between them (docs/decisions.md).
                m = np.array([i for i in members if geo[i][0] == g[0]], dtype=np.int64)
                if m.size == 0:
                    continue
                dist = ((np.abs(grid[:, None, :] - pos[m][None, :, :]) * counted).sum(-1)
                        + GEOMETRY_STEP * np.abs(geo[m] - g).sum(-1)[None, :])
                w = weight0[m][None, :] * 0.5 ** dist  # [grid, members]
                num, den = w @ (rel[m] * seen[m]), w @ seen[m]
                # A regime must have been measured wherever the weight is (all but 0.1%).
                ok = den >= 0.999 * w.sum(1, keepdims=True)
                score = np.where(ok, num / np.maximum(den, 1e-300), np.inf)
                best = score.argmin(1)  # ties: the first name, names sorted
                for gi, b in enumerate(best):
                    d, sq, im, bh = (int(x) for x in grid[gi])
                    f = MaskFeatures(arch, hd, dt, geometry, SEQ_BUCKETS[sq],
                                     DENSITY_BUCKETS[d], IMBALANCE_BUCKETS[im],
                                     BATCH_HEADS_BUCKETS[bh])
                    key = self._unread_key(f, tag) if unread else f.key()
                    if np.isfinite(score[gi, b]):
                        index[key] = regimes[names[b]]
        return index

    def _precompute_nearest(self, keep: Callable[[Any], bool] | None = None
                            ) -> dict[str, Any]:
        index = {k: r for k, r in self._regimes.items() if keep is None or keep(r)}
        groups: dict[tuple, list[tuple[tuple[int, ...], str]]] = {}
        for key, f in sorted(self._features.items()):
            if key in index:
                groups.setdefault(f.group, []).append((f.bucket_index, key))
        for (arch, hd, dt, geo), members in groups.items():
            for di, d in enumerate(DENSITY_BUCKETS):
                for si, s in enumerate(SEQ_BUCKETS):
                    for ii, imb in enumerate(IMBALANCE_BUCKETS):
                        for bi, bh in enumerate(BATCH_HEADS_BUCKETS):
                            k = MaskFeatures(arch, hd, dt, geo, s, d, imb, bh).key()
                            if k in index:
                                continue
                            pos = (di, si, ii, bi)
                            best = min(members, key=lambda m: (
                                tuple(abs(a - b) for a, b in zip(m[0], pos)), m[1]))
                            index[k] = self._regimes[best[1]]
        return index

    def covers(self, arch: int, head_dim: int, dtype: str, geometry: str | None = None) -> bool:
        """Whether any lookup for this architecture, head dim and dtype (and ``geometry``, as
        :func:`~tessera.runtime.regime.features.mask_geometry` names it) can answer, so a plan
        need not measure its mask's features when none can."""
        if geometry is None:
            return any(g[:3] == (arch, head_dim, dtype) for g in self._answered)
        return (arch, head_dim, dtype, geometry) in self._answered

    def lookup(self, features: MaskFeatures, *, deterministic: bool = False) -> Any:
        """The regime for ``features`` by the table's rule (class docstring), or None.
        ``deterministic`` (backward sections): among bitwise-repeatable regimes only."""
        return (self._deterministic if deterministic else self._index).get(features.key())

    @staticmethod
    def _unread_key(features: MaskFeatures, tag: str = "") -> str:
        f = features
        return (f"{tag}|sm{f.arch}/d{f.head_dim}/{f.dtype}/{f.geometry}/L{f.seq_len}"
                f"/bh{f.batch_heads}")

    def lookup_unread(self, features: MaskFeatures, *, deterministic: bool = False) -> Any:
        """Backward sections: the regime for a mask of these geometry and shapes whose density
        and imbalance are unknown (``features``' are ignored): the vote of the geometry's
        entries at any density. None where the table has none (or is not smoothed)."""
        return self._unread.get(self._unread_key(features,
                                                 "deterministic" if deterministic else ""))

    def lookup_exact(self, features: MaskFeatures) -> Regime | None:
        return self._regimes.get(features.key())

    # ------------------------------------------------------------------ access
    @property
    def entries(self) -> list[dict]:
        """The entries (copies), sorted by key."""
        return [json.loads(json.dumps(self._entries[k])) for k in sorted(self._entries)]

    def entry(self, key: str) -> dict | None:
        e = self._entries.get(key)
        return None if e is None else json.loads(json.dumps(e))

    @property
    def families(self) -> set[str]:
        """The kernel families the table's regimes (and measured candidates) belong to."""
        fams = {r.family for r in self._regimes.values()}
        for e in self._entries.values():
            for name in e.get("candidates", {}) or {}:
                r = self._from_name(name)
                if r is not None:
                    fams.add(r.family)
        return fams

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def gpu(self) -> str | None:
        g = self.provenance.get("gpu")
        return g if isinstance(g, str) else None

    def describe(self) -> str:
        """One line: where the table came from, which GPU and when."""
        p = self.provenance
        arch = f"sm_{self.arch}" if self.arch else "arch ?"
        backward = (f", backward section {len(self.backward)} entries"
                    if self.backward is not None else "")
        return (f"{self.source} ({p.get('gpu', 'GPU ?')}, {arch}, {p.get('date', 'date ?')}, "
                f"{len(self)} entries{backward})")

    def __repr__(self) -> str:
        return f"RegimeTable({self.describe()})"

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict[str, Any]:
        doc = {"format": TABLE_FORMAT, "version": TABLE_VERSION,
               "provenance": self.provenance, "entries": self.entries}
        if self.backward is not None:
            doc["backward"] = {"provenance": self.backward.provenance,
                               "entries": self.backward.entries}
        return doc

    def with_backward(self, backward: "RegimeTable | None") -> "RegimeTable":
        """This table with ``backward`` as its backward section (None: without one)."""
        return RegimeTable(self.entries, self.provenance, source=self.source,
                           backward=backward)

    @classmethod
    def from_json(cls, obj: Any, source: str = "<table>") -> "RegimeTable":
        """Validate a parsed table (``ValueError`` naming the problem)."""
        if not isinstance(obj, dict):
            raise ValueError(f"{source}: not a regime table (the top level is a "
                             f"{type(obj).__name__}, expected an object)")
        if obj.get("format") != TABLE_FORMAT:
            raise ValueError(f"{source}: format is {obj.get('format')!r}, expected "
                             f"{TABLE_FORMAT!r}")
        if obj.get("version") != TABLE_VERSION:
            raise ValueError(f"{source}: version {obj.get('version')!r} is not supported "
                             f"(this Tessera reads version {TABLE_VERSION})")
        unknown = set(obj) - {"format", "version", "provenance", "entries", "backward"}
        if unknown:
            raise ValueError(f"{source}: unknown top-level fields {sorted(unknown)}")
        if "entries" not in obj:
            raise ValueError(f"{source}: missing 'entries'")
        backward = None
        if "backward" in obj:
            b = obj["backward"]
            if not isinstance(b, dict) or "entries" not in b or set(b) - {"provenance",
                                                                           "entries"}:
                raise ValueError(f"{source}: backward must be an object of 'provenance' and "
                                 f"'entries'")
            backward = cls(b["entries"], b.get("provenance"), source=f"{source} [backward]",
                           section="backward")
        return cls(obj["entries"], obj.get("provenance"), source=source, backward=backward)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RegimeTable":
        """Read and validate a table file. A missing file raises ``FileNotFoundError``; anything
        wrong inside it a ``ValueError`` that names the file and the problem."""
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"{path}: a folder, not a regime table file (tables are JSON files "
                             "written by python -m tessera profile)")
        text = path.read_text(encoding="utf-8")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON file ({exc})") from None
        return cls.from_json(obj, source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        """Write the table atomically (:func:`write_json_atomic`)."""
        write_json_atomic(path, self.to_json())


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a temporary file in the same folder, then
    a rename), so an interrupted profile or evaluation never leaves a truncated file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=1, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private; tables are meant to be shared (and committed).
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
