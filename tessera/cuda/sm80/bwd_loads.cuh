// The portable backward's copies beside the K/V chunk pipeline (loads.cuh): a task's resident
// tiles, and the LSE and Delta values of a chunk's query rows.
#pragma once

#include "common/memory.cuh"
#include "sm80/traits.cuh"

namespace {
// 4-byte asynchronous global->shared copy (the chunk's per-row floats).
__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}

// Copy BM rows of D elements into the padded tile at `tile`; row_of(r) gives row r's address.
template <typename RowOf>
__device__ __forceinline__ void load_tile(u16* tile, const RowOf& row_of, int tid) {
#pragma unroll 1
  for (int i = tid; i < BM * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR;
    cp_async16(smem_addr(tile + r * LDS + c * 8), row_of(r) + c * 8);
  }
}

// The LSE and Delta of the current chunk's BN query positions (float32 [B, Hq, Lq] rows of the
// task's first query head, `lse_rows` and `delta_rows`: a key-major position counts the head
// in the group times seq_q) into `lse` and `delta`; columns past the span end repeat its last
// row, as the chunk's copies of Q and dO do.
template <typename Walk_>
__device__ __forceinline__ void load_row_values(float* lse, float* delta, const float* lse_rows,
                                                const float* delta_rows, const Walk_& w,
                                                int tid) {
  static_assert(NT >= 2 * BN, "one thread a value");
  if (tid < BN) {
    cp_async4(smem_addr(lse + tid), lse_rows + w.row_key(tid));
  } else if (tid < 2 * BN) {
    cp_async4(smem_addr(delta + tid - BN), delta_rows + w.row_key(tid - BN));
  }
}
}  // namespace
