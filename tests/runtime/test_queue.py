"""The task-queue contract (tessera.runtime.queue): the generated CUDA header matches it, the
kernels name only fields it defines, Python code names fields instead of positions, and the
planners' queues mean what the fields say."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.runtime.queue import (Combine, Span, Task, Tile, Total, records, stack_fields)
from tessera.tools.headers import generated_headers

PACKAGE = Path(tessera.__file__).resolve().parent
ENUMS = (Task, Span, Combine, Tile, Total)


def test_generated_headers_are_committed_as_generated():
    for path, text in generated_headers().items():
        assert path.read_text() == text, f"{path.name} is stale: python -m tessera.tools.headers"


def test_fields_are_dense_and_the_header_defines_each():
    header = (PACKAGE / "cuda" / "queue.cuh").read_text()
    defined = dict(re.findall(r"#define (\w+) (\d+)", header))
    for fields in ENUMS:
        assert [int(f) for f in fields] == list(range(len(fields)))
        prefix = {"Task": "TASK", "Span": "SPAN", "Combine": "COMBINE", "Tile": "TILE",
                  "Total": "TOTAL"}[fields.__name__]
        assert defined[f"{prefix}_FIELDS"] == str(len(fields))
        for f in fields:
            assert defined[f"{prefix}_{f.name}"] == str(int(f))


def test_kernels_name_only_defined_fields():
    header = (PACKAGE / "cuda" / "queue.cuh").read_text()
    defined = set(re.findall(r"#define (\w+) ", header))
    used = set()
    for src in (PACKAGE / "cuda").rglob("*.cu*"):
        if src.name != "queue.cuh":
            used |= set(re.findall(r"\b(?:TASK|SPAN|COMBINE|TILE|TOTAL)_[A-Z0-9_]+\b",
                                   src.read_text()))
    assert used and used <= defined, sorted(used - defined)


def test_python_names_queue_columns():
    """No queue array is indexed by a bare column number outside queue.py."""
    pattern = re.compile(r"\b(tasks|spans|tiles|combine|totals|jobs)\[:, *\d")
    hits = [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py")
            if p.name != "queue.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_stack_fields_and_records():
    cols = {f: np.arange(3) * 10 + int(f) for f in Span}
    a = stack_fields(Span, cols, np)
    assert a.dtype == np.int32 and a.shape == (3, len(Span))
    r = records(a, Span)
    np.testing.assert_array_equal(r.r_start, [2, 12, 22])
    np.testing.assert_array_equal(r["k_end"], [1, 11, 21])
    with pytest.raises(ValueError, match="missing: \\['R_END'\\]"):
        stack_fields(Span, {f: cols[f] for f in Span if f is not Span.R_END}, np)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_host_queue_covers_exactly_the_mask(seed):
    """Read through the field names, the queue of a random mask (variable blocks, GQA, a
    split-prone regime) covers every (batch, head, query token) once per key it attends and no
    other key -- counted independently of the planner from the dense block matrix."""
    rng = np.random.default_rng(seed)
    qb = np.concatenate([[0], np.cumsum(rng.integers(16, 160, 7))])
    kb = np.concatenate([[0], np.cumsum(rng.integers(16, 160, 9))])
    dense = rng.random((2, 7, 9)) < 0.4
    mask = tessera.BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=kb)
    regime = tessera.Regime(block_m=64, num_warps=4, split_ratio=1.0, min_split_chunks=1)
    p = tessera.plan(mask, num_q_heads=4, num_kv_heads=2, head_dim=64, regime=regime)
    tasks, spans = records(p.queue.tasks, Task), records(p.queue.spans, Span)
    lq, lk = int(qb[-1]), int(kb[-1])
    seen = np.zeros((1, 4, lq, lk), dtype=np.int64)
    hp, tr = p.queue.heads_per_task, p.queue.tile_rows
    for t in tasks:
        for h in range(t.q_head0, t.q_head0 + hp):
            for s in spans[t.span_begin:t.span_end]:
                lo, hi = max(t.q_start, s.r_start), min(t.q_end, s.r_end)
                if hi > lo:
                    seen[t.batch, h, lo:hi, s.k_start:s.k_end] += 1
        assert t.q_end - t.q_start <= tr
    head_of = mask.head_index(4, 2)
    qblock = np.searchsorted(qb, np.arange(lq), side="right") - 1
    kblock = np.searchsorted(kb, np.arange(lk), side="right") - 1
    want = dense[head_of][:, qblock][:, :, kblock][None].astype(np.int64)
    np.testing.assert_array_equal(seen, want)
    jobs = records(p.queue.combine, Combine)
    split = tasks.slot >= 0
    assert len(jobs) > 0 and hp == 2  # the split and GQA packing paths are exercised
    assert int(split.sum()) == int(jobs.parts.sum())
    assert sorted(tasks.slot[split]) == list(range(p.queue.num_slots))


def _rows_left_out(p: "tessera.Plan") -> int:
    """Spans of ``p``'s queue that apply to fewer rows than their task has."""
    tasks, spans = records(p.queue.tasks, Task), records(p.queue.spans, Span)
    return sum(int(((s.r_start > t.q_start) | (s.r_end < t.q_end)).sum())
               for t in tasks for s in [spans[t.span_begin:t.span_end]])


@pytest.mark.parametrize("seed", range(3))
def test_regimes_that_restrict_no_rows_plan_no_restricted_span(seed):
    """A regime whose ``restricts_rows`` is False (combine threshold 0, no aligned tiles) plans
    no span that leaves out any of its task's rows -- what the kernels built without the
    non-finite check (TESSERA_GUARD 0) rest on -- on variable blocks (query blocks ending inside
    tiles, neighbours with the same keys) and on a band of 64-token blocks. Aligned tiles on the
    first and restricted merges on the second do leave rows out."""
    rng = np.random.default_rng(seed)
    qb = np.concatenate([[0], np.cumsum(rng.integers(16, 300, 24))])
    dense = rng.random((4, 24, 24)) < 0.3
    dense[:, 1::2] = dense[:, ::2]  # neighbours with the same keys: merged runs
    variable = tessera.BlockMask.from_dense(dense, q_bounds=qb, kv_bounds=qb)
    i, j = np.arange(16)[:, None], np.arange(16)[None, :]
    band = tessera.BlockMask.from_dense(
        np.broadcast_to((j >= i - 2) & (j <= i + 1), (4, 16, 16)), block_size=64)
    plain = [tessera.Regime(block_m=bm, num_warps=4, combine_threshold=0.0, split_ratio=sr,
                            min_split_chunks=1) for bm in (64, 128) for sr in (1.0, 1e9)]
    plain += [tessera.Regime(family="sm90", block_m=bm, block_n=bn, num_warps=bm // 16 + 4,
                             stages=3, combine_threshold=0.0, **form)
              for bm, bn in ((64, 64), (128, 128)) for form in ({}, {"pack_keys": True})]

    def left_out(mask, regime, hq=8):  # 8 query heads on 4 kv heads: GQA-packed tasks
        p = tessera.plan(mask, num_q_heads=hq, num_kv_heads=4, head_dim=64, regime=regime)
        return _rows_left_out(p)

    for regime in plain:
        assert not regime.restricts_rows
        for mask in (variable, band):
            assert left_out(mask, regime) == 0 and left_out(mask, regime, 4) == 0, regime.name
    aligned = tessera.Regime(block_m=128, num_warps=4, combine_threshold=0.0, align_tiles=True)
    merged = tessera.Regime(block_m=128, num_warps=4, combine_threshold=0.3)
    assert aligned.restricts_rows and merged.restricts_rows
    # (one query head a kv head: tiles of 128 tokens, which 64-token blocks merge to fill)
    assert left_out(variable, aligned) > 0 and left_out(band, merged, 4) > 0
