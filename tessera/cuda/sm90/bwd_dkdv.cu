// Hopper block-sparse attention backward, dK and dV (sm_90a): the key-major queue
// (tessera/runtime/backward.py), a CTA holding BM keys' K and V (64 a warpgroup) and walking the
// query spans of every query head of the kv head's group, BN query rows at a time:
// S^T = K Q^T and dP^T = V dO^T (K-major operands), P^T from the LSE, dV += P^T dO,
// dS^T = P^T (dP^T - Delta), dK += dS^T Q (P^T and dS^T from registers, dO and Q read N-major);
// dK and dV written once (one task a row). Same queues, arguments and launch order as the
// portable backward (sm80/bwd_dkdv.cu). With Config::ATOMIC_DQ it also sums dQ = dS K into
// float32 by atomics (bwd_atomic_dq.cuh), and no dQ kernel runs: a chunk's partial dQ is stored
// to shared memory in the chunk and added by one bulk reduce after the next chunk's CTA barrier
// (or the loop's last barrier).
//
// Roles: bwd_mma.cuh (the products, tiles), bwd_atomic_dq.cuh (dQ by atomics), bwd_loads.cuh
// (copies into the swizzled layout), layout.cuh (the layout, descriptors), common/backward.cuh
// (P, dS, the chunk's LSE and Delta, the gradient store); the main loop is this file's.
#include "variant.cuh"
#include "sm90/bwd_atomic_dq.cuh"

namespace {
// dS^T's fragments in registers of their own, so that dK += dS^T Q is issued while dV += P^T dO
// still reads P^T's; at head dim 128 the second set takes the kernel past 255 registers, and
// dK waits for dV instead.
constexpr bool DS_FRAGMENTS_OWN = D < 128;
// With dQ by atomics at head dim 128, dK is issued before the partial dQ and both are waited
// for in the chunk: held in flight, dK's fragments beside the partial spill (255 registers) --
// except with chunks copied by TMA (254 registers).
constexpr bool DQ_AFTER_DK = D == 128 && !TMA;
}  // namespace

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_bwd_dkdv_sm90(TESSERA_BWD_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if ((int)blockIdx.x >= task_total(task_count, num_tasks)) return;
  // A key-major task (sm80/bwd_dkdv.cu says what its fields hold).
  const int* tk = tasks + (i64)blockIdx.x * TASK_FIELDS;
  const int b = tk[TASK_BATCH], h0 = tk[TASK_Q_HEAD0];
  const int key_start = tk[TASK_Q_START], key_end = tk[TASK_Q_END];
  const int se = tk[TASK_SPAN_END];
  const int kvh = h0 / group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);  // warp-uniform: kept in uniform regs
  const Tiles tiles(smem_raw);
  const float* values = reinterpret_cast<const float*>(smem_raw + (tiles.values -
                                                                   smem_addr(smem_raw)));
  const u16* k_rows = k_ptr + b * k_sb + kvh * k_sh;
  const u16* v_rows = v_ptr + b * v_sb + kvh * v_sh;
  const u16* q_rows = q_ptr + b * q_sb + h0 * q_sh;
  const u16* do_rows = do_ptr + b * do_sb + h0 * do_sh;
  const float* lse_rows = lse_ptr + ((i64)b * num_q_heads + h0) * seq_q;
  const float* delta_rows = delta_ptr + ((i64)b * num_q_heads + h0) * seq_q;
  Walk load_walk;
  load_walk.open(spans, tk[TASK_SPAN_BEGIN], se);
  Walk walk = load_walk;
  init_stage_barriers(tiles, tid);

  const auto key_row = [&](int r) { return min(key_start + r, key_end - 1); };
  load_tile<BM, NT>(tiles.a, [&](int r) { return k_rows + key_row(r) * k_sl; }, tid);
  load_tile<BM, NT>(tiles.b, [&](int r) { return v_rows + key_row(r) * v_sl; }, tid);
  // A chunk's Q and dO rows: positions are head-in-group * seq_q + token (see sm80/bwd_dkdv.cu).
  const auto load_chunk = [&](int st) {
    const int hl = load_walk.kpos / seq_q;
    if constexpr (TMA) {
      if (tid == 0) {
        const u32 bar = tiles.full(st);
        const int tok = load_walk.kpos - hl * seq_q;
        mbar_arrive_expect_tx(bar, STAGE_BYTES);
        tma_load_chunk<BN>(tiles.chunk(st), chunk_maps.a, tok, h0 + hl, b, bar);
        tma_load_chunk<BN>(tiles.chunk(st) + CHUNK_BYTES, chunk_maps.b, tok, h0 + hl, b, bar);
      }
    } else {
      const i64 back = (i64)hl * seq_q;
      const u16* qh = q_rows + hl * q_sh - back * q_sl;
      const u16* dh = do_rows + hl * do_sh - back * do_sl;
      load_tile<BN, NT>(tiles.chunk(st),
                        [&](int r) { return qh + load_walk.row_key(r) * q_sl; }, tid);
      load_tile<BN, NT>(tiles.chunk(st) + CHUNK_BYTES,
                        [&](int r) { return dh + load_walk.row_key(r) * do_sl; }, tid);
    }
    load_row_values<BN>(tiles.lse(st), tiles.lse(st) + 4 * BN, lse_rows, delta_rows, load_walk,
                        tid);
  };
  if (load_walk.more(se)) {
    load_chunk(0);
    load_walk.next(spans, se);
  }
  cp_async_commit();

  const int key_base = key_start + warp * 16;
  const int k0 = key_base + g, k1 = k0 + 8;
  const SmemDesc k_desc = k_major_desc(tiles.a + (u32)(wg * 64 * SW));
  const SmemDesc v_desc = k_major_desc(tiles.b + (u32)(wg * 64 * SW));
  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  // P^T's and dS^T's fragments: a chunk's dK is left in flight into the next chunk, whose
  // first wait takes it, so they outlive the iteration.
  u32 pw[BN / 16][4], dsw[BN / 16][4];
  const bool walked = walk.more(se);
  // (ATOMIC_DQ) The previous chunk's partial dQ, stored and not yet added: its query positions
  // (pending_end 0: none); kept as two positions, since a pointer costs the registers that
  // head dim 128's cp.async variant lacks.
  int pending_first = 0, pending_end = 0;
  int pending_chunk = 0;  // (DQ_BUFFERS 2) its chunk, whose parity names its set of tiles
  const bool dq_adder = adds_partial_dq(tid);
  const auto add_pending_dq = [&]() {
    const int hl = pending_first / seq_q;
    float* rows = dq_sums + (((i64)b * num_q_heads + h0 + hl) * seq_q + pending_first -
                             (i64)hl * seq_q) * D;
    reduce_partial_dq(rows, partial_dq_tile(tiles, wg, pending_chunk),
                      pending_end - pending_first);
  };

  for (int c = 0; walk.more(se); ++c) {
    // Chunk c (and with the first, K and V) has landed for every thread, its rows past the
    // span zeroed where TMA copied them (dK and dV multiply them by zero weights); chunk
    // c + 1 - STAGES's stage is free (with three stages c - 1's may still be read by its dK);
    // (ATOMIC_DQ) chunk c - 1's partial dQ is stored and visible to a bulk reduce.
    wait_for_chunk<2>(tiles, c, walk.k1 - walk.kpos, tid);
    if constexpr (Config::ATOMIC_DQ) {
      if (pending_end && dq_adder) add_pending_dq();
      pending_end = 0;
    }
    if (load_walk.more(se)) {
      load_chunk((c + 1) % STAGES);
      load_walk.next(spans, se);
    }
    cp_async_commit();
    const int st = c % STAGES;
    const u32 qs = tiles.chunk(st), dos = qs + CHUNK_BYTES;
    const int lo = max(walk.row_lo(spans), key_start);
    const int hi = min(walk.row_hi(spans), key_end);
    float s[BN / 8][4], dp[BN / 8][4];
    wgmma_fence();
    issue_rows_times_chunk(s, k_desc, qs);   // S^T = K Q^T
    issue_rows_times_chunk(dp, v_desc, dos); // dP^T = V dO^T
    const float* vals = values + st * 2 * BN;
    wgmma_wait<1>();  // the previous chunk's dV and dK, and S^T
    wgmma_hold<D / 2>(&dv[0][0]);
    wgmma_hold<D / 2>(&dk[0][0]);
    wgmma_hold<BN / 2>(&s[0][0]);
    probabilities(s, walk.kpos, walk.k1, k0 >= lo && k0 < hi, k1 >= lo && k1 < hi, t,
                  scale_log2, column_values<BN / 8>(vals, t, LOG2E));
    fragments(pw, s);
    issue_weights_times_chunk(dv, pw, dos);  // dV += P^T dO
    wgmma_wait<1>();
    wgmma_hold<BN / 2>(&dp[0][0]);
    score_gradients(s, dp, column_values<BN / 8>(vals + BN, t, 1.f));
    auto& ds_frag = DS_FRAGMENTS_OWN ? dsw : pw;
    if constexpr (!DS_FRAGMENTS_OWN) {
      wgmma_wait<0>();  // P^T's fragments, once the dV has read them
      wgmma_hold<D / 2>(&dv[0][0]);
    }
    fragments(ds_frag, s);
    float dq[DQ_N / 8][4];  // (ATOMIC_DQ) the partial dQ
    if constexpr (Config::ATOMIC_DQ) {
      store_score_gradients(tiles.ds, ds_frag, warp, g, t);
      // the barrier also tells the warpgroups that the partial dQ's tile is free
      if (dq_adder) partial_dq_read<DQ_BUFFERS - 1>();
      score_gradients_stored(wg);
    }
    // dK += dS^T Q, with dQ by atomics: after the partial dQ, so that waiting for that leaves dK
    // in flight into the next chunk -- except where dK's fragments, held until it completes,
    // would take the kernel past 255 registers beside the partial (DQ_AFTER_DK).
    if constexpr (Config::ATOMIC_DQ && !DQ_AFTER_DK) issue_scores_times_keys(dq, tiles, wg);
    issue_weights_times_chunk(dk, ds_frag, qs);
    if constexpr (Config::ATOMIC_DQ && DQ_AFTER_DK) issue_scores_times_keys(dq, tiles, wg);
    if constexpr (Config::ATOMIC_DQ) {
      if constexpr (DQ_AFTER_DK) {
        wgmma_wait<0>();
        wgmma_hold<D / 2>(&dk[0][0]);
      } else {
        wgmma_wait<1>();  // the partial dQ (dK stays in flight)
      }
      wgmma_hold<DQ_N / 2>(&dq[0][0]);
      const int first = walk.kpos - walk.kpos / seq_q * seq_q;  // (its token)
      store_partial_dq(partial_dq_tile(tiles, wg, c), dq, first, wg, warp % 4, g, t);
      pending_chunk = c;
      pending_first = walk.kpos;
      pending_end = min(walk.k1, walk.kpos + BN);  // (k1 ends the span)
    }
    if constexpr (!LAST_IN_FLIGHT) {  // (two stages) the next copy overwrites this chunk's
      wgmma_wait<0>();
      wgmma_hold<D / 2>(&dv[0][0]);
      wgmma_hold<D / 2>(&dk[0][0]);
    }
    walk.next(spans, se);
  }
  if (walked) {  // the last chunk's products (a task with no spans has none in flight: a wait
                 // shared with that path has ptxas serialize every wgmma)
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&dv[0][0]);
    wgmma_hold<D / 2>(&dk[0][0]);
  }
  if constexpr (Config::ATOMIC_DQ) {  // the last chunk's partial dQ
    if (pending_end) {
      fence_async_smem();
      __syncthreads();
      if (dq_adder) add_pending_dq();
    }
    if (dq_adder) partial_dq_done();
  }
  cp_async_wait<0>();
  store_gradient_rows<D>(dk_ptr + b * dk_sb + kvh * dk_sh, dk_sl, dk, k0, key_end, t, scale);
  store_gradient_rows<D>(dv_ptr + b * dv_sb + kvh * dv_sh, dv_sl, dv, k0, key_end, t, 1.f);
}
