// The Hopper family's shared memory: the tiles' swizzled layout, the wgmma descriptors that read
// them, and where a ring's tiles, barriers and task-index words sit.
//
// Q_BUFS x Q (BM x D), then STAGES x {K, V} (KV_ROWS x D each: BN keys, or WIDE_BN with the wide
// step) -- with rings that for each ring in turn --, every tile in the layout wgmma reads: rows
// cut into SW-byte column chunks (SW = 128 when D is a multiple of 64, else 64), chunk-major
// ([chunk][row][SW bytes]), 16-byte pieces XOR-swizzled by the row within each 8-row group, each
// tile starting on a 1024-byte boundary; the producer variant's barriers and task-index words
// after them, a block a ring (with TMA also a 16-byte chunk word a stage). variants.smem_bytes
// mirrors the size.
#pragma once

#include "common/memory.cuh"
#include "sm90/traits.cuh"
#include "sm90/wgmma.cuh"

namespace {
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
__device__ __forceinline__ SmemDesc smem_desc(u32 addr, u32 lbo, u32 sbo) {
  constexpr u32 mode = SW == 128 ? 1 : 2;
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

// N-major operand V (keys x D, D contiguous): chunks of D are LBO apart, groups of 8 keys SBO
// apart; keys 16 kk .. 16 kk + 15 start kk * 16 * SW bytes in.
__device__ __forceinline__ SmemDesc v_desc(u32 base) {
  return smem_desc(base, KV_ROWS * SW, 8 * SW);
}
__device__ __forceinline__ u32 v_step(int kk) { return (u32)(kk * 16 * SW); }

// Where one ring's tiles and (producer variant) barriers sit: full[STAGES], empty[STAGES],
// Q full[Q_BUFS], Q empty[Q_BUFS], then four task-index words (scheduler.cuh: two published to
// the consumers with a task's Q, two the producer takes ahead for itself), and with
// STAGED_SPANS a 16-byte chunk word a stage (walks.cuh). Task n's Q sits in buffer n % Q_BUFS,
// chunk c in stage c % STAGES.
struct Ring {
  u32 q_base, stage_base;
  u32 full_bar, empty_bar, q_full_bar, q_empty_bar;
  volatile int* task_slot;
  volatile int* next_slot;
  u32 chunk_info;
  // wgmma's swizzle alignment. SMEM_ALIGNED: the launch reserved no slack for it
  // (variants.smem_bytes), which holds where the dynamic shared memory starts 1024-aligned -- as
  // it does right after the CTA's reserved 1 KB, with no static shared memory; a CTA where it
  // does not stops at once rather than overrun.
  __device__ __forceinline__ Ring(unsigned char* smem_raw, int ring) {
    const u32 smem_base = smem_addr(smem_raw);
    if (Config::SMEM_ALIGNED && (smem_base & 1023u)) __trap();
    const u32 tiles_base = (smem_base + 1023u) & ~1023u;
    q_base = tiles_base + (u32)(ring * RING_BYTES);
    stage_base = q_base + Q_BUFS * Q_BYTES;
    constexpr u32 RING_BAR_BYTES = 16 * (STAGES + Q_BUFS) + 16 + (TMA ? 16 * STAGES : 0);
    full_bar = tiles_base + RINGS * RING_BYTES + (u32)ring * RING_BAR_BYTES;
    empty_bar = full_bar + 8 * STAGES;
    q_full_bar = empty_bar + 8 * STAGES;
    q_empty_bar = q_full_bar + 8 * Q_BUFS;
    task_slot = reinterpret_cast<volatile int*>(
        smem_raw + (q_empty_bar + 8 * Q_BUFS - smem_addr(smem_raw)));
    next_slot = task_slot + 2;
    chunk_info = q_empty_bar + 8 * Q_BUFS + 16;
  }
};
}  // namespace
