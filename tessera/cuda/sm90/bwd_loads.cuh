// The Hopper backward's copies: a task's resident tiles and its chunks into the swizzled layout
// wgmma reads (layout.cuh), by cp.async from every thread, or a chunk by TMA from one (a chunk's
// LSE and Delta: common/backward.cuh).
#pragma once

#include "common/memory.cuh"
#include "sm90/barriers.cuh"
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

// One chunk tile of BN rows by TMA: rows row0 .. row0 + BN - 1 of head `head`, batch `b` of the
// operand `map` describes (boxes of SW / 2 elements by BN rows, swizzled as tile_offset lays
// them out; rows past the tensor's end read zeros), completing on `bar`.
template <int BN_>
__device__ __forceinline__ void tma_load_chunk(u32 tile, const void* map, int row0, int head,
                                               int b, u32 bar) {
#pragma unroll
  for (int p = 0; p < D * 2 / SW; ++p)
    tma_load_4d(tile + (u32)(p * BN_ * SW), map, p * SW / 2, row0, head, b, bar);
}

// Zeroes rows `from` .. ROWS - 1 of the TILES tiles from `tile` on, APART bytes apart (every
// thread of the CTA, NT_ of them).
template <int ROWS, int NT_, int TILES, int APART>
__device__ __forceinline__ void zero_rows(u32 tile, int from, int tid) {
  constexpr int CPR = D / 8;  // 16-byte pieces a row
  constexpr int STEP = NT_ / CPR;  // rows zeroed at once; a thread keeps its piece of each
#pragma unroll 1
  for (int r = tid < STEP * CPR ? from + tid / CPR : ROWS; r < ROWS; r += STEP) {
    const u32 at = tile + tile_offset<ROWS>(r, tid % CPR);
#pragma unroll
    for (int t = 0; t < TILES; ++t)
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(at + (u32)(t * APART)),
                   "r"(0) : "memory");
  }
}
}  // namespace
