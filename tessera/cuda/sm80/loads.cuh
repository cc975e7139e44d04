// The portable family's K/V copies: one chunk of a task's keys into a pipeline stage.
#pragma once

#include "common/memory.cuh"
#include "sm80/traits.cuh"

namespace {
// Issue the asynchronous copies of one K/V chunk into a stage (rows past the span end: see
// ChunkWalk::row_key).
// k_head/v_head point at (batch, kv head) row 0; the row stride is in elements.
__device__ __forceinline__ void load_kv(u16* stage, const u16* k_head, i64 k_sl,
                                        const u16* v_head, i64 v_sl, const Walk& w,
                                        int tid) {
  const u32 ks = smem_addr(stage), vs = smem_addr(stage + KV_TILE);
  if constexpr (NT % CPR == 0) {
    // Each thread copies the same 16-byte column of every (NT / CPR)-th row: the row step and
    // the shared-memory offsets are compile-time constants.
    constexpr int ROW_STEP = NT / CPR;
    const int r0 = tid / CPR, c = tid % CPR;
    const u32 off0 = (u32)(r0 * LDS + c * 8) * 2u;
    if (w.kpos + BN <= w.k1) {
      // A whole chunk (the common case): its rows are consecutive keys, so each row's address
      // is one 64-bit add from the last instead of a clamp and two 64-bit multiplies.
      const u16* kr = k_head + (i64)(w.kpos + r0) * k_sl + c * 8;
      const u16* vr = v_head + (i64)(w.kpos + r0) * v_sl + c * 8;
#pragma unroll
      for (int j = 0; j < BN / ROW_STEP; ++j) {
        const u32 off = off0 + (u32)(j * ROW_STEP * LDS * 2);
        cp_async16(ks + off, kr);
        cp_async16(vs + off, vr);
        kr += ROW_STEP * k_sl;
        vr += ROW_STEP * v_sl;
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < BN / ROW_STEP; ++j) {
      const i64 key = w.row_key(r0 + j * ROW_STEP);
      const u32 off = off0 + (u32)(j * ROW_STEP * LDS * 2);
      cp_async16(ks + off, k_head + key * k_sl + c * 8);
      cp_async16(vs + off, v_head + key * v_sl + c * 8);
    }
  } else {
    // Not unrolled: unrolling hoists one address per iteration into registers the MMA loop needs.
#pragma unroll 1
    for (int i = tid; i < BN * CPR; i += NT) {
      const int r = i / CPR, c = i % CPR;
      const i64 key = w.row_key(r);
      const u32 off = (u32)(r * LDS + c * 8) * 2u;
      cp_async16(ks + off, k_head + key * k_sl + c * 8);
      cp_async16(vs + off, v_head + key * v_sl + c * 8);
    }
  }
}
}  // namespace
