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
//   TESSERA_WARPS              warps per CTA; BM / WARPS must be 16
//   TESSERA_STAGES             K/V pipeline depth (>= 2)
//   TESSERA_MIN_BLOCKS         CTAs per SM the register budget is set for
//   TESSERA_BF16               1: bfloat16, 0: float16
//
// Shared memory (dynamic), in elements: STAGE + max((STAGES - 1) * STAGE, BM * (D + 8)), where
// STAGE = {K, V} tiles of BN x (D + 8). The Q tile starts at stage 1 and shares its space because
// Q lives in registers once loaded. The +8 pad puts the 8 rows one ldmatrix reads in distinct
// banks. Python's loader.smem_bytes mirrors this formula.
#include "common.cuh"

#ifndef TESSERA_MIN_BLOCKS
#define TESSERA_MIN_BLOCKS 1
#endif

namespace {
constexpr int BM = TESSERA_BM;
constexpr int BN = TESSERA_BN;
constexpr int D = TESSERA_D;
constexpr int NW = TESSERA_WARPS;
constexpr int STAGES = TESSERA_STAGES;
constexpr int NT = NW * 32;
constexpr int LDS = D + 8;               // padded shared-memory row, elements
constexpr int KV_TILE = BN * LDS;        // elements of one K or V tile
constexpr int STAGE = 2 * KV_TILE;       // K then V
constexpr int CPR = D / 8;               // 16-byte chunks per row
constexpr float LN2 = 0.69314718055994530942f;
static_assert(BM == NW * 16, "one warp owns 16 rows");
static_assert(D % 16 == 0 && BN % 16 == 0, "D and BN must be multiples of 16");
static_assert(STAGES >= 2, "at least double buffering");

// Walks the chunks of a task: span by span, BN keys at a time.
struct ChunkWalk {
  const int* spans;
  int si, se, k0, k1, r0, r1, kpos;
  __device__ __forceinline__ void open(int s) {
    si = s;
    if (si < se) {
      const int* sp = spans + (i64)si * SPAN_FIELDS;
      k0 = sp[0]; k1 = sp[1]; r0 = sp[2]; r1 = sp[3];
      kpos = k0;
    }
  }
  __device__ __forceinline__ bool valid() const { return si < se; }
  __device__ __forceinline__ void next() {
    kpos += BN;
    if (kpos >= k1) open(si + 1);
  }
};

// Issue the asynchronous copies of one K/V chunk into a stage. Rows past the span end are read
// from its last key (finite data; their scores are masked), so no read leaves the span.
__device__ __forceinline__ void load_kv(u16* stage, const Operand& k, const Operand& v, int b,
                                        int kvh, const ChunkWalk& w, int tid) {
  const u32 ks = smem_addr(stage), vs = smem_addr(stage + KV_TILE);
#pragma unroll
  for (int i = tid; i < BN * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR;
    const int key = min(w.kpos + r, w.k1 - 1);
    const u32 off = (u32)(r * LDS + c * 8) * 2u;
    cp_async16(ks + off, k.row(b, kvh, key) + c * 8);
    cp_async16(vs + off, v.row(b, kvh, key) + c * 8);
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(NT, TESSERA_MIN_BLOCKS)
bsa_fwd_sm80(const int* __restrict__ tasks, const int* __restrict__ spans,
             const u16* q_ptr, i64 q_sb, i64 q_sh, i64 q_sl,
             const u16* k_ptr, i64 k_sb, i64 k_sh, i64 k_sl,
             const u16* v_ptr, i64 v_sb, i64 v_sh, i64 v_sl,
             u16* o_ptr, i64 o_sb, i64 o_sh, i64 o_sl,
             float* lse_ptr, i64 lse_sb, i64 lse_sh,
             float* part_o, float* part_lse,
             int tile_rows, int group, float scale_log2) {
  extern __shared__ __align__(16) u16 smem[];
  const Operand q{q_ptr, q_sb, q_sh, q_sl};
  const Operand k{k_ptr, k_sb, k_sh, k_sl};
  const Operand v{v_ptr, v_sb, v_sh, v_sl};

  const int* task = tasks + (i64)blockIdx.x * TASK_FIELDS;
  const int b = task[TASK_BATCH], h0 = task[TASK_Q_HEAD0];
  const int q_start = task[TASK_Q_START], q_end = task[TASK_Q_END];
  const int slot = task[TASK_SLOT];
  const int kvh = h0 / group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

  u16* q_tile = smem + STAGE;  // aliases stages 1.. (Q moves to registers before they fill)

  ChunkWalk load_walk{spans, 0, task[TASK_SPAN_END], 0, 0, 0, 0, 0};
  load_walk.open(task[TASK_SPAN_BEGIN]);
  ChunkWalk walk = load_walk;

  // Prologue: Q tile and the first K/V chunk.
  for (int i = tid; i < BM * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR;
    int tok = q_start + r % tile_rows;
    tok = tok < q_end ? tok : q_start;  // padding rows read a real row; never stored
    cp_async16(smem_addr(q_tile + r * LDS + c * 8), q.row(b, h0 + r / tile_rows, tok) + c * 8);
  }
  if (load_walk.valid()) load_kv(smem, k, v, b, kvh, load_walk, tid);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // This warp's rows: one head, 16 consecutive tokens (tile_rows is a multiple of 16).
  const int head = h0 + (warp * 16) / tile_rows;
  const int tok_base = q_start + (warp * 16) % tile_rows;
  const int tok0 = tok_base + g, tok1 = tok_base + g + 8;
  const bool warp_real = tok_base < q_end;

  u32 qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int r = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
    const int c = kk * 16 + 8 * (lane / 16);
    ldmatrix_x4(qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], smem_addr(q_tile + r * LDS + c));
  }
  __syncthreads();  // Q tile space is now free for stage 1

  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;

  // Fill the pipeline: chunks 1 .. STAGES-2 (chunk 0 came with Q). One commit per step keeps
  // the wait_group count meaning "all but the newest STAGES-1 chunks have landed".
  if (load_walk.valid()) load_walk.next();
#pragma unroll
  for (int st = 1; st < STAGES - 1; ++st) {
    if (load_walk.valid()) {
      load_kv(smem + st * STAGE, k, v, b, kvh, load_walk, tid);
      load_walk.next();
    }
    cp_async_commit();
  }
  for (int c = 0; walk.valid(); ++c) {
    // Prefetch STAGES-1 chunks ahead while this one is computed.
    if (load_walk.valid()) {
      load_kv(smem + ((c + STAGES - 1) % STAGES) * STAGE, k, v, b, kvh, load_walk, tid);
      load_walk.next();
    }
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    __syncthreads();

    const u16* ks = smem + (c % STAGES) * STAGE;
    const u16* vs = ks + KV_TILE;
    // Rows this span applies to, clipped to the tile's real rows.
    const int lo = max(walk.r0, q_start), hi = min(walk.r1, q_end);
    const bool active = warp_real && tok_base < hi && tok_base + 16 > lo;
    if (active) {
      float s[BN / 8][4];
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          u32 b0, b1, b2, b3;
          const int r = np * 16 + (lane % 8) + 8 * (lane / 16);
          const int col = kk * 16 + 8 * ((lane / 8) % 2);
          ldmatrix_x4(b0, b1, b2, b3, smem_addr(ks + r * LDS + col));
          mma16816(s[2 * np], qa[kk], b0, b1);
          mma16816(s[2 * np + 1], qa[kk], b2, b3);
        }
      }
      // Mask: keys past the span end, rows outside the span's restriction or the tile.
      const bool ok0 = tok0 >= lo && tok0 < hi, ok1 = tok1 >= lo && tok1 < hi;
      const bool edge = walk.kpos + BN > walk.k1 || !(ok0 && ok1);
      float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[nt][e] * scale_log2;
          if (edge) {
            const bool key_ok = walk.kpos + nt * 8 + 2 * t + (e & 1) < walk.k1;
            x = (key_ok && (e < 2 ? ok0 : ok1)) ? x : NEG_INF;
          }
          s[nt][e] = x;
        }
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
      }
      const float mn0 = fmaxf(m0, warp_quad_max(mx0)), mn1 = fmaxf(m1, warp_quad_max(mx1));
      // A row with nothing unmasked yet keeps m = -inf; subtract 0 so exp2 gives 0, not NaN.
      const float base0 = mn0 == NEG_INF ? 0.f : mn0, base1 = mn1 == NEG_INF ? 0.f : mn1;
      const float al0 = fast_exp2(m0 - base0), al1 = fast_exp2(m1 - base1);
      m0 = mn0; m1 = mn1;
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        s[nt][0] = fast_exp2(s[nt][0] - base0); s[nt][1] = fast_exp2(s[nt][1] - base0);
        s[nt][2] = fast_exp2(s[nt][2] - base1); s[nt][3] = fast_exp2(s[nt][3] - base1);
        rs0 += s[nt][0] + s[nt][1];
        rs1 += s[nt][2] + s[nt][3];
      }
      l0 = l0 * al0 + rs0;
      l1 = l1 * al1 + rs1;
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        acc[i][0] *= al0; acc[i][1] *= al0; acc[i][2] *= al1; acc[i][3] *= al1;
      }
      // O += P V: the score accumulators of two key octets form one A fragment of P.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        u32 pa[4];
        pa[0] = pack2(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack2(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          u32 b0, b1, b2, b3;
          const int r = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
          const int col = dp * 16 + 8 * (lane / 16);
          ldmatrix_x4_trans(b0, b1, b2, b3, smem_addr(vs + r * LDS + col));
          mma16816(acc[2 * dp], pa, b0, b1);
          mma16816(acc[2 * dp + 1], pa, b2, b3);
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before it is refilled
    walk.next();
  }
  cp_async_wait<0>();

  if (!warp_real) return;
  l0 = warp_quad_sum(l0);
  l1 = warp_quad_sum(l1);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const float lse0 = l0 > 0.f ? (m0 + __log2f(l0)) * LN2 : NEG_INF;
  const float lse1 = l1 > 0.f ? (m1 + __log2f(l1)) * LN2 : NEG_INF;
  const bool real0 = tok0 < q_end, real1 = tok1 < q_end;
  if (slot < 0) {
    u16* o0 = o_ptr + b * o_sb + head * o_sh + tok0 * o_sl;
    u16* o1 = o_ptr + b * o_sb + head * o_sh + tok1 * o_sl;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      if (real0) *reinterpret_cast<u32*>(o0 + col) = pack2(acc[nt][0] * inv0, acc[nt][1] * inv0);
      if (real1) *reinterpret_cast<u32*>(o1 + col) = pack2(acc[nt][2] * inv1, acc[nt][3] * inv1);
    }
    if (lse_ptr != nullptr && t == 0) {
      float* lrow = lse_ptr + b * lse_sb + head * lse_sh;
      if (real0) lrow[tok0] = lse0;
      if (real1) lrow[tok1] = lse1;
    }
  } else {
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    float* p0 = part_o + ((i64)slot * BM + r0) * D;
    float* p1 = part_o + ((i64)slot * BM + r1) * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      if (real0) *reinterpret_cast<float2*>(p0 + col) = make_float2(acc[nt][0] * inv0, acc[nt][1] * inv0);
      if (real1) *reinterpret_cast<float2*>(p1 + col) = make_float2(acc[nt][2] * inv1, acc[nt][3] * inv1);
    }
    if (t == 0) {
      if (real0) part_lse[(i64)slot * BM + r0] = lse0;
      if (real1) part_lse[(i64)slot * BM + r1] = lse1;
    }
  }
}
