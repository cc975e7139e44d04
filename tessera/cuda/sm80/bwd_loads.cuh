// The portable backward's copies beside the chunk pipeline (loads.cuh): a task's resident tiles
// (a chunk's LSE and Delta: common/backward.cuh).
#pragma once

#include "common/memory.cuh"
#include "sm80/traits.cuh"

namespace {
// Copy BM rows of D elements into the padded tile at `tile`; row_of(r) gives row r's address.
template <typename RowOf>
__device__ __forceinline__ void load_tile(u16* tile, const RowOf& row_of, int tid) {
#pragma unroll 1
  for (int i = tid; i < BM * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR;
    cp_async16(smem_addr(tile + r * LDS + c * 8), row_of(r) + c * 8);
  }
}
}  // namespace
