// The Hopper family's tiles in shared memory (forward and backward): rows of D elements cut
// into SW-byte column chunks (SW = 128 when a row's bytes are a multiple of 128, else 64),
// chunk-major ([chunk][row][SW bytes]), 16-byte pieces XOR-swizzled by the row within each 8-row
// group, each tile starting on a 1024-byte boundary -- the layout wgmma reads -- and the
// descriptors that read them, K-major (rows are the M or N dimension) or N-major (rows are the K
// dimension).
#pragma once

#include "common/tile.cuh"
#include "sm90/wgmma.cuh"

namespace {
constexpr int SW = D * ELEM_BYTES % 128 == 0 ? 128 : 64;  // swizzle span and chunk width, bytes
constexpr int PPC = SW / 16;                // 16-byte pieces per chunk row

// Byte offset of 16-byte piece `piece` (along D) of row `row` in a tile of ROWS rows. The XOR
// is the hardware's swizzle of address bits [4, 4 + log2(PPC)) by bits [7, ...), which the
// tile's 1024-byte alignment makes the same on offsets as on addresses.
template <int ROWS>
__device__ __forceinline__ u32 tile_offset(int row, int piece) {
  const u32 o = (u32)((piece / PPC) * ROWS * SW + row * SW + (piece % PPC) * 16);
  return o ^ (((o >> 7) & (PPC - 1)) << 4);
}

// wgmma shared-memory matrix descriptor, held as its two words: the low one the start address
// and the leading byte offset, the high one the stride byte offset and the swizzle mode (1:
// 128-byte, 2: 64-byte), all byte counts >> 4. A tile's descriptor is built once and each
// operand slice addressed as a byte offset from it: one integer add per wgmma on the issue path
// instead of rebuilding the fields. The add cannot carry out of the 14-bit start-address field,
// since shared addresses stay below 256 KB.
struct SmemDesc {
  u32 lo, hi;
  __device__ __forceinline__ u64 at(u32 byte_offset) const {
    return ((u64)hi << 32) | (u64)(lo + (byte_offset >> 4));
  }
};
template <int SPAN = SW>
__device__ __forceinline__ SmemDesc smem_desc(u32 addr, u32 lbo, u32 sbo) {
  constexpr u32 mode = SPAN == 128 ? 1 : 2;
  return {((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16), (sbo >> 4) | (mode << 30)};
}

// K-major operand (rows of D elements: Q or K) of a tile of ROWS rows: its descriptor, and the
// byte offset of the 16 columns of step kk. Within a chunk the step is a plain byte offset: the
// hardware applies the swizzle to the address it forms.
__device__ __forceinline__ SmemDesc k_major_desc(u32 base) { return smem_desc(base, 16, 8 * SW); }
template <int ROWS>
__device__ __forceinline__ u32 k_major_step(int kk) {
  constexpr int STEPS_PER_CHUNK = SW / 32;
  return (u32)((kk / STEPS_PER_CHUNK) * ROWS * SW + (kk % STEPS_PER_CHUNK) * 32);
}

// N-major operand (rows x D, D contiguous, read with the rows as the K dimension: V in P V, a
// chunk of K, Q or dO in the backward's products) of a tile of ROWS rows: chunks of D are LBO
// apart, groups of 8 rows SBO apart; rows 16 kk .. 16 kk + 15 start kk * 16 * SW bytes in.
template <int ROWS>
__device__ __forceinline__ SmemDesc n_major_desc(u32 base) {
  return smem_desc(base, ROWS * SW, 8 * SW);
}
__device__ __forceinline__ u32 v_step(int kk) { return (u32)(kk * 16 * SW); }

// Makes this thread's completed cp.async writes visible to the tensor cores' (async proxy)
// reads that follow the next barrier.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
}  // namespace
