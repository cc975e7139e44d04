// Pooled top-k mask making on the device (tessera/families/pooled_topk.py): the mean of q and of k
// over each cube of tokens, the cubes' scores (pooled q . pooled k), and per query cube the k
// highest-scoring key cubes as one row of the block mask. Three launches and no library call,
// so a mask made each step stays inside a CUDA graph being captured (CuPy takes no cuBLAS call
// there), and no float32 copy of q or k is ever made.
//
// Variant parameters (Config): F32 1: q and k hold float32; 0: 16-bit values, BF16 as in
// common/element.cuh.
#include "variant.cuh"
#include "common/element.cuh"

namespace {
typedef Select<Config::F32 != 0, float, u16>::type Elem;
__device__ __forceinline__ float elem_float(float x) { return x; }
__device__ __forceinline__ float elem_float(u16 x) { return to_float(x); }

// Float bits as an unsigned key in the floats' order (larger float, larger key); NaN below every
// number, so that a NaN score is the last one kept.
__device__ __forceinline__ u32 order_key(float x) {
  const u32 u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
}  // namespace

// out[b, h, c, :] = the mean of x[b, h, t, :] over the tokens t of cube c: positions
// bounds[c] .. bounds[c+1] of `tokens` (the cube order's token indices), or the positions
// themselves where `tokens` is null (tokens already in the cube order). Grid (cubes, B * H),
// D threads (one per element of a row: each warp reads whole rows). (No __launch_bounds__:
// with one, ptxas 13.0 keeps this loop to 32-40 registers and spills.)
extern "C" __global__ void
cube_pool(const Elem* __restrict__ x, i64 x_sb, i64 x_sh, i64 x_sl, int heads, int dim,
          const i64* __restrict__ tokens, const i64* __restrict__ bounds, int cubes,
          float* __restrict__ out) {
  const int c = blockIdx.x, bh = blockIdx.y, d = threadIdx.x;
  if (d >= dim) return;
  const int b = bh / heads, h = bh % heads;
  const Elem* base = x + b * x_sb + h * x_sh + d;
  const i64 t0 = bounds[c], t1 = bounds[c + 1];
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;  // four sums in flight: the loads overlap
  const int n_tok = (int)(t1 - t0);
  const i64* tok = tokens != nullptr ? tokens + t0 : nullptr;
  int t = 0;
  for (; t + 4 <= n_tok; t += 4) {
    i64 r0 = t0 + t, r1 = r0 + 1, r2 = r0 + 2, r3 = r0 + 3;
    if (tok != nullptr) {
      r0 = tok[t];
      r1 = tok[t + 1];
      r2 = tok[t + 2];
      r3 = tok[t + 3];
    }
    a0 += elem_float(base[r0 * x_sl]);
    a1 += elem_float(base[r1 * x_sl]);
    a2 += elem_float(base[r2 * x_sl]);
    a3 += elem_float(base[r3 * x_sl]);
  }
  for (; t < n_tok; ++t) a0 += elem_float(base[(tok != nullptr ? tok[t] : t0 + t) * x_sl]);
  const float n = (float)n_tok;
  out[((i64)bh * cubes + c) * dim + d] = n > 0.f ? ((a0 + a1) + (a2 + a3)) / n : 0.f;
}

// scores[b, h, i, j] = scale * (pq[b, h, i, :] . pk[b, h / group, j, :]), float32: one CTA of 256
// threads a 64 x 64 tile of scores, each thread 4 x 4 of them, D taken 16 at a time through
// shared memory. Grid (ceil(n_k / 64), ceil(n_q / 64), B * H).
constexpr int SC_TILE = 64, SC_STEP = 16;
extern "C" __global__ void __launch_bounds__(256)
cube_scores(const float* __restrict__ pq, const float* __restrict__ pk, int heads, int group,
            int n_q, int n_k, int dim, float scale, float* __restrict__ scores) {
  __shared__ float qs[SC_STEP][SC_TILE + 4];  // [d][row]: a thread reads 4 rows as one float4
  __shared__ float ks[SC_STEP][SC_TILE + 4];
  const int bh = blockIdx.z, b = bh / heads, h = bh % heads;
  const int kvh = b * (heads / group) + h / group;
  const float* q = pq + (i64)bh * n_q * dim;
  const float* k = pk + (i64)kvh * n_k * dim;
  const int i0 = blockIdx.y * SC_TILE, j0 = blockIdx.x * SC_TILE;
  const int tid = threadIdx.x, ti = tid / 16, tj = tid % 16;
  float acc[4][4] = {};
  for (int d0 = 0; d0 < dim; d0 += SC_STEP) {
    // 64 rows x 16 columns of each operand: 4 elements a thread, zeros past the ends
    for (int e = tid; e < SC_TILE * SC_STEP; e += 256) {
      const int r = e / SC_STEP, dd = e % SC_STEP;
      const bool in_d = d0 + dd < dim;
      qs[dd][r] = (i0 + r < n_q && in_d) ? q[(i64)(i0 + r) * dim + d0 + dd] : 0.f;
      ks[dd][r] = (j0 + r < n_k && in_d) ? k[(i64)(j0 + r) * dim + d0 + dd] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int dd = 0; dd < SC_STEP; ++dd) {
      const float4 a = *reinterpret_cast<const float4*>(&qs[dd][ti * 4]);
      const float4 c = *reinterpret_cast<const float4*>(&ks[dd][tj * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, cv[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) acc[u][w] = fmaf(av[u], cv[w], acc[u][w]);
    }
    __syncthreads();
  }
  float* s = scores + (i64)bh * n_q * n_k;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int i = i0 + ti * 4 + u;
    if (i >= n_q) continue;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int j = j0 + tj * 4 + w;
      if (j < n_k) s[(i64)i * n_k + j] = acc[u][w] * scale;
    }
  }
}

// Row r of `scores` ([rows, n] float32) -> row r of the bool mask `out` (row r at
// out + (r / rows_per_head) * head_stride + (r % rows_per_head) * row_stride): its `keep`
// highest scores selected, ties at the threshold taken in column order, NaN scores last. An
// exact radix select (four passes of 8 bits over the scores' order keys, each a 256-bin
// histogram), then one pass writing the row. One CTA of 256 threads a row.
extern "C" __global__ void __launch_bounds__(256)
topk_rows(const float* __restrict__ scores, int n, int keep, int rows_per_head,
          i64 head_stride, i64 row_stride, unsigned char* __restrict__ out) {
  __shared__ u32 hist[256];
  __shared__ u32 chosen[2];  // the digit found, the count still to take at or below it
  __shared__ u32 warp_eq[8];
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float* row = scores + (i64)r * n;
  unsigned char* dst = out + (i64)(r / rows_per_head) * head_stride +
                       (i64)(r % rows_per_head) * row_stride;
  u32 prefix = 0, known = 0;  // the threshold's bits found so far, and which bits they are
  u32 need = (u32)(keep < n ? keep : n);
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[tid] = 0;
    __syncthreads();
    for (int j = tid; j < n; j += 256) {
      const u32 key = order_key(row[j]);
      if ((key & known) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      u32 above = 0, digit = 0;
      for (int bin = 255; bin >= 0; --bin) {
        if (above + hist[bin] >= need) {
          digit = (u32)bin;
          break;
        }
        above += hist[bin];
      }
      chosen[0] = digit;
      chosen[1] = need - above;
    }
    __syncthreads();
    prefix |= chosen[0] << shift;
    known |= 255u << shift;
    need = chosen[1];
    __syncthreads();  // (hist and chosen are rewritten by the next pass)
  }
  // Every key above `prefix` is kept, and the first `need` keys equal to it in column order.
  u32 taken = 0;  // keys equal to the threshold before this 256-column step
  for (int j0 = 0; j0 < n; j0 += 256) {
    const int j = j0 + tid;
    const u32 key = j < n ? order_key(row[j]) : 0u;
    const bool eq = j < n && key == prefix;
    const u32 ballot = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) warp_eq[warp] = __popc(ballot);
    __syncthreads();
    u32 before = taken;
    for (int w = 0; w < warp; ++w) before += warp_eq[w];
    before += __popc(ballot & ((1u << lane) - 1u));
    if (j < n) dst[j] = (unsigned char)(key > prefix || (eq && before < need));
    u32 step = 0;
    for (int w = 0; w < 8; ++w) step += warp_eq[w];
    taken += step;
    __syncthreads();  // (warp_eq is rewritten by the next step)
  }
}
