// Portable block-sparse attention forward (sm_80 and newer): mma.sync m16n8k16, ldmatrix and a
// cp.async K/V pipeline, flash-attention style online softmax in exp2 with the scale folded in.
//
// One CTA runs one task of the queue (tessera/runtime/tasks.py): BM physical rows (packed heads x
// tile tokens), one warp per 16 rows, walking the task's key spans BN keys at a time. Tasks are
// ordered longest first and the hardware dispatches CTAs roughly in index order.
//
// Roles: traits.cuh (the variant's constants), loads.cuh (the K/V pipeline's copies), mma.cuh
// (ldmatrix and mma.sync), guard.cuh (non-finite V values in row-restricted chunks); the main
// loop and the epilogue are this kernel's. The softmax step, the key walks and the output store
// are both families' (common/).
//
// Shared memory (dynamic), in elements: BM * (D + 8) for Q, then STAGES x {K, V} tiles of
// BN x (D + 8). The +8 pad puts the 8 rows one ldmatrix reads in distinct banks. Q stays in
// shared memory and is re-read per key step (registers go to the accumulators instead).
// tessera/cuda/variants.py's smem_bytes mirrors this formula.
#include "variant.cuh"
#include "common/epilogue.cuh"
#include "common/softmax.cuh"
#include "sm80/guard.cuh"
#include "sm80/loads.cuh"
#include "sm80/mma.cuh"

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_fwd_sm80(TESSERA_BSA_PARAMS) {
  extern __shared__ __align__(16) u16 smem[];
  const int num_tasks = task_total(task_count, max_tasks);
  if ((int)blockIdx.x >= num_tasks) return;  // a grid sized by a bound (sync-free plan)
  const Operand q{q_ptr, q_sb, q_sh, q_sl};

  const Task task(tasks, blockIdx.x, k_ptr, k_sb, k_sh, v_ptr, v_sb, v_sh, group);
  const int b = task.b, h0 = task.h0, q_start = task.q_start, q_end = task.q_end;
  const int slot = task.slot;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

  u16* q_tile = smem;
  u16* stages = smem + Q_TILE;

  const int se = task.span_end;
  const u16* k_head = task.k_head;
  const u16* v_head = task.v_head;
  Walk load_walk;
  load_walk.open(spans, task.span_begin, se);
  Walk walk = load_walk;

  // Prologue: Q tile, then chunks 0 .. STAGES-2. One commit per chunk keeps the wait_group
  // count meaning "all but the newest STAGES-1 chunks have landed".
  for (int i = tid; i < BM * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR;
    cp_async16(smem_addr(q_tile + r * LDS + c * 8), task.q_row(q, r, tile_rows) + c * 8);
  }
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (load_walk.more(se)) {
      load_kv(stages + st * STAGE, k_head, k_sl, v_head, v_sl, load_walk, tid);
      load_walk.next(spans, se);
    }
    cp_async_commit();
  }

  // This warp's rows: MT tiles of 16; each tile is one head and 16 consecutive tokens
  // (tile_rows is a multiple of 16).
  int head[MT], tok_base[MT];
  bool tile_real[MT];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    const int r = (warp * MT + mi) * 16;
    head[mi] = h0 + r / tile_rows;
    tok_base[mi] = q_start + r % tile_rows;
    tile_real[mi] = tok_base[mi] < q_end;
  }

  float acc[MT][D / 8][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) acc[mi][i][0] = acc[mi][i][1] = acc[mi][i][2] = acc[mi][i][3] = 0.f;
    m[mi][0] = m[mi][1] = NEG_INF;
    l[mi][0] = l[mi][1] = 0.f;
  }

  // Per-thread ldmatrix addresses (bytes): the lane picks its row and 8-column half; every
  // other fragment is a compile-time offset from these.
  const u32 stage_base = smem_addr(stages);
  const u32 q_frag = smem_addr(q_tile) +
      (u32)(((warp * MT * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * LDS + 8 * (lane / 16)) * 2);
  const u32 k_frag = (u32)((((lane % 8) + 8 * (lane / 16)) * LDS + 8 * ((lane / 8) % 2)) * 2);
  const u32 v_frag = (u32)((((lane % 8) + 8 * ((lane / 8) % 2)) * LDS + 8 * (lane / 16)) * 2);

  for (int c = 0; walk.more(se); ++c) {
    // Prefetch STAGES-1 chunks ahead while this one is computed.
    if (load_walk.more(se)) {
      load_kv(stages + ((c + STAGES - 1) % STAGES) * STAGE, k_head, k_sl, v_head, v_sl,
              load_walk, tid);
      load_walk.next(spans, se);
    }
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    __syncthreads();

    const u32 ks = stage_base + (u32)((c % STAGES) * STAGE * 2);
    const u32 vs = ks + KV_TILE * 2;
    // Rows this span applies to, clipped to the tile's real rows.
    const int lo = max(walk.row_lo(spans), q_start);
    const int hi = min(walk.row_hi(spans), q_end);
    // A warp none of whose rows the span applies to skips the chunk's matrix work; otherwise
    // all its row tiles compute (an idle tile's rows are masked, so its P is 0): a mma.sync
    // predicated per row tile is one ptxas cannot prove warp-uniform, and it brackets each such
    // pair with a WARPSYNC (131 more instructions a 64-key step at 128x64, D=128).
    bool any_active = false;
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
      any_active |= tile_real[mi] && tok_base[mi] < hi && tok_base[mi] + 16 > lo;
    // A span restricted to some of the tile's rows whose V holds an Inf or NaN: its product
    // runs over V with those values zeroed, then only the rows it applies to take them back
    // (guard_values). `lo`, `hi` are uniform, so are the branch and the barriers in it.
    const bool guard = GUARD && (lo > q_start || hi < q_end) && guard_values(vs, tid);
    if (any_active) {
      // S = Q K^T (raw scores; the scale is applied inside the exponent).
      float s[MT][BN / 8][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) s[mi][i][0] = s[mi][i][1] = s[mi][i][2] = s[mi][i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        u32 qa[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
          ldmatrix_x4(qa[mi][0], qa[mi][1], qa[mi][2], qa[mi][3],
                      q_frag + (u32)((mi * 16 * LDS + kk * 16) * 2));
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          u32 b0, b1, b2, b3;
          ldmatrix_x4(b0, b1, b2, b3, ks + k_frag + (u32)((np * 16 * LDS + kk * 16) * 2));
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            mma16816(s[mi][2 * np], qa[mi], b0, b1);
            mma16816(s[mi][2 * np + 1], qa[mi], b2, b3);
          }
        }
      }
      bool rescale = false;
      float al[MT][2];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        al[mi][0] = al[mi][1] = 1.f;
        // Mask: keys past the span end, rows outside the span's restriction or the tile.
        const int t0 = tok_base[mi] + g, t1 = t0 + 8;
        rescale |= softmax_chunk(s[mi], m[mi], l[mi], al[mi], walk.kpos, walk.k1,
                                 t0 >= lo && t0 < hi, t1 >= lo && t1 < hi, t, scale_log2);
      }
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int i = 0; i < D / 8; ++i) {
            acc[mi][i][0] *= al[mi][0]; acc[mi][i][1] *= al[mi][0];
            acc[mi][i][2] *= al[mi][1]; acc[mi][i][3] *= al[mi][1];
          }
      }
      // O += P V: the score accumulators of two key octets form one A fragment of P.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        u32 pa[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) p_fragment(pa[mi], s[mi], kk);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          u32 b0, b1, b2, b3;
          ldmatrix_x4_trans(b0, b1, b2, b3, vs + v_frag + (u32)((kk * 16 * LDS + dp * 16) * 2));
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            mma16816(acc[mi][2 * dp], pa[mi], b0, b1);
            mma16816(acc[mi][2 * dp + 1], pa[mi], b2, b3);
          }
        }
      }
      if (guard) {
        // The rows the span applies to select every key of the chunk (rows past its end
        // repeat the last one): they take each column's non-finite values back.
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          const int in = 3 & ~excluded_rows(tok_base[mi] + g, lo, hi);
#pragma unroll
          for (int i = 0; i < D / 8; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float x = column_non_finite(vs, i, 2 * t + e);
              if (in & 1) acc[mi][i][e] += x;
              if (in & 2) acc[mi][i][2 + e] += x;
            }
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before it is refilled
    walk.next(spans, se);
  }
  cp_async_wait<0>();

  const Output out{o_ptr, o_sb, o_sh, o_sl, lse_ptr, lse_sb, lse_sh, part_o, part_lse};
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    if (!tile_real[mi]) continue;
    store_rows<D>(out, acc[mi], m[mi], l[mi], b, head[mi], tok_base[mi] + g, q_end,
                  (warp * MT + mi) * 16 + g, BM, slot, t);
  }
}
