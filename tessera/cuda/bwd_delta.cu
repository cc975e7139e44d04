// The backward pass's first kernel on every GPU: Delta = rowsum(dO * O) per query row, in
// float32, from the forward's output and the output gradient (tessera/backward_launch.py launches
// it before the dK/dV and dQ kernels). Variant parameters: Config::D, Config::BF16.
#include "variant.cuh"
#include "common/element.cuh"

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

