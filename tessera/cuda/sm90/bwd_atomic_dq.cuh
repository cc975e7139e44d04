// The Hopper dK/dV kernel's dQ by atomics (Config::ATOMIC_DQ; sm90/bwd_dkdv.cu): the warpgroups
// write their rows of dS^T (the chunk's BN query columns for the tile's keys) to shared memory,
// multiply them, read as dS (queries as M), by K's rows (read N-major), and add the partial dQ
// (float32) to `dq_sums` through a float32 tile in shared memory that one thread adds with a
// bulk reduce, issued once the next chunk's CTA barrier has seen every thread's stores (every
// thread adding its own values by vector reductions ran 1.12-1.27x slower: docs/decisions.md).
// bwd_rows.cu's bsa_bwd_dq_convert scales and converts the sums once every task has run. Five
// matrix products a chunk instead of the two-pass backward's seven, at the price of float32
// atomics (the sum's order varies between runs).
#pragma once

#include "sm90/bwd_mma.cuh"

namespace {
constexpr int DQ_N = DQ_COLUMN_SPLIT ? D / WGS : D;  // a warpgroup's dQ columns
constexpr int DQ_KEYS = DQ_COLUMN_SPLIT ? BM : 64;   // the keys its partial sums
static_assert(!Config::ATOMIC_DQ || !DQ_COLUMN_SPLIT || (WGS == 2 && SW == 128),
              "one swizzle chunk a warpgroup (head dim 128: 128-row tasks)");

// dS^T's fragments (the A fragments fragments() made: key rows g and g + 8 of the warp's 16,
// query columns 16 kk + 2 t (+1) and + 8) into rows of the tile (BM keys of BN queries, the
// swizzled layout of layout.cuh), which the dQ product reads M-major.
__device__ __forceinline__ void store_score_gradients(u32 tile, const u32 (&w)[BN / 16][4],
                                                      int warp, int g, int t) {
  const int r0 = warp * 16 + g;
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // columns 16 kk + 8 half + 2 t
      const int piece = 2 * kk + half;
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(tile + tile_offset<BM>(r0, piece) + 4 * t),
                   "r"(w[kk][2 * half]) : "memory");
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(tile + tile_offset<BM>(r0 + 8, piece) + 4 * t),
                   "r"(w[kk][2 * half + 1]) : "memory");
    }
  }
}

// Makes the stored dS^T rows visible to the dQ product's reads: a fence into the async proxy,
// then the threads whose rows it reads (the CTA, or the warpgroup) wait for each other on named
// barrier 1 (the CTA) or 1 + wg (the CTA's __syncthreads uses 0).
__device__ __forceinline__ void score_gradients_stored(int wg) {
  fence_async_smem();
  if constexpr (DQ_COLUMN_SPLIT)
    asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
  else
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
}

// Warpgroup wg's partial dQ = dS (read M-major from the dS^T tile: BN query rows by DQ_KEYS
// keys) times those keys' rows of K (read N-major, its DQ_N columns): DQ_KEYS / 16 wgmma,
// committed as one group.
__device__ __forceinline__ void issue_scores_times_keys(float (&acc)[DQ_N / 8][4],
                                                        const Tiles& tiles, int wg) {
  const u32 keys = DQ_COLUMN_SPLIT ? 0u : (u32)(wg * 64 * SW);       // its first key row
  const u32 columns = DQ_COLUMN_SPLIT ? (u32)(wg * BM * SW) : 0u;    // its swizzle chunk
  const SmemDesc a = n_major_desc<BM>(tiles.ds + keys);
  const SmemDesc b = n_major_desc<BM>(tiles.a + keys + columns);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < DQ_KEYS / 16; ++kk)
    Wgmma<DQ_N>::tt(&acc[0][0], a.at(v_step(kk)), b.at(v_step(kk)), kk > 0);
  wgmma_commit();
}

// The float32 tile warpgroup wg's partial dQ of chunk c goes through (set c % DQ_BUFFERS),
// and whether thread `tid` adds it to the sums (one thread a tile).
__device__ __forceinline__ u32 partial_dq_tile(const Tiles& tiles, int wg, int c) {
  return tiles.dq + (u32)((c % DQ_BUFFERS) * DQ_SET_BYTES) +
         (DQ_COLUMN_SPLIT ? 0u : (u32)(wg * DQ_TILE_BYTES));
}
__device__ __forceinline__ bool adds_partial_dq(int tid) {
  return DQ_COLUMN_SPLIT ? tid == 0 : tid % 128 == 0;
}

// Warpgroup wg's partial dQ into its float32 tile: row r holds query token first + r,
// laid out as that token's row of the sums (dq_sum_column), so that one bulk reduce adds the
// chunk's rows. Two wavefronts a warp's 256 bytes (the permutation spreads its eight rows).
__device__ __forceinline__ void store_partial_dq(u32 tile, const float (&acc)[DQ_N / 8][4],
                                                 int first, int wg, int warp_in_wg, int g,
                                                 int t) {
  const int r0 = warp_in_wg * 16 + g;
  const int c0 = (DQ_COLUMN_SPLIT ? wg * DQ_N : 0) + 2 * t;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + 8 * half;
    const u32 row = tile + (u32)(r * D * 4);
#pragma unroll
    for (int j = 0; j < DQ_N / 8; ++j)
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(
                       row + 4u * (u32)dq_sum_column(first + r, c0 + 8 * j)),
                   "f"(acc[j][2 * half]), "f"(acc[j][2 * half + 1]) : "memory");
  }
}

// (The adding thread) Adds the tile's first `rows` rows to the sums from `dst` on (rows
// D floats apart in both), as one bulk group: its stores must be visible to the async proxy
// (fence_async_smem, then a barrier) before, and the tile is rewritten only after
// partial_dq_read.
__device__ __forceinline__ void reduce_partial_dq(float* dst, u32 tile, int rows) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               ::"l"(dst), "r"(tile), "r"(rows * D * 4) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// (The adding thread) Waits until its bulk reduces but the newest PENDING have read their
// tiles: with two sets, the one that read the set the chunk is about to rewrite. (On sm_90a
// this and the wait for completion compile to the same instruction, one DEPBAR on the thread's
// scoreboard: it likely waits for the reduce's adds into L2 too -- what two sets hide.)
template <int PENDING>
__device__ __forceinline__ void partial_dq_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(PENDING) : "memory");
}
// (The adding thread) Waits until its bulk reduces have completed.
__device__ __forceinline__ void partial_dq_done() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
}  // namespace
