// Hopper block-sparse attention backward, dQ (sm_90a): the query-major queue
// (tessera/runtime/backward.py), Q and dO resident, key spans BN keys at a time: S = Q K^T and
// dP = dO V^T, dS = P (dP - Delta), dQ += dS K (dS from registers, K read N-major); dQ written
// once (one task a row). Same queues, arguments and launch order as sm80/bwd_dq.cu.
//
// Roles: as bwd_dkdv.cu's.
#include "variant.cuh"
#include "sm90/bwd_mma.cuh"

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_bwd_dq_sm90(TESSERA_BWD_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if ((int)blockIdx.x >= task_total(task_count, num_tasks)) return;
  const Operand q{q_ptr, q_sb, q_sh, q_sl}, dout{do_ptr, do_sb, do_sh, do_sl};
  const Task task(tasks, blockIdx.x, k_ptr, k_sb, k_sh, v_ptr, v_sb, v_sh, group);
  const int b = task.b, q_start = task.q_start, q_end = task.q_end, se = task.span_end;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const Tiles tiles(smem_raw);
  Walk load_walk;
  load_walk.open(spans, task.span_begin, se);
  Walk walk = load_walk;
  init_stage_barriers(tiles, tid);

  load_tile<BM, NT>(tiles.a, [&](int r) { return task.q_row(q, r, tile_rows); }, tid);
  load_tile<BM, NT>(tiles.b, [&](int r) { return task.q_row(dout, r, tile_rows); }, tid);
  const auto load_chunk = [&](int st) {
    if constexpr (TMA) {
      if (tid == 0) {
        const u32 bar = tiles.full(st);
        mbar_arrive_expect_tx(bar, STAGE_BYTES);
        tma_load_chunk<BN>(tiles.chunk(st), chunk_maps.a, load_walk.kpos, task.h0 / group, b,
                           bar);
        tma_load_chunk<BN>(tiles.chunk(st) + CHUNK_BYTES, chunk_maps.b, load_walk.kpos,
                           task.h0 / group, b, bar);
      }
    } else {
      load_tile<BN, NT>(tiles.chunk(st),
                        [&](int r) { return task.k_head + load_walk.row_key(r) * k_sl; }, tid);
      load_tile<BN, NT>(tiles.chunk(st) + CHUNK_BYTES,
                        [&](int r) { return task.v_head + load_walk.row_key(r) * v_sl; }, tid);
    }
  };
  if (load_walk.more(se)) {
    load_chunk(0);
    load_walk.next(spans, se);
  }
  cp_async_commit();

  const WarpRows rows(task, warp, g, tile_rows, lse_ptr, delta_ptr, num_q_heads, seq_q);
  const int head = rows.head, tok_base = rows.tok_base, t0 = rows.t0, t1 = rows.t1;
  const SmemDesc q_desc = k_major_desc(tiles.a + (u32)(wg * 64 * SW));
  const SmemDesc do_desc = k_major_desc(tiles.b + (u32)(wg * 64 * SW));
  float dq[D / 8][4];
  zero(dq);
  u32 w[BN / 16][4];  // dS's fragments, read by a chunk's dQ left in flight into the next chunk
  const bool walked = walk.more(se);

  for (int c = 0; walk.more(se); ++c) {
    // Chunk c has landed, its K rows past the span zeroed where TMA copied them (dQ multiplies
    // them by zero weights; V's only meet masked scores).
    wait_for_chunk<1>(tiles, c, walk.k1 - walk.kpos, tid);
    if (load_walk.more(se)) {
      load_chunk((c + 1) % STAGES);
      load_walk.next(spans, se);
    }
    cp_async_commit();
    const u32 ks = tiles.chunk(c % STAGES), vs = ks + CHUNK_BYTES;
    const int lo = max(walk.row_lo(spans), q_start);
    const int hi = min(walk.row_hi(spans), q_end);
    float s[BN / 8][4], dp[BN / 8][4];
    wgmma_fence();
    issue_rows_times_chunk(s, q_desc, ks);    // S = Q K^T
    issue_rows_times_chunk(dp, do_desc, vs);  // dP = dO V^T
    wgmma_wait<1>();  // the previous chunk's dQ, and S
    wgmma_hold<D / 2>(&dq[0][0]);
    wgmma_hold<BN / 2>(&s[0][0]);
    probabilities(s, walk.kpos, walk.k1, t0 >= lo && t0 < hi, t1 >= lo && t1 < hi, t,
                  scale_log2, rows.lse);
    wgmma_wait<0>();
    wgmma_hold<BN / 2>(&dp[0][0]);
    score_gradients(s, dp, rows.delta);
    fragments(w, s);
    issue_weights_times_chunk(dq, w, ks);     // dQ += dS K
    if constexpr (!LAST_IN_FLIGHT) {  // (two stages) the next copy overwrites this chunk's
      wgmma_wait<0>();
      wgmma_hold<D / 2>(&dq[0][0]);
    }
    walk.next(spans, se);
  }
  if (walked) {  // the last chunk's dQ (none in flight for a task with no spans)
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&dq[0][0]);
  }
  cp_async_wait<0>();
  if (tok_base < q_end)
    store_gradient_rows<D>(dq_ptr + b * dq_sb + head * dq_sh, dq_sl, dq, t0, q_end, t, scale);
}
