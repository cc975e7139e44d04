// Portable block-sparse attention backward, dQ (sm_80 and newer): the query-major queue
// (tessera/runtime/backward.py), one CTA a tile of query rows (packed heads as the forward's), Q
// and dO resident, walking its key spans BN keys at a time: S = Q K^T and dP = dO V^T, P from
// the LSE, dS = P (dP - Delta), dQ += dS K, accumulated in registers and written once (one task
// a row: no atomics). Launched after bwd_rows.cu's Delta and the dK/dV kernel
// (tessera/backward_launch.py).
//
// Roles: traits.cuh (the variant's constants), loads.cuh (the K/V chunk pipeline), bwd_loads.cuh
// (resident tiles), bwd_mma.cuh (the matrix steps, shared memory), common/backward.cuh (P, dS,
// the gradient store); the main loop is this file's.
#include "variant.cuh"
#include "sm80/bwd_mma.cuh"

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_bwd_dq_sm80(TESSERA_BWD_PARAMS) {
  extern __shared__ __align__(16) u16 smem[];
  if ((int)blockIdx.x >= task_total(task_count, num_tasks)) return;
  const Operand q{q_ptr, q_sb, q_sh, q_sl}, dout{do_ptr, do_sb, do_sh, do_sl};
  const Task task(tasks, blockIdx.x, k_ptr, k_sb, k_sh, v_ptr, v_sb, v_sh, group);
  const int b = task.b, q_start = task.q_start, q_end = task.q_end;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  u16* q_tile = smem;
  u16* do_tile = smem + BM * LDS;
  u16* stages = smem + RESIDENT;
  const int se = task.span_end;
  Walk load_walk;
  load_walk.open(spans, task.span_begin, se);
  Walk walk = load_walk;

  load_tile(q_tile, [&](int r) { return task.q_row(q, r, tile_rows); }, tid);
  load_tile(do_tile, [&](int r) { return task.q_row(dout, r, tile_rows); }, tid);
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (load_walk.more(se)) {
      load_kv(stages + st * STAGE, task.k_head, k_sl, task.v_head, v_sl, load_walk, tid);
      load_walk.next(spans, se);
    }
    cp_async_commit();
  }

  const WarpRows rows(task, warp, g, tile_rows, lse_ptr, delta_ptr, num_q_heads, seq_q);
  const int head = rows.head, tok_base = rows.tok_base, t0 = rows.t0, t1 = rows.t1;
  const bool tile_real = tok_base < q_end;

  float dq[D / 8][4];
  zero(dq);
  const Fragments f(warp, lane);
  const u32 stage_base = smem_addr(stages);

  for (int c = 0; walk.more(se); ++c) {
    if (load_walk.more(se)) {
      load_kv(stages + ((c + STAGES - 1) % STAGES) * STAGE, task.k_head, k_sl, task.v_head,
              v_sl, load_walk, tid);
      load_walk.next(spans, se);
    }
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    const u32 ks = stage_base + (u32)((c % STAGES) * STAGE * 2);
    const u32 vs = ks + KV_TILE * 2;
    const int lo = max(walk.row_lo(spans), q_start);
    const int hi = min(walk.row_hi(spans), q_end);
    if (tile_real && tok_base < hi && tok_base + 16 > lo) {  // warp-uniform
      float s[BN / 8][4], dp[BN / 8][4];
      rows_times_chunk(s, smem_addr(q_tile), ks, f);        // S = Q K^T
      probabilities(s, walk.kpos, walk.k1, t0 >= lo && t0 < hi, t1 >= lo && t1 < hi, t,
                    scale_log2, rows.lse);
      rows_times_chunk(dp, smem_addr(do_tile), vs, f);      // dP = dO V^T
      score_gradients(s, dp, rows.delta);
      add_weights_times_chunk(dq, s, ks, f);                // dQ += dS K
    }
    __syncthreads();  // everyone is done with this stage before it is refilled
    walk.next(spans, se);
  }
  cp_async_wait<0>();
  if (tile_real)
    store_gradient_rows<D>(dq_ptr + b * dq_sb + head * dq_sh, dq_sl, dq, t0, q_end, t, scale);
}

