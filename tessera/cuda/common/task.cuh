// What every attention kernel is given: its arguments, the strided operands and the task a CTA
// runs. The task-queue layout is defined in tessera/runtime/queue.py; queue.cuh is generated from
// it.
#pragma once

#include "common/types.cuh"
#include "queue.cuh"

// ---- strided [B, H, L, D] operand -------------------------------------------------------------
// Strides are in elements and 64-bit, so [B,H,L,D] and [B,L,H,D] views both pass without copies
// and offsets past 2^31 elements are safe. The last dimension is contiguous (checked in Python).
struct Operand {
  const u16* ptr;
  i64 sb, sh, sl;
  __device__ __forceinline__ const u16* row(int b, int h, int l) const {
    return ptr + b * sb + h * sh + l * sl;
  }
};

// ---- kernel arguments --------------------------------------------------------------------------
// Every attention family takes the same arguments (tessera/api.py passes them): the task queue,
// q/k/v and the output as [B, H, L, D] strides in elements, lse, the split-KV workspace, rows per
// tile of one head, query heads per kv head, the softmax scale times log2(e), the number of
// tasks -- max_tasks, or *task_count when that is not null (a sync-free plan: the device planner
// wrote the count, the host only knows a bound and sized the grid by it) -- and the counter
// persistent kernels take tasks from (null for one-task CTAs): zero at the launch, and zero
// again when the launch ends (the kernel resets it: sm90/scheduler.cuh).
// Tensor maps (driver-encoded CUtensorMap, 128 bytes each) of q, k and v for kernels that copy
// by TMA (sm90 variants with Config::TMA), and of the K steps for the 8-bit form (INT8); zeros
// for the others. A __grid_constant__ kernel parameter: the copies read them where the launch
// put them (param space), no device copy. The 8-bit form's Q and V steps (float32 [B, Hq, Lq]
// and [B, Hkv, D]) come as q_step and v_step (null for the others), its q and k as int8 [B, H,
// L, D] and its v as V^T, int8 [B, Hkv, D, L_pad] (v_sl: L_pad), all from the pre-pass
// (tessera/quantize_launch.py).
struct alignas(128) TmaMaps {
  unsigned long long q[16], k[16], v[16], ks[16];
};

#define TESSERA_BSA_PARAMS                                                        \
  const int *__restrict__ tasks, const int *__restrict__ spans, const u16 *q_ptr,  \
      i64 q_sb, i64 q_sh, i64 q_sl, const u16 *k_ptr, i64 k_sb, i64 k_sh, i64 k_sl, \
      const u16 *v_ptr, i64 v_sb, i64 v_sh, i64 v_sl, u16 *o_ptr, i64 o_sb, i64 o_sh, \
      i64 o_sl, float *lse_ptr, i64 lse_sb, i64 lse_sh, float *part_o,              \
      float *part_lse, int tile_rows, int group, float scale_log2, int max_tasks,     \
      const i64 *task_count, int *task_counter,                                  \
      const __grid_constant__ TmaMaps tma_maps, const float *q_step, const float *v_step

// The number of tasks (see TESSERA_BSA_PARAMS): a device count is clamped to the queue's rows,
// so no count makes a kernel read past them.
__device__ __forceinline__ int task_total(const i64* task_count, int max_tasks) {
  return task_count != nullptr ? (int)min(max(*task_count, (i64)0), (i64)max_tasks) : max_tasks;
}

// Task `index` of the queue (layout in tessera/runtime/tasks.py) and where its keys live.
struct Task {
  int b, h0, q_start, q_end, slot, span_begin, span_end;
  const u16* k_head;  // (batch, kv head) row 0 of k and v
  const u16* v_head;
  __device__ __forceinline__ Task(const int* tasks, int index, const u16* k_ptr, i64 k_sb,
                                  i64 k_sh, const u16* v_ptr, i64 v_sb, i64 v_sh, int group) {
    const int* t = tasks + (i64)index * TASK_FIELDS;
    b = t[TASK_BATCH];
    h0 = t[TASK_Q_HEAD0];
    q_start = t[TASK_Q_START];
    q_end = t[TASK_Q_END];
    slot = t[TASK_SLOT];
    span_begin = t[TASK_SPAN_BEGIN];
    span_end = t[TASK_SPAN_END];
    const int kvh = h0 / group;
    k_head = k_ptr + b * k_sb + kvh * k_sh;
    v_head = v_ptr + b * v_sb + kvh * v_sh;
  }
  // The q row behind physical row r of the tile; padding rows read a real row (never stored).
  __device__ __forceinline__ const u16* q_row(const Operand& q, int r, int tile_rows) const {
    const int tok = q_start + r % tile_rows;
    return q.row(b, h0 + r / tile_rows, tok < q_end ? tok : q_start);
  }
};
