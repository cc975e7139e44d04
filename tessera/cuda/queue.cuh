// GENERATED from tessera/runtime/queue.py (python -m tessera.tools.headers); do not edit.
//
// The task-queue layout the Python runtime writes and the kernels read: column
// indices of tasks, spans, combine jobs and the device planner's tiles and totals.
#pragma once

#define TASK_BATCH 0
#define TASK_Q_HEAD0 1
#define TASK_Q_START 2
#define TASK_Q_END 3
#define TASK_SPAN_BEGIN 4
#define TASK_SPAN_END 5
#define TASK_SLOT 6
#define TASK_COST 7
#define TASK_FIELDS 8

#define SPAN_K_START 0
#define SPAN_K_END 1
#define SPAN_R_START 2
#define SPAN_R_END 3
#define SPAN_FIELDS 4

#define COMBINE_BATCH 0
#define COMBINE_Q_HEAD0 1
#define COMBINE_Q_START 2
#define COMBINE_Q_END 3
#define COMBINE_SLOT_BEGIN 4
#define COMBINE_PARTS 5
#define COMBINE_FIELDS 6

#define TILE_MASK_BH 0
#define TILE_Q_START 1
#define TILE_Q_END 2
#define TILE_SPAN_BEGIN 3
#define TILE_SPAN_END 4
#define TILE_CHUNKS 5
#define TILE_FIELDS 6

#define TOTAL_RUNS 0
#define TOTAL_SPANS 1
#define TOTAL_TILES 2
#define TOTAL_TASKS 3
#define TOTAL_TASK_CHUNKS 4
#define TOTAL_MAX_CHUNKS 5
#define TOTAL_FIELDS 6
