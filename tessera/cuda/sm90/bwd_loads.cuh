// The Hopper backward's copies: a task's resident tiles and its chunks into the swizzled layout
// wgmma reads (layout.cuh), by cp.async from every thread (a chunk's LSE and Delta:
// common/backward.cuh).
#pragma once

#include "common/memory.cuh"
#include "sm90/layout.cuh"

namespace {
// Copy ROWS rows of D elements into the tile at shared address `tile`; row_of(r) gives row r's
// address. THREADS threads from `tid` on.
template <int ROWS, int THREADS, typename RowOf>
__device__ __forceinline__ void load_tile(u32 tile, const RowOf& row_of, int tid) {
  constexpr int CPR = D / 8;  // 16-byte pieces a row
#pragma unroll 4
  for (int i = tid; i < ROWS * CPR; i += THREADS) {
    const int r = i / CPR, p = i % CPR;
    cp_async16(tile + tile_offset<ROWS>(r, p), row_of(r) + p * 8);
  }
}
}  // namespace
