// Portable block-sparse attention backward, dK and dV (sm_80 and newer): the key-major queue
// (tessera/runtime/backward.py), one CTA a key tile of a kv head, its K and V rows resident,
// walking the query spans of every query head of the group that select it, BN query rows at a
// time: S^T = K Q^T, P^T from the LSE, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - Delta),
// dK += dS^T Q; dK and dV accumulate in registers and are written once (one task a row).
//
// Roles: as bwd_dq.cu's, and common/backward.cuh's copies of a chunk's LSE and Delta.
#include "variant.cuh"
#include "sm80/bwd_mma.cuh"

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_bwd_dkdv_sm80(TESSERA_BWD_PARAMS) {
  extern __shared__ __align__(16) u16 smem[];
  if ((int)blockIdx.x >= task_total(task_count, num_tasks)) return;
  // A key-major task: rows are keys [Q_START, Q_END) of kv head Q_HEAD0 / group; its spans are
  // query positions (head in group * seq_q + token) restricted to key rows [R_START, R_END).
  const int* tk = tasks + (i64)blockIdx.x * TASK_FIELDS;
  const int b = tk[TASK_BATCH], h0 = tk[TASK_Q_HEAD0];
  const int key_start = tk[TASK_Q_START], key_end = tk[TASK_Q_END];
  const int se = tk[TASK_SPAN_END];
  const int kvh = h0 / group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  u16* k_tile = smem;
  u16* v_tile = smem + BM * LDS;
  u16* stages = smem + RESIDENT;
  float* values = reinterpret_cast<float*>(smem + RESIDENT + STAGES * STAGE);
  const u16* k_rows = k_ptr + b * k_sb + kvh * k_sh;
  const u16* v_rows = v_ptr + b * v_sb + kvh * v_sh;
  // Row 0 of head h0's Q, dO, LSE and Delta; head h0 + i's rows are a position offset of
  // i * seq_q further (the chunk's Q and dO bases below, the LSE's and Delta's by layout).
  const u16* q_rows = q_ptr + b * q_sb + h0 * q_sh;
  const u16* do_rows = do_ptr + b * do_sb + h0 * do_sh;
  const float* lse_rows = lse_ptr + ((i64)b * num_q_heads + h0) * seq_q;
  const float* delta_rows = delta_ptr + ((i64)b * num_q_heads + h0) * seq_q;
  Walk load_walk;
  load_walk.open(spans, tk[TASK_SPAN_BEGIN], se);
  Walk walk = load_walk;

  const auto key_row = [&](int r) { return min(key_start + r, key_end - 1); };
  load_tile(k_tile, [&](int r) { return k_rows + key_row(r) * k_sl; }, tid);
  load_tile(v_tile, [&](int r) { return v_rows + key_row(r) * v_sl; }, tid);
  // A chunk's Q and dO rows: the walk's positions are head-in-group * seq_q + token, so the
  // base moves back by that many rows of the head's stride.
  const auto load_chunk = [&](int st) {
    const int hl = load_walk.kpos / seq_q;
    const i64 back = (i64)hl * seq_q;
    load_kv(stages + st * STAGE, q_rows + hl * q_sh - back * q_sl, q_sl,
            do_rows + hl * do_sh - back * do_sl, do_sl, load_walk, tid);
    const u32 vals = smem_addr(values + st * 2 * BN);
    load_row_values<BN>(vals, vals + 4 * BN, lse_rows, delta_rows, load_walk, tid);
  };
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (load_walk.more(se)) {
      load_chunk(st);
      load_walk.next(spans, se);
    }
    cp_async_commit();
  }

  const int key_base = key_start + warp * 16;
  const bool tile_real = key_base < key_end;
  const int k0 = key_base + g, k1 = k0 + 8;
  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  const Fragments f(warp, lane);
  const u32 stage_base = smem_addr(stages);

  for (int c = 0; walk.more(se); ++c) {
    if (load_walk.more(se)) {
      load_chunk((c + STAGES - 1) % STAGES);
      load_walk.next(spans, se);
    }
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    const int st = c % STAGES;
    const u32 qs = stage_base + (u32)(st * STAGE * 2);
    const u32 dos = qs + KV_TILE * 2;
    const float* lse_cols = values + st * 2 * BN;
    const int lo = max(walk.row_lo(spans), key_start);
    const int hi = min(walk.row_hi(spans), key_end);
    if (tile_real && key_base < hi && key_base + 16 > lo) {  // warp-uniform
      // The chunk's LSE in log2 units, each thread's columns (its P's and dS's).
      const ColumnValues<BN / 8> lse2 = column_values<BN / 8>(lse_cols, t, LOG2E);
      const ColumnValues<BN / 8> delta = column_values<BN / 8>(lse_cols + BN, t, 1.f);
      float s[BN / 8][4], dp[BN / 8][4];
      rows_times_chunk(s, smem_addr(k_tile), qs, f);   // S^T = K Q^T
      probabilities(s, walk.kpos, walk.k1, k0 >= lo && k0 < hi, k1 >= lo && k1 < hi, t,
                    scale_log2, lse2);
      add_weights_times_chunk(dv, s, dos, f);          // dV += P^T dO
      rows_times_chunk(dp, smem_addr(v_tile), dos, f); // dP^T = V dO^T
      score_gradients(s, dp, delta);
      add_weights_times_chunk(dk, s, qs, f);           // dK += dS^T Q
    }
    __syncthreads();
    walk.next(spans, se);
  }
  cp_async_wait<0>();
  if (tile_real) {
    store_gradient_rows<D>(dk_ptr + b * dk_sb + kvh * dk_sh, dk_sl, dk, k0, key_end, t, scale);
    store_gradient_rows<D>(dv_ptr + b * dv_sb + kvh * dv_sh, dv_sl, dv, k0, key_end, t, 1.f);
  }
}
