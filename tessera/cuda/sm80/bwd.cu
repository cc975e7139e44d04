// Portable block-sparse attention backward (sm_80 and newer): mma.sync m16n8k16, ldmatrix and a
// cp.async pipeline, as the forward (bsa.cu). Three kernels, launched in this order
// (tessera/launch_backward.py):
//
//   bsa_bwd_delta      Delta = rowsum(dO * O), one warp a query row.
//   bsa_bwd_dkdv_sm80  the key-major queue: one CTA a key tile of a kv head, its K and V rows
//                      resident, walking the query spans of every query head of the group that
//                      select it, BN query rows at a time; dK and dV accumulate in registers and
//                      are written once.
//   bsa_bwd_dq_sm80    the query-major queue: one CTA a tile of query rows (packed heads as the
//                      forward's), Q and dO resident, walking its key spans BN keys at a time;
//                      dQ accumulates in registers and is written once.
//
// Every gradient row has one writer, so the pass is deterministic with no floating-point atomics
// and no fp32 gradient buffer (tessera/runtime/backward.py builds queues that give each row one
// task). One warp owns 16 rows (MT = 1) and recomputes P from the LSE (common/backward.cuh).
//
// Roles: traits.cuh (the variant's constants), loads.cuh (the chunk pipeline's copies),
// bwd_loads.cuh (resident tiles), mma.cuh (ldmatrix and mma.sync), common/backward.cuh (P, dS,
// the chunk's LSE and Delta, the gradient store); the main loops are this file's.
//
// Shared memory (dynamic): two resident tiles of BM x (D + 8) elements, then STAGES x {two chunk
// tiles of BN x (D + 8)}, then STAGES x {BN LSE, BN Delta} floats (the key-major kernel's).
// tessera/cuda/variants.py's smem_bytes mirrors this formula.
#include "variant.cuh"
#include "common/backward.cuh"
#include "common/softmax.cuh"
#include "sm80/bwd_loads.cuh"
#include "sm80/loads.cuh"
#include "sm80/mma.cuh"

namespace {
constexpr int RESIDENT = 2 * BM * LDS;  // elements of the two resident tiles
static_assert(MT == 1, "the backward kernels own 16 rows a warp");
static_assert(NT >= 2 * BN, "a thread for each of a chunk's LSE and Delta values");

// Per-thread ldmatrix byte offsets (see bsa.cu): A fragments of a resident tile (the warp's
// rows), B fragments of a chunk read as rows (k_frag) or transposed (v_frag).
struct Fragments {
  u32 a, b_rows, b_trans;
  __device__ __forceinline__ Fragments(int warp, int lane) {
    a = (u32)((((warp * 16) + (lane % 8) + 8 * ((lane / 8) % 2)) * LDS + 8 * (lane / 16)) * 2);
    b_rows = (u32)((((lane % 8) + 8 * (lane / 16)) * LDS + 8 * ((lane / 8) % 2)) * 2);
    b_trans = (u32)((((lane % 8) + 8 * ((lane / 8) % 2)) * LDS + 8 * (lane / 16)) * 2);
  }
};

// acc[NB][4] = A (16 x D, the warp's rows of the resident tile at a) times B^T (the chunk at b,
// BN rows x D): scores in the m16n8 layout.
__device__ __forceinline__ void rows_times_chunk(float (&acc)[BN / 8][4], u32 a, u32 b,
                                                 const Fragments& f) {
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    u32 fa[4];
    ldmatrix_x4(fa[0], fa[1], fa[2], fa[3], a + f.a + (u32)(kk * 16 * 2));
#pragma unroll
    for (int np = 0; np < BN / 16; ++np) {
      u32 b0, b1, b2, b3;
      ldmatrix_x4(b0, b1, b2, b3, b + f.b_rows + (u32)((np * 16 * LDS + kk * 16) * 2));
      mma16816(acc[2 * np], fa, b0, b1);
      mma16816(acc[2 * np + 1], fa, b2, b3);
    }
  }
}

// acc[D / 8][4] += W (16 x BN, the thread's m16n8 values) times the chunk at b (BN x D).
__device__ __forceinline__ void add_weights_times_chunk(float (&acc)[D / 8][4],
                                                        const float (&w)[BN / 8][4], u32 b,
                                                        const Fragments& f) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    u32 wa[4];
    p_fragment(wa, w, kk);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      u32 b0, b1, b2, b3;
      ldmatrix_x4_trans(b0, b1, b2, b3, b + f.b_trans + (u32)((kk * 16 * LDS + dp * 16) * 2));
      mma16816(acc[2 * dp], wa, b0, b1);
      mma16816(acc[2 * dp + 1], wa, b2, b3);
    }
  }
}

__device__ __forceinline__ void zero(float (&acc)[D / 8][4]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}
}  // namespace

// Delta = rowsum(dO * O) in float32, contiguous [B, Hq, Lq]; one warp a row.
extern "C" __global__ void __launch_bounds__(256)
bsa_bwd_delta(const u16* o_ptr, i64 o_sb, i64 o_sh, i64 o_sl, const u16* do_ptr, i64 do_sb,
              i64 do_sh, i64 do_sl, float* delta, int num_q_heads, int seq_q, i64 rows) {
  const i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int tok = (int)(row % seq_q);
  const i64 bh = row / seq_q;
  const int h = (int)(bh % num_q_heads), b = (int)(bh / num_q_heads);
  const u16* o = o_ptr + b * o_sb + h * o_sh + tok * o_sl;
  const u16* d = do_ptr + b * do_sb + h * do_sh + tok * do_sl;
  float sum = 0.f;
#pragma unroll
  for (int c = 2 * lane; c < D; c += 64) {
    const u32 x = *reinterpret_cast<const u32*>(o + c), y = *reinterpret_cast<const u32*>(d + c);
    sum = fmaf(to_float((u16)x), to_float((u16)y), sum);
    sum = fmaf(to_float((u16)(x >> 16)), to_float((u16)(y >> 16)), sum);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) delta[row] = sum;
}

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_bwd_dq_sm80(TESSERA_BWD_PARAMS) {
  extern __shared__ __align__(16) u16 smem[];
  if ((int)blockIdx.x >= num_tasks) return;
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

  // The warp's 16 rows: one head, 16 consecutive tokens (tile_rows is a multiple of 16).
  const int head = task.h0 + warp * 16 / tile_rows;
  const int tok_base = q_start + warp * 16 % tile_rows;
  const bool tile_real = tok_base < q_end;
  const int t0 = tok_base + g, t1 = t0 + 8;
  const float* lse_row = lse_ptr + ((i64)b * num_q_heads + head) * seq_q;
  const float* delta_row = delta_ptr + ((i64)b * num_q_heads + head) * seq_q;
  const RowValues lse{t0 < q_end ? lse_row[t0] * LOG2E : 0.f,
                      t1 < q_end ? lse_row[t1] * LOG2E : 0.f};
  const RowValues delta{t0 < q_end ? delta_row[t0] : 0.f, t1 < q_end ? delta_row[t1] : 0.f};

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
                    scale_log2, lse);
      rows_times_chunk(dp, smem_addr(do_tile), vs, f);      // dP = dO V^T
      score_gradients(s, dp, delta);
      add_weights_times_chunk(dq, s, ks, f);                // dQ += dS K
    }
    __syncthreads();  // everyone is done with this stage before it is refilled
    walk.next(spans, se);
  }
  cp_async_wait<0>();
  if (tile_real)
    store_gradient_rows<D>(dq_ptr + b * dq_sb + head * dq_sh, dq_sl, dq, t0, q_end, t, scale);
}

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_bwd_dkdv_sm80(TESSERA_BWD_PARAMS) {
  extern __shared__ __align__(16) u16 smem[];
  if ((int)blockIdx.x >= num_tasks) return;
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
      ColumnValues<BN / 8> lse2, delta;
      column_values(lse2, delta, lse_cols, lse_cols + BN, t);
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
