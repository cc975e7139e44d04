// The Hopper forward's shared memory: where a ring's tiles, barriers and task-index words sit
// (the tiles' swizzled layout and the wgmma descriptors that read them: layout.cuh).
//
// Q_BUFS x Q (BM x D), then STAGES x {K, V} (KV_ROWS x D each: BN keys, or WIDE_BN with the wide
// step; the 8-bit form's V is V^T, D x KV_ROWS, and its K steps follow the stages, a float a key)
// -- with rings that for each ring in turn --, every tile in the layout wgmma reads: rows
// cut into SW-byte column chunks (SW = 128 when D is a multiple of 64, else 64), chunk-major
// ([chunk][row][SW bytes]), 16-byte pieces XOR-swizzled by the row within each 8-row group, each
// tile starting on a 1024-byte boundary; the producer variant's barriers and task-index words
// after them, a block a ring (with TMA also a 16-byte chunk word a stage). variants.smem_bytes
// mirrors the size.
#pragma once

#include "common/memory.cuh"
#include "sm90/layout.cuh"
#include "sm90/traits.cuh"

namespace {
// V, N-major (keys x D): a K/V stage's tile of KV_ROWS rows (layout.cuh's n_major_desc).
__device__ __forceinline__ SmemDesc v_desc(u32 base) { return n_major_desc<KV_ROWS>(base); }
// The 8-bit form's V^T (D x KV_ROWS, K-major: the keys are P V's k): rows of SW_V bytes, one
// swizzle chunk; a 32-key step is 32 bytes along them.
__device__ __forceinline__ SmemDesc v8_desc(u32 base) {
  return smem_desc<SW_V>(base, 16, 8 * SW_V);
}

// Where one ring's tiles and (producer variant) barriers sit: full[STAGES], empty[STAGES],
// Q full[Q_BUFS], Q empty[Q_BUFS], then four task-index words (scheduler.cuh: two published to
// the consumers with a task's Q, two the producer takes ahead for itself), and with
// STAGED_SPANS a 16-byte chunk word a stage (walks.cuh). Task n's Q sits in buffer n % Q_BUFS,
// chunk c in stage c % STAGES.
struct Ring {
  u32 q_base, stage_base;
  u32 k_steps;  // the 8-bit form's K steps: stage st's K_STEP_BYTES st x K_STEP_BYTES in
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
    k_steps = stage_base + STAGES * STAGE_BYTES;
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
