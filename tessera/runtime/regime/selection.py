"""How a plan's regime is chosen when none is given.

Selection (``tessera.plan(..., regime=None)``, :func:`select_regime`):

1. A regime table in force for the plan's architecture (:func:`active_table`): chosen by
   :func:`use_table`, else by ``$TESSERA_REGIME_TABLE`` (a file; ``none`` for no table), else
   ``tables/<gpu-slug>.json`` beside the package (``"NVIDIA H200"`` -> ``nvidia-h200.json``)
   when it exists. Tables are written offline by ``python -m tessera profile``
   (tessera/tools/profile.py).

   The table is consulted where its choice matters: when the heuristic regime's plan may split
   tasks (``tasks.may_split``: shapes with fewer than 16 tasks per slot of the GPU -- few heads,
   short clips -- whose plans synchronize once anyway). There the mask's :class:`MaskFeatures`
   (one kernel and a 16-byte copy on the device) are looked up (:func:`table_pick`: a plain
   128-row pick takes aligned tiles where :func:`align_pays`, an sm90 pick the key walk
   :func:`pack_pays` says pays) -- unless the table cannot answer the mask's geometry
   (:meth:`RegimeTable.covers`), or the heuristic's four-ring tiles (head dim 64) get enough
   tasks a ring (``RINGS_MIN_TASKS``), which no head-dim-64 entry of the 4-head profile had.
   The H200 table picks within 5% of the oracle on 92% of held-out 4-head masks, 1.035x
   faster than the selection without it.
   At the models' full head counts no task may split, the plan needs no
   synchronization, and the heuristic is kept: profiled at those head counts the table's
   picks equal the heuristic's (x1.000 over 32 held-out masks, 97% within 5% of the oracle,
   docs/decisions.md), so measuring the mask there would only cost a
   synchronization.
2. Otherwise, or when the table has no entry for the head dim / dtype / geometry, the
   documented heuristic :func:`default_regime` with its mask-reading rules
   (:func:`heuristic_choice`). Plans without an architecture (``arch=None``
   with a host mask: a CPU-only machine) always take the heuristic. A table that is corrupt or
   was profiled on another GPU warns once and is ignored: planning never fails because of one.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable

from ...cuda import device
from ...dtypes import dtype_name
from ...mask import bounds_key
from . import features
from .backward import BackwardRegime, default_backward_regime
from .heuristic import (ROWS128_MIN_DENSITY_D64, SM90_PACKED_D64, SM90_ROWS64_D64,
                        SM90_ROWS128, SM90_ROWS192_D64,
                        align_may_pay, align_pays, blocks_ragged, default_regime,
                        one_ring_where_few_tasks, pack_pays, rows192_pay, selects_every_block,
                        typical_q_block)
from ..tasks import tasks_lower_bound
from .slots import plan_may_split, plan_tasks_in_flight
from .table import TABLES_DIR, RegimeTable, gpu_slug
from .value import Regime

__all__ = ["use_table", "active_table", "select_regime", "selected_regime", "table_pick",
           "select_backward_regime",
           "heuristic_choice", "aligned_pick", "packed_pick", "planned_pick", "whole_span_pick",
           "selection_generation", "describe_table_in_use", "ring_rule_sm_count", "ENV_TABLE"]


ENV_TABLE = "TESSERA_REGIME_TABLE"


_AUTO = "auto"


_NONE = "none"  # $TESSERA_REGIME_TABLE=none: no table, the heuristic everywhere


_explicit: Any = _AUTO  # "auto": discover; None: no table; a RegimeTable: that one


_resolved: dict[tuple, RegimeTable | None] = {}


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=5)  # the caller of tessera.plan


def use_table(table: "str | os.PathLike | RegimeTable | None") -> RegimeTable | None:
    """Choose the regime table plans use.

    A path (loaded and validated now: a bad file raises ``ValueError``) or a
    :class:`RegimeTable`: that table, for plans on its architecture and GPU. ``None``: no table,
    every plan takes the heuristic :func:`default_regime`. ``"auto"`` (the initial setting):
    ``$TESSERA_REGIME_TABLE`` if set (``none``: no table), else ``tables/<gpu-slug>.json``
    beside the package when it exists. Returns the table now in force for explicit choices
    (None otherwise).
    """
    global _explicit, _generation
    if not (table is None or isinstance(table, (RegimeTable, str, os.PathLike))):
        raise TypeError(f"table must be a path, a RegimeTable, None or 'auto', got "
                        f"{type(table).__name__}")
    _generation += 1
    if table is None or isinstance(table, RegimeTable):
        _explicit = table
    elif isinstance(table, str) and table == _AUTO:
        _explicit = _AUTO
    else:
        _explicit = RegimeTable.load(table)
    _resolved.clear()
    _selections.clear()
    _read_selections.clear()
    _warned.clear()
    return None if isinstance(_explicit, str) else _explicit


def _table_source() -> tuple[str, str | None, bool]:
    """(how the table is chosen, its path or None, whether a missing file is an error)."""
    if isinstance(_explicit, RegimeTable) or _explicit is None:
        return "use_table", None, False
    env = os.environ.get(ENV_TABLE)
    if env == _NONE:
        return f"${ENV_TABLE}", None, False
    if env and env != _AUTO:
        return f"${ENV_TABLE}", env, True
    name = device.current_gpu_name()
    if name is None:
        return "tables", None, False
    return "tables", _default_table_path(name), False


@functools.lru_cache(maxsize=16)  # asked on every plan: path arithmetic costs microseconds
def _default_table_path(gpu_name: str) -> str:
    return str(TABLES_DIR / f"{gpu_slug(gpu_name)}.json")


def active_table(arch: int | None) -> RegimeTable | None:
    """The table plans for compute capability ``arch`` use, or None (the heuristic).

    None for ``arch=None`` (no GPU). A table that cannot be read, that was profiled on another
    architecture or another GPU, or that never measured the architecture's default kernel family,
    gives a warning (once) and None: planning never fails because of a table.
    """
    if arch is None:
        return None
    how, path, required = _table_source()
    cache_key = (how, path, arch, id(_explicit))
    if cache_key in _resolved:
        return _resolved[cache_key]
    table: RegimeTable | None = None
    if how == "use_table":
        table = _explicit
    elif path is not None:
        try:
            table = RegimeTable.load(path)
        except FileNotFoundError:
            if required:
                _warn_once(f"regime table {path} (from {how}) does not exist; "
                           "using the heuristic default regime")
        except (OSError, ValueError) as exc:
            _warn_once(f"regime table from {how} is unusable: {exc}; "
                       "using the heuristic default regime")
    if table is not None:
        here = device.current_gpu_name()
        if table.arch is not None and table.arch != arch:
            _warn_once(f"regime table {table.describe()} was profiled on sm_{table.arch}, "
                       f"but this plan is for sm_{arch}; using the heuristic default regime")
            table = None
        elif here is not None and table.gpu is not None and gpu_slug(here) != gpu_slug(table.gpu):
            _warn_once(f"regime table {table.describe()} was profiled on {table.gpu}, but this "
                       f"GPU is {here}; using the heuristic default regime")
            table = None
        elif len(table) and default_regime(arch).family not in table.families:
            # A table that never measured this GPU's own kernel family would steer plans to a
            # slower one (the H200 table predates the sm90 family): profile again.
            _warn_once(f"regime table {table.describe()} has no {default_regime(arch).family} "
                       "regimes (profiled before that kernel family existed); using the "
                       "heuristic default regime; run `python -m tessera profile` again")
            table = None
    _resolved[cache_key] = table
    return table


def select_regime(mask: Any, *, arch: int | None, head_dim: int, dtype: Any,
                  num_q_heads: int, batch: int, num_kv_heads: int | None = None) -> Regime:
    """The regime ``tessera.plan`` uses when none is given (see :func:`selected_regime`)."""
    return selected_regime(mask, arch=arch, head_dim=head_dim, dtype=dtype,
                           num_q_heads=num_q_heads, batch=batch, num_kv_heads=num_kv_heads,
                           count_blocks=True)[0]


def selected_regime(mask: Any, *, arch: int | None, head_dim: int, dtype: Any,
                    num_q_heads: int, batch: int, num_kv_heads: int | None = None,
                    read_mask: bool = True, count_blocks: bool = False) -> tuple[Regime, bool]:
    """The regime ``tessera.plan`` uses when none is given, and whether every mask of this
    geometry gets it (the selection was not read).

    ``arch`` None with a device mask means the current device's. The heuristic
    :func:`default_regime`, unless a table is in force for the architecture
    (:func:`active_table`) and the heuristic's plan may split tasks (see the module
    docstring): then the mask's features are measured once and looked up, and the heuristic
    stays the answer when the table has nothing for this head dim / dtype / geometry. The
    heuristic's sm90 regimes for large blocks take 128-row aligned tiles where
    :func:`align_pays`. An answer that the geometry alone decides (neither a table lookup nor
    :func:`align_pays` read the selection) is remembered for the geometry and shapes: a model
    asks for the same few on every request (~45 us a request on the H200's host otherwise).
    ``read_mask=False`` decides by the geometry alone, reading nothing back from the GPU (a
    plan made while a CUDA graph is captured): what the last selection for this geometry and
    shapes found by reading its mask (the warm-up request), else the heuristic, plain tiles.
    ``count_blocks``: a device mask's blocks may be counted (a scalar read back), as a host
    mask's always are, for the rules that rest on the count (:func:`heuristic_choice`): a plan
    made directly counts them, a request never does.
    """
    if arch is None and mask.on_device:
        arch = device.device_arch()
    num_kv_heads = num_kv_heads or num_q_heads

    dtype = dtype_name(dtype)
    # Everything the decision reads besides the selection: the GPU (its task slots), the table
    # in force, the shapes and the geometry.
    key = (arch, device.device_arch(), device.device_sm_count(), id(active_table(arch)),
           int(head_dim), dtype,
           int(num_q_heads), int(batch), int(num_kv_heads), tuple(mask.batch_heads),
           bool(mask.on_device), bounds_key(mask.q_bounds), bounds_key(mask.kv_bounds))
    # (An answer of the geometry alone holds for its own count_blocks only: with it a device
    # mask's count may decide. An answer read holds for the next that reads nothing, either way.)
    geometry_key = (*key, bool(count_blocks))
    found = _selections.get(geometry_key)
    if found is not None:
        return found, True
    if not read_mask:
        # What the last selection for this geometry and shapes found by reading its mask (the
        # warm-up request before a CUDA-graph capture), else the heuristic with plain tiles.
        seen = _read_selections.get(key)
        if seen is not None:
            return seen, False
        fallback = default_regime(arch, head_dim, typical_q_block(mask.q_bounds),
                                  mask.kv_bounds)
        return _ring_rule(fallback, mask, num_q_heads, batch, num_kv_heads,
                          ring_rule_sm_count(arch)), True
    regime, by_geometry = _select_regime(mask, arch, head_dim, dtype, num_q_heads, batch,
                                         num_kv_heads, count_blocks)
    kept = _selections if by_geometry else _read_selections
    if len(kept) >= 256:  # a bound, not an LRU: models use a handful of geometries
        kept.clear()
    kept[geometry_key if by_geometry else key] = regime
    return regime, by_geometry


# select_regime's answers that depend on the geometry and shapes alone, and the last answer for
# each geometry and shapes that read the mask (both emptied by use_table).
_selections: dict[tuple, Regime] = {}


_read_selections: dict[tuple, Regime] = {}


_generation = 0  # use_table calls so far


def selection_generation() -> int:
    """Changes whenever :func:`use_table` may have changed what :func:`select_regime` answers
    (a key part for anything that remembers its answers, as tessera.attention's kept plans)."""
    return _generation


def _select_regime(mask: Any, arch: int | None, head_dim: int, dtype: str, num_q_heads: int,
                   batch: int, num_kv_heads: int, count_blocks: bool) -> tuple[Regime, bool]:
    """select_regime's decision: (the regime, whether the geometry and shapes alone gave it)."""
    heuristic = default_regime(arch, head_dim, typical_q_block(mask.q_bounds), mask.kv_bounds)
    table = active_table(arch)
    # Whether the split policy matters is asked of the heuristic's unpacked form: a packed walk
    # never splits, which must not keep the table from masks it was profiled for. (The slots
    # are the heuristic's own: the variant that would run, compiled once for its occupancy.)
    unpacked = heuristic.with_(pack_keys=False)
    sm_count = ring_rule_sm_count(arch)
    # Rings with enough tasks stand (_rings_stand; asked only where a table is in force).
    if (table is not None
            and not _rings_stand(heuristic, mask, num_q_heads, batch, num_kv_heads, sm_count)
            and table.covers(int(arch), int(head_dim), dtype, features.mask_geometry(mask))
            and plan_may_split(unpacked, mask, num_q_heads=num_q_heads,
                               num_kv_heads=num_kv_heads, batch=batch,
                               in_flight=plan_tasks_in_flight(heuristic, mask, head_dim, arch,
                                                              dtype == "bfloat16"))):
        try:
            found = table_pick(table, features.mask_features(
                mask, head_dim=head_dim, dtype=dtype, arch=arch, num_q_heads=num_q_heads,
                batch=batch), mask)
        except Exception as exc:  # a table must never break planning
            _warn_once(f"regime table lookup failed ({type(exc).__name__}: {exc}); "
                       "using the heuristic default regime")
            found = None
        if found is not None:
            return found, False
        by_geometry = False
    else:
        by_geometry = True
    regime, read = heuristic_choice(mask, arch, head_dim, heuristic, num_q_heads=num_q_heads,
                                    batch=batch, num_kv_heads=num_kv_heads, sm_count=sm_count,
                                    count_blocks=count_blocks)
    return regime, by_geometry and not read


def ring_rule_sm_count(arch: int | None) -> int:
    """The SMs the ring rule counts: the current GPU's when the plan is for its architecture,
    else 0 (a portable plan, or no GPU: the rule is off)."""
    return device.device_sm_count() if arch is not None and arch == device.device_arch() else 0


def heuristic_choice(mask: Any, arch: int | None, head_dim: int,
                     heuristic: Regime | None = None, *, num_q_heads: int | None = None,
                     batch: int = 1, num_kv_heads: int | None = None,
                     sm_count: int = 0, count_blocks: bool = False) -> tuple[Regime, bool]:
    """The regime a plan of ``mask`` takes where no table answers, and whether deciding it
    read the mask: :func:`default_regime` (``heuristic``, when the caller has it), whose sm90
    regimes for large blocks take aligned tiles where :func:`align_pays`, else packed keys
    where :func:`pack_pays`, else (head dim 64) 192-row tiles where :func:`rows192_pay` or
    a host mask :func:`selects_every_block`, 128-row tiles where a host mask selects at least
    ``ROWS128_MIN_DENSITY_D64`` of its blocks (a device mask's count too with
    ``count_blocks``). Given the shape (``num_q_heads``, ``batch``) and
    the GPU's ``sm_count``, rings that would get too few tasks take one-ring tiles
    (:func:`one_ring_where_few_tasks`)."""
    regime, read = _mask_rules(mask, arch, head_dim, heuristic, count_blocks)
    if num_q_heads is None:
        return regime, read
    return _ring_rule(regime, mask, num_q_heads, batch, num_kv_heads or num_q_heads,
                      sm_count), read


def _ring_rule(regime: Regime, mask: Any, num_q_heads: int, batch: int, num_kv_heads: int,
               sm_count: int) -> Regime:
    """:func:`one_ring_where_few_tasks` for this shape: its fewest tasks (tasks_lower_bound)."""
    if regime.rings == 1 or sm_count <= 0:
        return regime
    hp = regime.heads_per_task(mask.batch_heads[1], num_q_heads, num_kv_heads)
    tasks = tasks_lower_bound(batch, num_q_heads, hp, mask.seq_len_q, regime.block_m // hp)
    return one_ring_where_few_tasks(regime, tasks, sm_count, typical_q_block(mask.q_bounds))


def _rings_stand(regime: Regime, mask: Any, num_q_heads: int, batch: int, num_kv_heads: int,
                 sm_count: int) -> bool:
    """Whether ``regime``'s rings keep their tasks a ring under the ring rule, where the table is
    not consulted: it has no evidence there (its head-dim-64 entries come from 4-head masks of
    at most ~18k tokens, under RINGS_MIN_TASKS tasks a ring, and its head-count bucket spans up
    to 16, where its picks ran up to 1.09x slower than the rings: docs/decisions.md)."""
    return (regime.rings > 1 and sm_count > 0
            and _ring_rule(regime, mask, num_q_heads, batch, num_kv_heads, sm_count) == regime)


def _mask_rules(mask: Any, arch: int | None, head_dim: int, heuristic: Regime | None,
                count_blocks: bool = False) -> tuple[Regime, bool]:
    """heuristic_choice's rules that read the mask (or its geometry)."""
    if heuristic is None:
        heuristic = default_regime(arch, head_dim, typical_q_block(mask.q_bounds),
                                   mask.kv_bounds)
    # (Small query blocks at head dim 64 take SM90_ROWS64_D64's tiles too, by their own rule:
    # the large-block rules below are not theirs.)
    if heuristic not in (SM90_ROWS128, SM90_ROWS64_D64) or typical_q_block(mask.q_bounds) <= 64:
        return heuristic, False
    # The packed form: at head dim 64 on 64x128 tiles (SM90_PACKED_D64 says why).
    packed = SM90_PACKED_D64 if heuristic == SM90_ROWS64_D64 else heuristic.with_(pack_keys=True)
    # align_pays reads the selection only when 128-row tiles pad the query blocks, pack_pays
    # when the key blocks are ragged against the step.
    read = align_may_pay(mask.q_bounds, 128) or blocks_ragged(mask.kv_bounds, packed.block_n)
    if align_pays(mask, 128):
        # Aligned tiles are measured with 128 rows (clusters 1.3-1.4x faster), at every head
        # dim.
        return SM90_ROWS128.with_(align_tiles=True), read
    if pack_pays(mask, packed.block_n, packed.block_m):
        return packed, read
    if heuristic == SM90_ROWS64_D64:
        if rows192_pay(mask.q_bounds):
            return SM90_ROWS192_D64, read
        if not mask.on_device or count_blocks:
            # A dense layer fills 192-row tiles whatever its blocks (one run of rows a head); a
            # mask selecting much of its blocks reads each K/V chunk for 128 rows at once.
            # On the device the count is a readback: a plan made directly takes it, a request
            # at a model's shape never waits for one (its device masks keep 64-row tiles).
            if selects_every_block(mask):
                return SM90_ROWS192_D64, True
            return (SM90_ROWS128 if mask.density >= ROWS128_MIN_DENSITY_D64
                    else heuristic), True
    return heuristic, read


def aligned_pick(found: Regime, aligns: bool) -> Regime:
    """A table's pick as a plan takes it, given whether the mask's own estimate says aligned
    tiles pay (``aligns``: :func:`align_pays` at 128 rows): a plain 128-row sm90 pick then
    takes aligned tiles, as the heuristic's does. The features cannot tell semantic clusters
    (neighbours sharing keys) from random variable blocks; the estimate can (held-out clusters
    1.05-1.13x faster aligned on the H200, docs/decisions.md)."""
    if (aligns and found.family == "sm90" and found.block_m == 128 and not found.pack_keys
            and not found.align_tiles):
        return found.with_(align_tiles=True)
    return found


def packed_pick(found: Regime, packs: bool) -> Regime:
    """A table's sm90 pick with the key walk the mask's own estimate says pays (``packs``:
    :func:`pack_pays` for the pick's tile shape), as the heuristic's takes it: packed where it
    pays, span by span where it does not. The features cannot see how many chunks a span-by-span
    walk wastes on short ragged key blocks (docs/decisions.md). Aligned tiles, merged rows
    (combine threshold > 0) and 192-key steps keep their walk."""
    if (found.family != "sm90" or found.align_tiles or found.wide_steps
            or found.combine_threshold != 0 or found.pack_keys == packs):
        return found
    if not packs:
        return found.with_(pack_keys=False)
    # A packed plan never splits its tasks: the profiled packed candidates carry the default
    # split policy, and the pick takes their name.
    return found.with_(pack_keys=True, split_ratio=Regime.split_ratio)


def whole_span_pick(found: Regime, mask: Any, head_dim: int,
                    count_blocks: bool = False) -> Regime:
    """A selected regime as a plan of ``mask`` takes it: with ``whole_spans`` where ``mask`` is
    a host mask that :func:`selects_every_block` (a dense layer), at head dim 128, and the
    regime's kernel can walk whole spans (an sm90 producer regime of the span-by-span walk,
    combine threshold 0, plain tiles). Wan's dense layer ran 1.010x faster so; at head dim 64
    the 192-row tiles measured 0.997-1.009x, not worth a kernel to build (docs/decisions.md).
    A device mask's count is a readback: counted with ``count_blocks`` (a plan made directly),
    never for a request at a model's shape, which keeps the regime."""
    if (head_dim != 128 or (mask.on_device and not count_blocks) or found.whole_spans
            or not found.producer
            or found.pack_keys or found.align_tiles or found.combine_threshold != 0):
        return found
    return found.with_(whole_spans=True) if selects_every_block(mask) else found


def planned_pick(found: Regime, aligns: Callable[[], bool],
                 packs: Callable[[Regime], bool]) -> Regime:
    """A table's pick as a plan takes it, given the mask's estimates (each asked only for picks
    it could change): a plain 128-row pick with aligned tiles where ``aligns()``
    (:func:`aligned_pick`), else the key walk ``packs(pick)`` says pays (:func:`packed_pick`).
    :func:`table_pick` asks the mask; the profiler's rescoring asks an evaluation's records."""
    aligned = aligned_pick(found, True)
    if aligned != found and aligns():
        return aligned
    if packed_pick(found, not found.pack_keys) == found:
        return found
    return packed_pick(found, packs(found))


def table_pick(table: RegimeTable, mask_features: features.MaskFeatures,
               mask: Any) -> Regime | None:
    """What ``table`` answers for a mask with these features, as a plan takes it
    (:func:`planned_pick` with :func:`align_pays` and :func:`pack_pays` of ``mask``; the latter
    reads the mask only for ragged key blocks), or None."""
    found = table.lookup(mask_features)
    if found is None:
        return None
    return planned_pick(found, lambda: align_pays(mask, 128),
                        lambda r: pack_pays(mask, r.block_n, r.block_m))


def select_backward_regime(mask: Any, *, arch: int | None, head_dim: int, dtype: Any,
                           num_q_heads: int, batch: int, deterministic: bool = False,
                           portable: bool = False, read_mask: bool = True) -> BackwardRegime:
    """The backward regime of ``mask`` for this attention shape on ``arch``: the backward
    section of the regime table in force (:func:`active_table`) where it answers the mask's
    geometry, else the heuristic :func:`~tessera.runtime.regime.backward.default_backward_regime`.
    ``deterministic``: among bitwise-repeatable regimes only; ``portable``: the portable
    kernels (no lookup). ``read_mask`` False with a device mask: nothing is read back (a
    backward request never waits for the GPU), so the lookup knows the geometry and shapes but
    not the density: the vote of the geometry's entries at every density
    (:meth:`RegimeTable.lookup_unread`). A host mask's features are always measured (no
    synchronization)."""
    if arch is None and mask.on_device:
        arch = device.device_arch()
    heuristic = default_backward_regime(arch, typical_q_block(mask.q_bounds),
                                        typical_q_block(mask.kv_bounds),
                                        deterministic=deterministic, portable=portable)
    table = None if portable else active_table(arch)
    section = table.backward if table is not None else None
    dtype = dtype_name(dtype)
    if section is None or not section.covers(int(arch), int(head_dim), dtype,
                                             features.mask_geometry(mask)):
        return heuristic
    try:
        if read_mask or not mask.on_device:
            found = section.lookup(features.mask_features(
                mask, head_dim=head_dim, dtype=dtype, arch=arch, num_q_heads=num_q_heads,
                batch=batch), deterministic=deterministic)
        else:
            found = section.lookup_unread(features.geometry_features(
                mask, head_dim=head_dim, dtype=dtype, arch=arch, num_q_heads=num_q_heads,
                batch=batch), deterministic=deterministic)
    except Exception as exc:  # a table must never break planning
        _warn_once(f"regime table backward lookup failed ({type(exc).__name__}: {exc}); "
                   "using the heuristic default backward regime")
        found = None
    return found if found is not None and found.runs_on(arch) else heuristic


def describe_table_in_use(arch: int | None) -> str:
    """For ``python -m tessera info``: which table plans use here, or ``none: heuristic``."""
    how, path, _ = _table_source()
    if arch is None:
        if how == "use_table" and isinstance(_explicit, RegimeTable):
            return (f"none: heuristic (no GPU; {_explicit.describe()} from use_table applies "
                    "on a GPU)")
        if path is not None:
            return f"none: heuristic (no GPU; {path} from {how} applies on a GPU)"
        return "none: heuristic (no GPU)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = active_table(arch)
    if table is not None:
        return (f"{table.describe()} (from {how}; looked up where tasks may split, the "
                "heuristic elsewhere)")
    why = "; ".join(str(w.message) for w in caught)
    if why:
        return f"none: heuristic ({why})"
    if how == "use_table":
        return "none: heuristic (use_table(None))"
    if path is None and how.startswith("$"):
        return f"none: heuristic ({ENV_TABLE}={_NONE})"
    return f"none: heuristic (no table at {path})" if path else "none: heuristic"
