"""THE task-queue contract: the flat int32 arrays the Python runtime writes and every CUDA kernel
reads, field by field. This module is the one definition of that layout; ``cuda/queue.cuh`` is
generated from it (``python -m tessera.tools.headers``; a CPU test holds the two equal), and
Python code names fields through the enums below, never by position.

``tasks``: int32 ``[num_tasks, len(Task)]``, one row per CTA, in launch order
(``tasks.launch_keys``: the heavy tasks longest first, then the rest one (batch, query head
group) at a time, longest first within each)::

    BATCH        batch index b of q/k/v/out
    Q_HEAD0      first query head of the task; the task covers heads Q_HEAD0 .. Q_HEAD0+hp-1
                 (hp = ``heads_per_task``, GQA packing), all reading kv head Q_HEAD0 // group
    Q_START      first query token of the tile
    Q_END        one past its last query token (Q_END - Q_START <= tile_rows = block_m / hp)
    SPAN_BEGIN   range [SPAN_BEGIN, SPAN_END) of rows of ``spans``
    SPAN_END
    SLOT         -1: write out (and lse) directly; >= 0: write the normalised partial output
                 (fp32) and its lse to workspace slot SLOT for the combine step
    COST         key chunks of this task (block_n keys each): the launch order's key and the
                 statistics' balance; kernels do not read it

Physical row ``r`` of a task (0 <= r < block_m) is query head ``Q_HEAD0 + r // tile_rows`` and
token ``Q_START + r % tile_rows``; it is real when that token is < Q_END.

``spans``: int32 ``[num_spans, len(Span)]``: keys [K_START, K_END) are consumed block_n at a
time from K_START (the last chunk masked at token level; a kernel variant with a wider step may
take a task of a few long spans at that width: ``tasks.wide_step_tasks``); the span applies to
query tokens [R_START, R_END) only (rows outside are masked for this span). With a ``pack_keys``
regime a task's spans are consumed end to end instead -- a chunk may hold the end of one span
and the start of the next, only the task's last chunk is partial -- and its COST counts those
chunks; such plans have one row range per task and never split.

``combine``: int32 ``[num_combine, len(Combine)]``: the rows of one split tile, whose PARTS
partials sit in slots SLOT_BEGIN .. SLOT_BEGIN+PARTS-1. Partial slots hold ``block_m`` rows of
out (fp32, ``[slot, block_m, Dv]``) and lse (fp32, ``[slot, block_m]``, natural log; -inf
where the part saw no key for that row).

The device planner (``cuda/plan.cu``) also writes ``tiles``: int32 ``[capacity, len(Tile)]``
(the physical tiles, ``mapping.PhysicalTiles`` as rows) and ``totals``: int64 ``[len(Total)]``
(the lengths it wrote; a sync-free plan's kernels read ``Total.TASKS`` on the device).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

__all__ = ["Task", "Span", "Combine", "Tile", "Total", "TaskQueue", "stack_fields", "records",
           "header_text", "HEADER_PATH"]


class Task(enum.IntEnum):
    """Columns of ``tasks``."""

    BATCH = 0
    Q_HEAD0 = 1
    Q_START = 2
    Q_END = 3
    SPAN_BEGIN = 4
    SPAN_END = 5
    SLOT = 6
    COST = 7


class Span(enum.IntEnum):
    """Columns of ``spans``."""

    K_START = 0
    K_END = 1
    R_START = 2
    R_END = 3


class Combine(enum.IntEnum):
    """Columns of ``combine``."""

    BATCH = 0
    Q_HEAD0 = 1
    Q_START = 2
    Q_END = 3
    SLOT_BEGIN = 4
    PARTS = 5


class Tile(enum.IntEnum):
    """Columns of the device planner's ``tiles`` (``mapping.PhysicalTiles``' tile arrays)."""

    MASK_BH = 0
    Q_START = 1
    Q_END = 2
    SPAN_BEGIN = 3
    SPAN_END = 4
    CHUNKS = 5


class Total(enum.IntEnum):
    """Entries of the device planner's ``totals``."""

    RUNS = 0
    SPANS = 1
    TILES = 2
    TASKS = 3
    TASK_CHUNKS = 4
    MAX_CHUNKS = 5


# The C prefix of each array's fields in cuda/queue.cuh.
_C_PREFIX = {Task: "TASK", Span: "SPAN", Combine: "COMBINE", Tile: "TILE", Total: "TOTAL"}


@dataclass
class TaskQueue:
    """The arrays a kernel reads directly (layout in the module docstring).

    ``count`` is set on the queue a sync-free plan launches (``device_planner.py``): a device
    int64 array whose first element is the number of real tasks, which only the device knows;
    ``tasks`` and ``spans`` are then buffers sized by bounds, and rows past the real ones are
    not meaningful. ``None``: the arrays are exact.
    """

    tasks: Any
    spans: Any
    combine: Any
    num_slots: int
    heads_per_task: int
    tile_rows: int
    count: Any = None

    @property
    def num_tasks(self) -> int:
        """Rows of ``tasks``: the tasks, or for a queue with a device ``count`` its capacity."""
        return int(self.tasks.shape[0])


def stack_fields(fields: type[enum.IntEnum], columns: Mapping[enum.IntEnum, Any], xp: Any) -> Any:
    """An int32 ``[n, len(fields)]`` array whose column ``f`` is ``columns[f]``: rows built by
    field name, so no caller depends on the column order."""
    if set(columns) != set(fields):
        missing = sorted(f.name for f in set(fields) - set(columns))
        raise ValueError(f"columns of {fields.__name__} missing: {missing}")
    return xp.stack([columns[f] for f in fields], axis=1).astype(np.int32)


def records(array: Any, fields: type[enum.IntEnum]) -> np.ndarray:
    """A host array of rows of ``fields`` as a numpy record array (``r["span_begin"]``,
    ``r.span_begin``), for code that walks a queue on the CPU (emulator, statistics, plots)."""
    host = np.ascontiguousarray(array.get() if hasattr(array, "get") else array, dtype=np.int64)
    dtype = np.dtype([(f.name.lower(), np.int64) for f in fields])
    return host.reshape(-1, len(fields)).view(dtype).reshape(-1).view(np.recarray)


HEADER_PATH = Path(__file__).resolve().parents[1] / "cuda" / "queue.cuh"


def header_text() -> str:
    """The text of ``cuda/queue.cuh``: one ``#define`` per field and the width of each array."""
    lines = ["// GENERATED from tessera/runtime/queue.py (python -m tessera.tools.headers); do not "
             "edit.",
             "//",
             "// The task-queue layout the Python runtime writes and the kernels read: column",
             "// indices of tasks, spans, combine jobs and the device planner's tiles and totals.",
             "#pragma once", ""]
    for fields, prefix in _C_PREFIX.items():
        for f in fields:
            lines.append(f"#define {prefix}_{f.name} {int(f)}")
        lines.append(f"#define {prefix}_FIELDS {len(fields)}")
        lines.append("")
    return "\n".join(lines)
