// Portable block-sparse attention forward (sm_80 and newer): mma.sync m16n8k16, ldmatrix and a
// cp.async K/V pipeline, flash-attention style online softmax in exp2 with the scale folded in.
//
// One CTA runs one task of the queue (tessera/runtime/tasks.py): BM physical rows (packed heads x
// tile tokens), one warp per 16 rows, walking the task's key spans BN keys at a time. Tasks are
// ordered longest first and the hardware dispatches CTAs roughly in index order.
//
// Variant parameters (macros, set by tessera/cuda/loader.py):
//   TESSERA_BM, TESSERA_BN     physical tile: rows per task, keys per step
//   TESSERA_D                  head dim (q, k and v), a multiple of 16
//   TESSERA_WARPS              warps per CTA
//   TESSERA_MT                 m16 row tiles per warp (BM = WARPS * 16 * MT). Two tiles per warp
//                              halve the shared-memory reads of K and V per matrix operation,
//                              which is what bounds this family on large GPUs.
//   TESSERA_STAGES             K/V pipeline depth (>= 2)
//   TESSERA_MIN_BLOCKS         CTAs per SM the register budget is set for
//   TESSERA_BF16               1: bfloat16, 0: float16
//   TESSERA_GUARD              0: no non-finite check of row-restricted chunks (common.cuh)
//
// Shared memory (dynamic), in elements: BM * (D + 8) for Q, then STAGES x {K, V} tiles of
// BN x (D + 8). The +8 pad puts the 8 rows one ldmatrix reads in distinct banks. Q stays in
// shared memory and is re-read per key step (registers go to the accumulators instead).
// Python's loader.smem_bytes mirrors this formula.
#include "common.cuh"

#ifndef TESSERA_MIN_BLOCKS
#define TESSERA_MIN_BLOCKS 1
#endif

namespace {
constexpr int BM = TESSERA_BM;
constexpr int BN = TESSERA_BN;
constexpr int D = TESSERA_D;
constexpr int NW = TESSERA_WARPS;
constexpr int MT = TESSERA_MT;
constexpr int STAGES = TESSERA_STAGES;
constexpr int NT = NW * 32;
constexpr int LDS = D + 8;               // padded shared-memory row, elements
constexpr int KV_TILE = BN * LDS;        // elements of one K or V tile
constexpr int STAGE = 2 * KV_TILE;       // K then V
constexpr int Q_TILE = BM * LDS;
constexpr int CPR = D / 8;               // 16-byte chunks per row
static_assert(BM == NW * 16 * MT, "BM = warps x 16 x MT");
static_assert(D % 16 == 0 && BN % 16 == 0, "D and BN must be multiples of 16");
static_assert(STAGES >= 2, "at least double buffering");

using Walk = ChunkWalk<BN>;

// Issue the asynchronous copies of one K/V chunk into a stage (rows past the span end: see
// ChunkWalk::row_key).
// k_head/v_head point at (batch, kv head) row 0; the row stride is in elements.
__device__ __forceinline__ void load_kv(u16* stage, const u16* k_head, i64 k_sl,
                                        const u16* v_head, i64 v_sl, const Walk& w,
                                        int tid) {
  const u32 ks = smem_addr(stage), vs = smem_addr(stage + KV_TILE);
  if constexpr (NT % CPR == 0) {
    // Each thread copies the same 16-byte column of every (NT / CPR)-th row: the row step and
    // the shared-memory offsets are compile-time constants.
    constexpr int ROW_STEP = NT / CPR;
    const int r0 = tid / CPR, c = tid % CPR;
    const u32 off0 = (u32)(r0 * LDS + c * 8) * 2u;
    if (w.kpos + BN <= w.k1) {
      // A whole chunk (the common case): its rows are consecutive keys, so each row's address
      // is one 64-bit add from the last instead of a clamp and two 64-bit multiplies.
      const u16* kr = k_head + (i64)(w.kpos + r0) * k_sl + c * 8;
      const u16* vr = v_head + (i64)(w.kpos + r0) * v_sl + c * 8;
#pragma unroll
      for (int j = 0; j < BN / ROW_STEP; ++j) {
        const u32 off = off0 + (u32)(j * ROW_STEP * LDS * 2);
        cp_async16(ks + off, kr);
        cp_async16(vs + off, vr);
        kr += ROW_STEP * k_sl;
        vr += ROW_STEP * v_sl;
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < BN / ROW_STEP; ++j) {
      const i64 key = w.row_key(r0 + j * ROW_STEP);
      const u32 off = off0 + (u32)(j * ROW_STEP * LDS * 2);
      cp_async16(ks + off, k_head + key * k_sl + c * 8);
      cp_async16(vs + off, v_head + key * v_sl + c * 8);
    }
  } else {
    // Not unrolled: unrolling hoists one address per iteration into registers the MMA loop needs.
#pragma unroll 1
    for (int i = tid; i < BN * CPR; i += NT) {
      const int r = i / CPR, c = i % CPR;
      const i64 key = w.row_key(r);
      const u32 off = (u32)(r * LDS + c * 8) * 2u;
      cp_async16(ks + off, k_head + key * k_sl + c * 8);
      cp_async16(vs + off, v_head + key * v_sl + c * 8);
    }
  }
}

// ---- non-finite values in rows a span does not select (common.cuh) ------------------------------
// The V tile's non-finite values are zeroed in place and their classes kept per column, 4 bits
// a column (NONFINITE_*), 8 columns a word, in the padding of the tile's first rows (LDS - D
// spare elements a row: no copy reads them).
constexpr int FLAG_WORDS = D / 8;
static_assert(FLAG_WORDS <= 4 * BN && (LDS - D) * 2 >= 16, "the flags fit in V's row padding");
__device__ __forceinline__ u32 flag_word(u32 vs, int w) {
  return vs + (u32)(((w / 4) * LDS + D) * 2 + (w % 4) * 4);
}

// Zeroes the Inf and NaN values of the V tile at vs and records their columns' classes; true
// (for every thread of the CTA) when there were any. Called by every thread, after the tile
// has landed and a barrier.
__device__ __noinline__ bool guard_values(u32 vs, int tid) {
  if (tid < FLAG_WORDS) asm volatile("st.shared.u32 [%0], 0;" ::"r"(flag_word(vs, tid)) : "memory");
  __syncthreads();
  u32 found = 0;
#pragma unroll 1
  for (int i = tid; i < BN * D / 2; i += NT) {
    const int row = i / (D / 2), col = i % (D / 2) * 2;
    const u32 at = vs + (u32)((row * LDS + col) * 2);
    u32 x;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(x) : "r"(at));
    const u32 bad = non_finite_pair(x);
    if (bad) {
      found = 1;
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(x & ~bad) : "memory");
      const u32 bits = (non_finite_class((u16)x) << (4 * (col % 8))) |
                       (non_finite_class((u16)(x >> 16)) << (4 * (col % 8 + 1)));
      asm volatile("red.shared.or.b32 [%0], %1;" ::"r"(flag_word(vs, col / 8)), "r"(bits)
                   : "memory");
    }
  }
  return __syncthreads_or(found) != 0;
}

// What column 8 * w + c of the guarded V tile adds to a row that selects all its keys: 0, or
// the sum of its non-finite values (Inf, -Inf or NaN).
__device__ __forceinline__ float column_non_finite(u32 vs, int w, int c) {
  u32 f;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(f) : "r"(flag_word(vs, w)));
  return non_finite_sum((f >> (4 * c)) & 0xfu);
}
}  // namespace

extern "C" __global__ void __launch_bounds__(NT, TESSERA_MIN_BLOCKS)
bsa_fwd_sm80(TESSERA_BSA_PARAMS) {
  extern __shared__ __align__(16) u16 smem[];
  TESSERA_NUM_TASKS;
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
