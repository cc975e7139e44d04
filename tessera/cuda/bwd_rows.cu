// The backward pass's row-wise kernels on every GPU (tessera/backward_launch.py launches them):
// first Delta = rowsum(dO * O) per query row, in float32, from the forward's output and the
// output gradient; last, where the dK/dV kernel summed dQ by atomics, dQ from those sums.
// Variant parameters: Config::D, Config::BF16.
#include "variant.cuh"
#include "common/backward.cuh"

namespace {
constexpr int D = Config::D;
}  // namespace

// Delta, contiguous [B, Hq, Lq]; one warp a row.
extern "C" __global__ void __launch_bounds__(256)
bsa_bwd_delta(const u16* o_ptr, i64 o_sb, i64 o_sh, i64 o_sl, const u16* do_ptr, i64 do_sb,
              i64 do_sh, i64 do_sl, float* delta, int num_q_heads, int seq_q, i64 rows) {
  const i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const FlatRow r(row, num_q_heads, seq_q);
  const u16* o = o_ptr + r.b * o_sb + r.h * o_sh + r.tok * o_sl;
  const u16* d = do_ptr + r.b * do_sb + r.h * do_sh + r.tok * do_sl;
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


// dQ = scale * the float32 sums (contiguous [B, Hq, Lq, D], each row's columns permuted by
// dq_sum_column) in the element type at dQ's strides; a thread per four columns of a row (a
// permutation of 32-byte pieces keeps four columns together).
extern "C" __global__ void __launch_bounds__(256)
bsa_bwd_dq_convert(const float* __restrict__ sums, u16* dq_ptr, i64 dq_sb, i64 dq_sh, i64 dq_sl,
                   int num_q_heads, int seq_q, i64 rows, float scale) {
  constexpr int QUADS = D / 4;
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 row = i / QUADS;
  if (row >= rows) return;
  const int c = 4 * (int)(i % QUADS);
  const FlatRow r(row, num_q_heads, seq_q);
  const float4 x = *reinterpret_cast<const float4*>(sums + row * D + dq_sum_column(r.tok, c));
  const uint2 packed = {pack2(x.x * scale, x.y * scale), pack2(x.z * scale, x.w * scale)};
  *reinterpret_cast<uint2*>(dq_ptr + r.b * dq_sb + r.h * dq_sh + r.tok * dq_sl + c) = packed;
}
