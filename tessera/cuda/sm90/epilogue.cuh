// The Hopper family's guard against non-finite values (common/guard.cuh) and its epilogue: a
// partial TMA chunk's V tail zeroed, a restricted chunk's V checked, the excluded rows'
// accumulators kept across its product, and the task's rows stored.
#pragma once

#include "common/epilogue.cuh"
#include "common/guard.cuh"
#include "sm90/args.cuh"
#include "sm90/smem.cuh"
#include "sm90/sync.cuh"

namespace {
// A TMA chunk copies W consecutive keys: rows past the span's end hold keys that follow it,
// which no row of the task selects. Their P is 0, but 0 x Inf is NaN, so an Inf in such a V row
// would reach rows whose reference output is finite: warpgroup 0 zeroes those rows before any
// P V reads the stage (cp.async copies repeat the span's last key there instead, a selected
// one). The issue turns order the other warpgroups' wgmma after warpgroup 0's (a barrier chain);
// a lone warpgroup syncs its own threads. Only partial chunks pay (`valid` is uniform).
template <int W>
__device__ __forceinline__ void zero_v_tail(u32 vs, int valid, int wg, int ring) {
  if constexpr (TMA && !INT8_PV) {  // (integer V holds no Inf)
    if (valid >= W) return;
    if (wg == 0) {
      const int t = thread_index() % 128;
#pragma unroll 1
      for (int i = t; i < (W - valid) * V_CPR; i += 128) {
        const u32 at = vs + tile_offset<KV_ROWS>(valid + i / V_CPR, i % V_CPR);
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(at), "r"(0u) : "memory");
      }
      fence_async_smem();  // the zeros, for the tensor cores' reads
    }
    if constexpr (WGS == 1) named_bar_sync(TAIL_BAR + ring, 128);
  }
}

// A copy of one 16-row tile's accumulators in local memory (volatile: never promoted to the
// registers the accumulators already fill), kept by the rows a chunk excludes across its P V.
template <int NB>
struct GuardedRows {
  volatile float v[NB][4];
  __device__ __forceinline__ void keep(const float (&acc)[NB][4]) {
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      v[i][0] = acc[i][0]; v[i][1] = acc[i][1];
      v[i][2] = acc[i][2]; v[i][3] = acc[i][3];
    }
  }
  // Sets the rows in `rows` to zero through the copy (a constant would have ptxas keep
  // another set of registers for the accumulators).
  __device__ __forceinline__ void restore_zeros(float (&acc)[NB][4], int rows) {
#pragma unroll
    for (int i = 0; i < NB; ++i) v[i][0] = v[i][1] = v[i][2] = v[i][3] = 0.f;
    restore(acc, rows);
  }
  // Takes back the rows in `rows` (excluded_rows' bits).
  __device__ __forceinline__ void restore(float (&acc)[NB][4], int rows) const {
    if (rows & 1) {
#pragma unroll
      for (int i = 0; i < NB; ++i) { acc[i][0] = v[i][0]; acc[i][1] = v[i][1]; }
    }
    if (rows & 2) {
#pragma unroll
      for (int i = 0; i < NB; ++i) { acc[i][2] = v[i][2]; acc[i][3] = v[i][3]; }
    }
  }
};

// Whether V rows [0, valid) of a stage hold an Inf or NaN: one answer for the warpgroup (a
// barrier reduction over its 128 threads, on a barrier of its own). Rows past `valid` are
// left alone: zero_v_tail may be writing them.
template <int W>
__device__ __forceinline__ bool stage_v_non_finite(u32 vs, int valid, int bar) {
  const int t = thread_index() % 128;
  const int n = (valid < W ? valid : W) * V_CPR;
  u32 bad = 0;
#pragma unroll 1
  for (int i = t; i < n; i += 128) {
    const u32 at = vs + tile_offset<KV_ROWS>(i / V_CPR, i % V_CPR);
#pragma unroll
    for (int w = 0; w < 4; ++w) bad |= non_finite_word(at + 4 * w);
  }
  u32 any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 q, %1, 0;\n bar.red.or.pred p, %2, 128, q;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(any) : "r"(bad), "r"(bar) : "memory");
  return any != 0;
}

// The 8-bit form: O's columns times V's steps (one a channel of the task's kv head; the V^T
// operand's rows are channels, v_sl apart, so its row index is the step's).
__device__ __forceinline__ void scale_by_v_steps(const Args& a, const Task& task,
                                                 float (&o)[D / 8][4]) {
  const int t = thread_index() % 4;
  const float* steps = a.v_step + (task.b * a.v_sb + task.h0 / a.group * a.v_sh) / a.v_sl;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    const float2 st = *reinterpret_cast<const float2*>(steps + 8 * i + 2 * t);
    o[i][0] *= st.x; o[i][1] *= st.y;
    o[i][2] *= st.x; o[i][3] *= st.y;
  }
}

// Every warp runs the epilogue (store_rows writes real rows only): a branch on whether the
// warp's rows are real would put the accumulators on a divergent path before the next task's
// wgmma, which ptxas answers by serializing them (C7520). The thread's row coordinates are
// derived again from a fresh read of its index: kept live across the task's loop, ptxas
// spilled them in the variant with two step widths. (% CONSUMERS: the thread's place in its
// ring's task)
__device__ __forceinline__ void store_task(const Args& a, const Task& task,
                                           const float (&o)[D / 8][4], const float (&m)[2],
                                           const float (&l)[2]) {
  const int e_tid = thread_index() % CONSUMERS, e_warp = e_tid / 32, e_g = e_tid % 32 / 4;
  const int e_row = e_warp * 16 % a.tile_rows + e_g;
  store_rows<D>(a.out, o, m, l, task.b, task.h0 + e_warp * 16 / a.tile_rows,
                task.q_start + e_row, task.q_end, e_warp * 16 + e_g, BM, task.slot, e_tid % 4);
}
}  // namespace
