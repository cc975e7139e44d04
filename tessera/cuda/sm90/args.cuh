// The kernel's arguments (TESSERA_BSA_PARAMS, common/task.cuh) as one value the role functions
// take, built once at the top of the kernel.
#pragma once

#include "common/epilogue.cuh"
#include "common/task.cuh"

namespace {
struct Args {
  const int* tasks;
  const int* spans;
  Operand q;
  const u16* k_ptr;
  i64 k_sb, k_sh, k_sl;
  const u16* v_ptr;
  i64 v_sb, v_sh, v_sl;
  Output out;
  int tile_rows, group;
  float scale_log2;
  int max_tasks;
  const i64* task_count;
  int* task_counter;
  const TmaMaps& maps;
  const float* q_step;  // the 8-bit form's steps (TmaMaps says what they are)
  const float* v_step;
  // Read again where it is used (a cached load) rather than kept live across the register
  // reallocation, where ptxas would spill it.
  __device__ __forceinline__ int num_tasks() const { return task_total(task_count, max_tasks); }
  __device__ __forceinline__ Task task(int index) const {
    return Task(tasks, index, k_ptr, k_sb, k_sh, v_ptr, v_sb, v_sh, group);
  }
};
}  // namespace
