"""CPU tests of task organization (tessera.runtime.tasks): the task-queue contract documented in
``tessera/runtime/tasks.py``, split limits, wide-step tasks and launch order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from tessera.runtime.queue import Combine, Task, records
from tessera.runtime.tasks import (
    last_wave_parts,
    launch_keys,
    wide_step_tasks,
    whole_span_tasks,
)
from tests.runtime.runtime_helpers import (
    ALIGN_REGIMES,
    BASE_REGIMES,
    COMBINE_REGIMES,
    EXTRA_REGIMES,
    SPLIT_REGIMES,
    brute_useful_pairs,
    cases,
    check_queue,
)


@settings(max_examples=1200, deadline=None)
@given(cases(BASE_REGIMES + EXTRA_REGIMES + SPLIT_REGIMES + COMBINE_REGIMES + ALIGN_REGIMES))
def test_task_queue_contract_and_stats(case):
    plan, mask, q, k, v, scale = case
    check_queue(plan)
    t = plan.tiles
    assert np.all(np.asarray(t.q1) - np.asarray(t.q0) <= t.tile_rows)
    s = plan.stats()
    useful = brute_useful_pairs(mask, plan.batch, plan.num_q_heads, plan.num_kv_heads)
    assert s.useful_pairs == useful
    assert s.computed_pairs >= s.useful_pairs
    assert s.num_groups <= s.num_tiles
    # Tasks, counted from the tiles and the heads that read them (not from the queue): every
    # tile once per (batch, first query head) reading its mask head, plus the extra parts of
    # each split one (a combine job's parts beyond the first).
    hp = plan.heads_per_task
    head_of = mask.head_index(plan.num_q_heads, plan.num_kv_heads)
    batch_of = mask.batch_index(plan.batch)
    readers = np.zeros(mask.batch_heads[0] * mask.batch_heads[1], dtype=np.int64)
    for bi in range(plan.batch):
        for h0 in range(0, plan.num_q_heads, hp):
            readers[batch_of[bi] * mask.batch_heads[1] + head_of[h0]] += 1
    jobs = records(plan.queue.combine, Combine)
    want_tasks = int(readers[np.asarray(t.mask_bh)].sum() + (jobs.parts - 1).sum())
    assert s.num_tasks == want_tasks
    # Split jobs, counted from the tasks that write a partial: each job owns its parts' slots.
    assert s.num_split_jobs == len(jobs) and int(jobs.parts.sum()) == int(
        (records(plan.queue.tasks, Task).slot >= 0).sum())


def test_split_limit_counts_the_tasks_in_flight():
    """The split rule: above split_ratio x the mean and min_split_chunks, and above the average
    work per task slot when the number of slots is known."""
    from tessera.runtime.tasks import split_limit

    assert split_limit(4.0, 16, 100, 1000, 0) == 40  # 4 x the mean of 10
    assert split_limit(4.0, 64, 100, 1000, 0) == 64
    assert split_limit(4.0, 16, 100, 1000, 10) == 100  # 10 slots: 100 chunks each
    assert split_limit(4.0, 16, 100, 1001, 10) == 101  # rounded up
    assert split_limit(4.0, 16, 100, 1000, 1000) == 40  # many slots: the ratio rule decides
    assert split_limit(2.0, 1, 0, 0, 132) == 1


def test_wide_step_tasks_are_those_of_few_long_spans():
    """The host mirror of sm90/walks.cuh's wide_task: at most four spans, and 192-key steps may
    pad at most 1/32 more keys than 128-key steps."""
    lengths = [[17776], [192], [384], [128], [1024], [576, 1152], [384] * 5, [], [100, 92]]
    spans, tasks = [], []
    for task in lengths:
        tasks.append([0, 0, 0, 128, len(spans), len(spans) + len(task), -1, 0])
        spans += [[1000, 1000 + n, 0, 1 << 30] for n in task]
    got = wide_step_tasks(np.array(tasks, np.int32), np.array(spans, np.int32).reshape(-1, 4),
                          128, 192)
    # 17776: 17856 against 17792 keys; 192: 192 against 256; 1024: 1152 against 1024;
    # 576 + 1152: 1728 against 1792; five spans: too many; two short spans: 384 against 256
    assert got.tolist() == [True, True, True, False, False, True, False, True, False]


def test_whole_span_tasks_are_one_span_over_all_their_rows():
    """The host mirror of sm90/walks.cuh's whole_span_task: exactly one span, whose row
    restriction covers the task's query rows [q_start, q_end)."""
    spans = np.array([[0, 512, 0, 1 << 30],      # unrestricted
                      [0, 512, 100, 228],        # exactly the second task's rows
                      [0, 512, 101, 228],        # one row short
                      [512, 640, 0, 1 << 30]], np.int32)
    tasks = np.array([[0, 0, 0, 128, 0, 1, -1, 4],      # one unrestricted span
                      [0, 0, 100, 228, 1, 2, -1, 4],    # restricted to its own rows: whole
                      [0, 0, 100, 228, 2, 3, -1, 4],    # a row excluded
                      [0, 0, 0, 128, 0, 2, -1, 5],      # two spans
                      [0, 0, 0, 128, 3, 3, -1, 0],      # none
                      [0, 0, 0, 128, 3, 4, -1, 1]], np.int32)
    assert whole_span_tasks(tasks, spans).tolist() == [True, True, False, False, False, True]
    assert whole_span_tasks(tasks[4:5], spans[:0]).tolist() == [False]


def test_launch_order_puts_heavy_tasks_first_then_one_head_at_a_time():
    """launch_keys: tasks over 1/HEAVY_SHARE of a slot's share of the chunks or HEAVY_MEAN
    times the mean first, longest first; the rest grouped by assignment in order, longest first
    within one; ties keep their place (stable)."""
    from tessera.runtime.tasks import HEAVY_MEAN, HEAVY_SHARE

    cost = np.array([3, 50, 4, 3, 9, 2, 60, 4])
    group = np.array([1, 0, 0, 1, 1, 0, 1, 0])
    total = cost.sum()  # 135; with 2 slots a task is heavy above 135 / (2 x 8) = 8.4 chunks
    assert HEAVY_SHARE == 8
    order = np.argsort(launch_keys(cost, group, 2), kind="stable")
    assert list(order) == [6, 1, 4, 2, 7, 5, 0, 3]  # 60, 50, 9 | head 0: 4, 4, 2 | head 1: 3, 3
    # One slot (or unknown): only a task over an eighth of all the work is heavy.
    order = np.argsort(launch_keys(cost, group, 0), kind="stable")
    assert list(order) == [6, 1, 2, 7, 5, 4, 0, 3]
    assert cost[6] * 8 > total and cost[4] * 8 <= total
    # Many tasks a slot: a task over HEAVY_MEAN times the mean is heavy though far below a
    # slot's share (the text rows of video models).
    cost = np.ones(40, dtype=np.int64)
    cost[[7, 30]] = [3, 5]  # mean 1.15; a slot's share / 8 = 5.75
    group = np.arange(40) % 2
    order = np.argsort(launch_keys(cost, group, 1), kind="stable")
    assert list(order[:2]) == [30, 7] and HEAVY_MEAN == 2
    light = [i for i in range(0, 40, 2) if i != 30] + [i for i in range(1, 40, 2) if i != 7]
    assert list(order[2:]) == light  # one group, then the other, in their order


def test_may_split_rule():
    """Never for never-split ratios; planning for a GPU, not once the shape guarantees 16 tasks
    per slot; a portable plan (no slots known) keeps the split rule."""
    from tessera.runtime.tasks import may_split, tasks_lower_bound

    assert tasks_lower_bound(2, 12, 1, 32760, 128) == 2 * 12 * 256
    assert tasks_lower_bound(1, 8, 4, 1000, 32) == 2 * 32
    assert not may_split(1e9, 10, 0)
    assert may_split(4.0, 10**6, 0)
    assert may_split(4.0, 16 * 132 - 1, 132)
    assert not may_split(4.0, 16 * 132, 132)


def test_last_wave_parts_fill_the_last_wave_with_non_empty_parts():
    """The last wave's tasks are cut into as many parts as fill it (each of at least the least
    chunks), never into empty parts, and nothing is cut where the waves are full, where more
    than half the last wave is busy, where parts would be too short, or where the cut promises
    less than FILL_MIN_GAIN of the queue's time."""
    assert last_wave_parts(3072, 132, 256, 16) == (36, 3)  # Wan-1.3B dense: 23 waves + 36
    assert last_wave_parts(3036, 132, 253, 16) == (0, 1)  # 23 full waves
    assert last_wave_parts(3036 + 100, 132, 256, 16) == (0, 1)  # 100 of 132 busy: one part
    assert last_wave_parts(40, 132, 64, 16) == (40, 3)  # one part-full wave: every task cut
    assert last_wave_parts(40, 132, 31, 16) == (0, 1)  # parts would be under 16 chunks
    # The promised share of the queue's time, (1 - 1 / parts) / (full waves + 1), from 2% up:
    assert last_wave_parts(24 * 132 + 60, 132, 256, 16) == (60, 2)  # 0.5 / 25
    assert last_wave_parts(25 * 132 + 60, 132, 256, 16) == (0, 1)  # 0.5 / 26
    assert last_wave_parts(23640, 132, 591, 16) == (0, 1)  # Wan-14B dense: (10 / 11) / 180
    assert last_wave_parts(44664, 264, 186, 16) == (0, 1)  # HunyuanVideo top-k 64: 170 waves
    for bad in ((0, 132, 256), (100, 0, 256), (100, 132, 0)):
        assert last_wave_parts(*bad, 16) == (0, 1)
    for chunks in range(1, 300):
        for slots, tasks in ((132, 10), (132, 40), (7, 9), (16, 1)):
            tail, parts = last_wave_parts(tasks, slots, chunks, 2)
            if tail:
                step = -(-chunks // parts)
                assert parts >= 2 and (parts - 1) * step < chunks  # the last part not empty
                assert tail * parts <= slots and chunks // parts >= 2
