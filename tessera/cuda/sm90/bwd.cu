// Hopper block-sparse attention backward (sm_90a): warpgroup MMA (wgmma) reading every operand
// but P and dS straight from swizzled shared memory (layout.cuh), a cp.async double buffer, and
// the portable family's math (common/backward.cuh). Same queues, arguments and launch order as
// the portable backward (sm80/bwd.cu, whose bsa_bwd_delta runs first on every GPU):
//
//   bsa_bwd_dkdv_sm90  the key-major queue: a CTA holds BM keys' K and V (64 a warpgroup) and
//                      walks the query spans of every query head of the kv head's group, BN
//                      query rows at a time: S^T = K Q^T and dP^T = V dO^T (K-major operands),
//                      P^T from the LSE, dV += P^T dO, dS^T = P^T (dP^T - Delta), dK += dS^T Q
//                      (P^T and dS^T from registers, dO and Q read N-major).
//   bsa_bwd_dq_sm90    the query-major queue: Q and dO resident, key spans BN keys at a time:
//                      S = Q K^T and dP = dO V^T, dS = P (dP - Delta), dQ += dS K.
//
// One writer a gradient row, as the portable family. Each warpgroup issues its own products
// (a 64-row slice of the tile) and waits only for its own; one CTA barrier a chunk hands the
// stages over.
//
// Shared memory (dynamic, 1 KiB of slack to align the tiles): two resident tiles of BM x D,
// then STAGES x {two chunk tiles of BN x D}, then STAGES x {BN LSE, BN Delta} floats.
// tessera/cuda/variants.py's smem_bytes mirrors this formula.
#include "variant.cuh"
#include "common/backward.cuh"
#include "common/softmax.cuh"
#include "common/walk.cuh"
#include "sm90/bwd_loads.cuh"

namespace {
constexpr int WGS = BM / 64;  // warpgroups, 64 rows each
constexpr int NT = WGS * 128;
constexpr int TILE_BYTES = BM * D * 2;
constexpr int CHUNK_BYTES = BN * D * 2;
constexpr int STAGE_BYTES = 2 * CHUNK_BYTES;
static_assert(BM % 64 == 0 && BN % 64 == 0, "64 rows a warpgroup, 64-wide steps");
static_assert(STAGES == 2, "a double buffer: chunk j + 1 loads while chunk j computes");
static_assert(TILE_BYTES % 1024 == 0 && CHUNK_BYTES % 1024 == 0, "tiles 1024-byte aligned");
static_assert(NT >= 2 * BN, "a thread for each of a chunk's LSE and Delta values");
using Walk = ChunkWalk<BN>;

// Where the tiles sit: 1024-aligned from the dynamic shared memory's start.
struct Tiles {
  u32 a, b, stages, values;  // resident tiles, chunk stages, per-stage LSE and Delta
  __device__ __forceinline__ explicit Tiles(const unsigned char* smem_raw) {
    a = (smem_addr(smem_raw) + 1023u) & ~1023u;
    b = a + TILE_BYTES;
    stages = b + TILE_BYTES;
    values = stages + STAGES * STAGE_BYTES;
  }
  __device__ __forceinline__ u32 chunk(int st) const { return stages + (u32)(st * STAGE_BYTES); }
  __device__ __forceinline__ u32 lse(int st) const { return values + (u32)(st * 2 * BN * 4); }
};

// acc = A (the warpgroup's 64 rows of a resident tile, K-major) times B^T (a chunk, K-major):
// D / 16 wgmma of BN columns, committed as one group.
__device__ __forceinline__ void issue_rows_times_chunk(float (&acc)[BN / 8][4], const SmemDesc& a,
                                                       u32 chunk) {
  const SmemDesc b = k_major_desc(chunk);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    Wgmma<BN>::ss(&acc[0][0], a.at(k_major_step<BM>(kk)), b.at(k_major_step<BN>(kk)), kk > 0);
  wgmma_commit();
}

// acc += W (BN columns of the thread's m16n8 values, as A fragments) times a chunk read N-major
// (BN x D): BN / 16 wgmma of D columns, committed as one group.
__device__ __forceinline__ void issue_weights_times_chunk(float (&acc)[D / 8][4],
                                                          const u32 (&w)[BN / 16][4], u32 chunk) {
  const SmemDesc b = n_major_desc<BN>(chunk);
  wgmma_hold<D / 2>(&acc[0][0]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) Wgmma<D>::rs(&acc[0][0], w[kk], b.at(v_step(kk)), 1);
  wgmma_commit();
}

__device__ __forceinline__ void fragments(u32 (&w)[BN / 16][4], const float (&s)[BN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) p_fragment(w[kk], s, kk);
}

__device__ __forceinline__ void zero(float (&acc)[D / 8][4]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}
}  // namespace

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_bwd_dkdv_sm90(TESSERA_BWD_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if ((int)blockIdx.x >= num_tasks) return;
  // A key-major task (sm80/bwd.cu says what its fields hold).
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

  const auto key_row = [&](int r) { return min(key_start + r, key_end - 1); };
  load_tile<BM, NT>(tiles.a, [&](int r) { return k_rows + key_row(r) * k_sl; }, tid);
  load_tile<BM, NT>(tiles.b, [&](int r) { return v_rows + key_row(r) * v_sl; }, tid);
  // A chunk's Q and dO rows: positions are head-in-group * seq_q + token (see sm80/bwd.cu).
  const auto load_chunk = [&](int st) {
    const int hl = load_walk.kpos / seq_q;
    const i64 back = (i64)hl * seq_q;
    const u16* qh = q_rows + hl * q_sh - back * q_sl;
    const u16* dh = do_rows + hl * do_sh - back * do_sl;
    load_tile<BN, NT>(tiles.chunk(st), [&](int r) { return qh + load_walk.row_key(r) * q_sl; },
                      tid);
    load_tile<BN, NT>(tiles.chunk(st) + CHUNK_BYTES,
                      [&](int r) { return dh + load_walk.row_key(r) * do_sl; }, tid);
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

  for (int c = 0; walk.more(se); ++c) {
    cp_async_wait<0>();  // chunk c (and with the first, K and V) has landed
    fence_async_smem();
    __syncthreads();     // ... for every thread; and chunk c - 1's stage is free
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
    ColumnValues<BN / 8> lse2, delta;
    const float* vals = values + st * 2 * BN;
    column_values(lse2, delta, vals, vals + BN, t);
    wgmma_wait<1>();
    wgmma_hold<BN / 2>(&s[0][0]);
    probabilities(s, walk.kpos, walk.k1, k0 >= lo && k0 < hi, k1 >= lo && k1 < hi, t,
                  scale_log2, lse2);
    u32 w[BN / 16][4];
    fragments(w, s);
    issue_weights_times_chunk(dv, w, dos);   // dV += P^T dO
    wgmma_wait<1>();
    wgmma_hold<BN / 2>(&dp[0][0]);
    score_gradients(s, dp, delta);
    wgmma_wait<0>();                         // P^T's fragments are free again
    wgmma_hold<D / 2>(&dv[0][0]);
    fragments(w, s);
    issue_weights_times_chunk(dk, w, qs);    // dK += dS^T Q
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&dk[0][0]);
    walk.next(spans, se);
  }
  cp_async_wait<0>();
  store_gradient_rows<D>(dk_ptr + b * dk_sb + kvh * dk_sh, dk_sl, dk, k0, key_end, t, scale);
  store_gradient_rows<D>(dv_ptr + b * dv_sb + kvh * dv_sh, dv_sl, dv, k0, key_end, t, 1.f);
}

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_bwd_dq_sm90(TESSERA_BWD_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if ((int)blockIdx.x >= num_tasks) return;
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

  load_tile<BM, NT>(tiles.a, [&](int r) { return task.q_row(q, r, tile_rows); }, tid);
  load_tile<BM, NT>(tiles.b, [&](int r) { return task.q_row(dout, r, tile_rows); }, tid);
  const auto load_chunk = [&](int st) {
    load_tile<BN, NT>(tiles.chunk(st),
                      [&](int r) { return task.k_head + load_walk.row_key(r) * k_sl; }, tid);
    load_tile<BN, NT>(tiles.chunk(st) + CHUNK_BYTES,
                      [&](int r) { return task.v_head + load_walk.row_key(r) * v_sl; }, tid);
  };
  if (load_walk.more(se)) {
    load_chunk(0);
    load_walk.next(spans, se);
  }
  cp_async_commit();

  // The warp's 16 rows: one head, 16 consecutive tokens (tile_rows is a multiple of 16).
  const int head = task.h0 + warp * 16 / tile_rows;
  const int tok_base = q_start + warp * 16 % tile_rows;
  const int t0 = tok_base + g, t1 = t0 + 8;
  const float* lse_row = lse_ptr + ((i64)b * num_q_heads + head) * seq_q;
  const float* delta_row = delta_ptr + ((i64)b * num_q_heads + head) * seq_q;
  const RowValues lse{t0 < q_end ? lse_row[t0] * LOG2E : 0.f,
                      t1 < q_end ? lse_row[t1] * LOG2E : 0.f};
  const RowValues delta{t0 < q_end ? delta_row[t0] : 0.f, t1 < q_end ? delta_row[t1] : 0.f};
  const SmemDesc q_desc = k_major_desc(tiles.a + (u32)(wg * 64 * SW));
  const SmemDesc do_desc = k_major_desc(tiles.b + (u32)(wg * 64 * SW));
  float dq[D / 8][4];
  zero(dq);

  for (int c = 0; walk.more(se); ++c) {
    cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
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
    wgmma_wait<1>();
    wgmma_hold<BN / 2>(&s[0][0]);
    probabilities(s, walk.kpos, walk.k1, t0 >= lo && t0 < hi, t1 >= lo && t1 < hi, t,
                  scale_log2, lse);
    wgmma_wait<0>();
    wgmma_hold<BN / 2>(&dp[0][0]);
    score_gradients(s, dp, delta);
    u32 w[BN / 16][4];
    fragments(w, s);
    issue_weights_times_chunk(dq, w, ks);     // dQ += dS K
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&dq[0][0]);
    walk.next(spans, se);
  }
  cp_async_wait<0>();
  if (tok_base < q_end)
    store_gradient_rows<D>(dq_ptr + b * dq_sb + head * dq_sh, dq_sl, dq, t0, q_end, t, scale);
}
