// The Hopper family's loads: Q tiles and K/V chunks into a ring's buffers, by cp.async (128
// loading threads, or every thread of the plain variant) or by TMA (one producer thread, the
// tensor maps of tessera/cuda/tma.py).
#pragma once

#include "common/memory.cuh"
#include "sm90/args.cuh"
#include "sm90/smem.cuh"
#include "sm90/sync.cuh"

namespace {
// Issue the asynchronous copies of one K/V chunk (which key each row holds: Walk::Cursor).
__device__ __forceinline__ void load_kv(u32 ks, const u16* k_head, i64 k_sl, const u16* v_head,
                                        i64 v_sl, const Walk& w, const int* spans, int se,
                                        int tid) {
  typename Walk::Cursor cur(w, spans, se);
  const u32 vs = ks + K_BYTES;
  constexpr int ROW_STEP = LOADERS / CPR;
  // Rows a copy instruction covers when each takes one PPC-piece column chunk (one 128-byte line
  // at SW = 128) of a row: see below.
  constexpr int LINE_ROWS = LOADERS / PPC;
  if constexpr (PACKED && CPR > PPC && LOADERS % PPC == 0 && BN % LINE_ROWS == 0 &&
                LINE_ROWS % 8 == 0) {
    // The packed walk finds a row's key by walking the task's spans (a data-dependent loop over
    // global span fields), and its K and V addresses take 64-bit products: here PPC adjacent
    // threads share a row, each copying one piece of every column chunk of it, so a thread
    // does that for BN / LINE_ROWS rows instead of BN / ROW_STEP (4 against 8 at head dim 128),
    // and each copy instruction still reads whole lines (four rows of 128 bytes): Wan's top-k
    // cubes run 14-16% faster (H200, docs/decisions.md). Two threads a row (16 rows of 32 bytes
    // a copy instruction) ran them 22% slower. Rows LINE_ROWS apart (a multiple of 8) keep the
    // swizzle pattern: offsets step by constants. (A row of one column chunk, head dim 64,
    // takes the layout below, which is then the same.)
    // (The thread's index read anew rather than `tid`: from a loop invariant the compiler
    // hoists the row-derived offsets out of the producer's chunk loop, past its 56 registers
    // in this change's first layout; this form is the one timed.)
    const int lt = thread_index() % LOADERS, r0 = lt / PPC, p = lt % PPC;
    const u32 off0 = tile_offset<KV_ROWS>(r0, p);
#pragma unroll
    for (int it = 0; it < BN / LINE_ROWS; ++it) {
      const i64 key = cur.key(r0 + it * LINE_ROWS);
      const u16* k_row = k_head + key * k_sl + p * 8;
      const u16* v_row = v_head + key * v_sl + p * 8;
      const u32 off = off0 + (u32)(it * LINE_ROWS * SW);
      static_for<CPR / PPC>([&](auto c) {
        constexpr int C = decltype(c)::value;
        cp_async16_at<C * SW>(ks + off + (u32)(C * KV_ROWS * SW), k_row);
        cp_async16_at<C * SW>(vs + off + (u32)(C * KV_ROWS * SW), v_row);
      });
    }
  } else if constexpr (LOADERS % CPR == 0 && ROW_STEP % 8 == 0) {
    // Each thread copies the same piece of every ROW_STEP-th row: a multiple of 8 rows keeps the
    // swizzle pattern, so the shared-memory offsets step by a compile-time constant.
    const int r0 = tid / CPR, p = tid % CPR;
    const u32 off0 = tile_offset<KV_ROWS>(r0, p);
    // The packed walk's cursor (a data-dependent loop per row) unrolled less: the producer has
    // few registers (PRODUCER_REGS).
    constexpr int UNROLL = PACKED ? 4 : BN / ROW_STEP;
#pragma unroll UNROLL
    for (int it = 0; it < BN / ROW_STEP; ++it) {
      const i64 key = cur.key(r0 + it * ROW_STEP);
      const u32 off = off0 + (u32)(it * ROW_STEP * SW);
      cp_async16(ks + off, k_head + key * k_sl + p * 8);
      cp_async16(vs + off, v_head + key * v_sl + p * 8);
    }
  } else {
#pragma unroll 2
    for (int i = tid; i < BN * CPR; i += LOADERS) {
      const int r = i / CPR, p = i % CPR;
      const i64 key = cur.key(r);
      const u32 off = tile_offset<KV_ROWS>(r, p);
      cp_async16(ks + off, k_head + key * k_sl + p * 8);
      cp_async16(vs + off, v_head + key * v_sl + p * 8);
    }
  }
}

// A task's Q tile by cp.async, THREADS threads from `tid` on: physical row r holds the q row
// Task::q_row names (padding rows read a real row, never stored).
template <int THREADS>
__device__ __forceinline__ void load_q(u32 qs, const Task& task, const Operand& q, int tile_rows,
                                       int tid) {
  for (int i = tid; i < BM * CPR; i += THREADS) {
    const int r = i / CPR, p = i % CPR;
    cp_async16(qs + tile_offset<BM>(r, p), task.q_row(q, r, tile_rows) + p * 8);
  }
}

// A chunk's K and V (W keys from `key0` of kv head `kvh`, batch `b`): per SW-byte column chunk
// of the tile, W / KV_BOX boxes (the maps' boxes are SW bytes of elements by KV_BOX rows,
// swizzled as tile_offset lays them out; an int8 K's rows are one chunk, a 16-bit V's beside it
// D * 2 / SW). INT8_PV's V^T is one box of W keys by D channels; the 8-bit forms' K steps
// (`k_steps`) one of W floats.
template <int W>
__device__ __forceinline__ void tma_load_kv(u32 ks, u32 k_steps, const TmaMaps& maps, int key0,
                                            int kvh, int b, u32 bar) {
  mbar_arrive_expect_tx(bar, W * D * (ELEM_BYTES + V_ELEM_BYTES) + (INT8 ? W * 4 : 0));
#pragma unroll
  for (int p = 0; p < D * ELEM_BYTES / SW; ++p)
#pragma unroll
    for (int r = 0; r < W / KV_BOX; ++r) {
      const u32 off = (u32)(p * KV_ROWS * SW + r * KV_BOX * SW);
      tma_load_4d(ks + off, maps.k, p * SW / ELEM_BYTES, key0 + r * KV_BOX, kvh, b, bar);
    }
  if constexpr (INT8_PV) {
    tma_load_4d(ks + K_BYTES, maps.v, key0, 0, kvh, b, bar);
  } else {
#pragma unroll
    for (int p = 0; p < D * V_ELEM_BYTES / SW; ++p)
#pragma unroll
      for (int r = 0; r < W / KV_BOX; ++r) {
        const u32 off = (u32)(p * KV_ROWS * SW + r * KV_BOX * SW);
        tma_load_4d(ks + K_BYTES + off, maps.v, p * SW / V_ELEM_BYTES, key0 + r * KV_BOX, kvh,
                    b, bar);
      }
  }
  if constexpr (INT8) tma_load_4d(k_steps, maps.ks, key0, kvh, b, 0, bar);
}
// A task's Q tile: the Q map's box is SW bytes of elements by tile_rows tokens by the task's
// heads (GQA packing), which lands as tile row head * tile_rows + token -- Task::q_row's order.
// Rows past the task's end read the tokens that follow (never stored) or zeros.
__device__ __forceinline__ void tma_load_q(u32 qs, const TmaMaps& maps, int q_start, int h0,
                                           int b, u32 bar) {
  mbar_arrive_expect_tx(bar, Q_BYTES);
#pragma unroll
  for (int p = 0; p < D * ELEM_BYTES / SW; ++p)
    tma_load_4d(qs + (u32)(p * BM * SW), maps.q, p * SW / ELEM_BYTES, q_start, h0, b, bar);
}
}  // namespace
