// The backward pass's arguments and its per-chunk math on scores held in mma.sync's m16n8
// accumulator layout: P recomputed from the forward's LSE, dS = P * (dP - Delta), and the
// gradient rows' store.
//
// The recomputation backward (no P kept from the forward): for a row i and a key j its mask
// selects, P_ij = exp(scale * q_i.k_j - lse_i), dP_ij = dO_i.v_j, dS_ij = P_ij (dP_ij - Delta_i)
// with Delta_i = dO_i.O_i; then dQ = scale * dS K, dK = scale * dS^T Q, dV = P^T dO.
#pragma once

#include "common/element.cuh"
#include "common/memory.cuh"
#include "common/task.cuh"

// Tensor maps (driver-encoded CUtensorMap, 128 bytes each) of the two operands a backward
// chunk holds -- dK/dV's Q and dO, dQ's K and V -- as tessera/cuda/tma.py's chunk_maps encodes
// them: boxes of BN tokens of one head.
struct alignas(128) ChunkMaps {
  unsigned long long a[16], b[16];
};

// Every backward kernel takes the same arguments (tessera/backward_launch.py passes them): the
// task queue of its direction, q/k/v/dO as [B, H, L, D] strides in elements, the forward's LSE
// (natural log) and Delta as contiguous float32 [B, Hq, Lq], the gradients' strides, the query
// heads and tokens (a key-major task's query positions are head-in-group * seq_q + token), rows
// per tile of one head, query heads per kv head, the softmax scale and its product with
// log2(e), the queue's rows and the number of tasks: `task_count` on the device for a queue the
// device planner wrote (the grid covers the queue's rows; see task_total), else null; and
// `dq_sums`, float32 [B, Hq, Lq, D] zeroed (each row's columns permuted: dq_sum_column), where a
// dK/dV kernel sums dQ by atomics (else null);
// and the tensor maps of the two operands a chunk holds, for the variants that copy chunks by
// TMA (zeros for the others).
#define TESSERA_BWD_PARAMS                                                                   \
  const int *__restrict__ tasks, const int *__restrict__ spans, const u16 *q_ptr, i64 q_sb,  \
      i64 q_sh, i64 q_sl, const u16 *k_ptr, i64 k_sb, i64 k_sh, i64 k_sl, const u16 *v_ptr,   \
      i64 v_sb, i64 v_sh, i64 v_sl, const u16 *do_ptr, i64 do_sb, i64 do_sh, i64 do_sl,       \
      const float *__restrict__ lse_ptr, const float *__restrict__ delta_ptr, u16 *dq_ptr,    \
      i64 dq_sb, i64 dq_sh, i64 dq_sl, u16 *dk_ptr, i64 dk_sb, i64 dk_sh, i64 dk_sl,          \
      u16 *dv_ptr, i64 dv_sb, i64 dv_sh, i64 dv_sl, int num_q_heads, int seq_q,               \
      int tile_rows, int group, float scale, float scale_log2, int num_tasks,                \
      const i64 *__restrict__ task_count, float *__restrict__ dq_sums,                      \
      const __grid_constant__ ChunkMaps chunk_maps

constexpr float LOG2E = 1.4426950408889634f;

// Where column c of query row `tok` (its token) sits in its row of `dq_sums`: at c ^ 8 (tok & 3),
// the row's 32-byte pieces permuted within each 128 bytes, so that a warp's stores of eight
// rows of a partial dQ into shared memory (rows a multiple of 128 bytes apart, the layout a
// bulk reduce copies) fall on distinct banks pairwise; bsa_bwd_dq_convert reads it back.
__device__ __forceinline__ int dq_sum_column(int tok, int c) { return c ^ ((tok & 3) << 3); }

// The value of accumulator element e of key octet nt (both compile-time after unrolling):
// per row of the thread's two (g, g + 8) -- the dQ direction's LSE and Delta, whose rows are
// query rows -- or per column the thread holds -- the dK/dV direction's, whose columns are.
struct RowValues {
  float r0, r1;
  __device__ __forceinline__ float at(int, int e) const { return e < 2 ? r0 : r1; }
};
template <int NB>
struct ColumnValues {
  float v[NB][2];  // columns 8 * nt + 2 * t and + 1
  __device__ __forceinline__ float at(int nt, int e) const { return v[nt][e & 1]; }
};

// Scores s (NB key octets; columns col0 + 8 * nt + 2 * t (+1)) to P in place: exp2 of the
// scaled score less the column's or row's LSE (log2 units, `lse`), 0 for columns at or past
// col_end and rows whose ok flag is false.
template <int NB, typename Lse>
__device__ __forceinline__ void probabilities(float (&s)[NB][4], int col0, int col_end, bool ok0,
                                              bool ok1, int t, float scale_log2, const Lse& lse) {
#pragma unroll
  for (int nt = 0; nt < NB; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = nt * 8 + 2 * t + (e & 1);
      const bool ok = col0 + c < col_end && (e < 2 ? ok0 : ok1);
      s[nt][e] = ok ? fast_exp2(fmaf(s[nt][e], scale_log2, -lse.at(nt, e))) : 0.f;
    }
}

// dS = P * (dP - Delta) in place of P. A pair outside the mask keeps 0 whatever dP holds (its
// dP may read values no selected pair reads).
template <int NB, typename Delta>
__device__ __forceinline__ void score_gradients(float (&p)[NB][4], const float (&dp)[NB][4],
                                                const Delta& delta) {
#pragma unroll
  for (int nt = 0; nt < NB; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[nt][e] = p[nt][e] != 0.f ? p[nt][e] * (dp[nt][e] - delta.at(nt, e)) : 0.f;
    }
}

// Store the thread's two gradient rows (tokens tok0, tok0 + 8 of the tensor whose (batch, head)
// row 0 is `rows`), times `factor`; rows at or past `end` are padding.
template <int D_>
__device__ __forceinline__ void store_gradient_rows(u16* rows, i64 sl,
                                                    const float (&acc)[D_ / 8][4], int tok0,
                                                    int end, int t, float factor) {
  const int tok1 = tok0 + 8;
#pragma unroll
  for (int nt = 0; nt < D_ / 8; ++nt) {
    const int col = nt * 8 + 2 * t;
    if (tok0 < end)
      *reinterpret_cast<u32*>(rows + tok0 * sl + col) =
          pack2(acc[nt][0] * factor, acc[nt][1] * factor);
    if (tok1 < end)
      *reinterpret_cast<u32*>(rows + tok1 * sl + col) =
          pack2(acc[nt][2] * factor, acc[nt][3] * factor);
  }
}

// The LSE and Delta of a walk's current chunk of BN_ query positions (float32 [B, Hq, Lq] rows
// of the task's first query head, `lse_rows` and `delta_rows`: a key-major position counts the
// head in the group times seq_q) into shared `lse` and `delta` (cp.async, committed with the
// chunk's tiles); columns past the span end repeat its last row, as the chunk's copies of Q and
// dO do. Threads tid < 2 * BN_ copy one value each.
template <int BN_, typename Walk_>
__device__ __forceinline__ void load_row_values(u32 lse, u32 delta, const float* lse_rows,
                                                const float* delta_rows, const Walk_& w,
                                                int tid) {
  if (tid < BN_) {
    cp_async4(lse + 4 * tid, lse_rows + w.row_key(tid));
  } else if (tid < 2 * BN_) {
    cp_async4(delta + 4 * (tid - BN_), delta_rows + w.row_key(tid - BN_));
  }
}

// A chunk's per-column values at the columns the thread holds (8 nt + 2 t, + 1) times `factor`,
// from a shared array load_row_values filled: its LSE in log2 units (factor LOG2E), its Delta.
template <int NB>
__device__ __forceinline__ ColumnValues<NB> column_values(const float* values, int t,
                                                          float factor) {
  ColumnValues<NB> out;
#pragma unroll
  for (int nt = 0; nt < NB; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) out.v[nt][e] = values[nt * 8 + 2 * t + e] * factor;
  return out;
}

// The warp's 16 rows of a query-major task (one head, 16 consecutive tokens: tile_rows is a
// multiple of 16), the thread's two of them (g and g + 8) and their LSE (log2 units) and
// Delta.
struct WarpRows {
  int head, tok_base, t0, t1;
  RowValues lse, delta;
  __device__ __forceinline__ WarpRows(const Task& task, int warp, int g, int tile_rows,
                                      const float* lse_ptr, const float* delta_ptr,
                                      int num_q_heads, int seq_q) {
    head = task.h0 + warp * 16 / tile_rows;
    tok_base = task.q_start + warp * 16 % tile_rows;
    t0 = tok_base + g;
    t1 = t0 + 8;
    const float* lse_row = lse_ptr + ((i64)task.b * num_q_heads + head) * seq_q;
    const float* delta_row = delta_ptr + ((i64)task.b * num_q_heads + head) * seq_q;
    const int end = task.q_end;
    lse = {t0 < end ? lse_row[t0] * LOG2E : 0.f, t1 < end ? lse_row[t1] * LOG2E : 0.f};
    delta = {t0 < end ? delta_row[t0] : 0.f, t1 < end ? delta_row[t1] : 0.f};
  }
};
