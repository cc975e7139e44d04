// Split-KV combine: merges the partial outputs of a split tile by log-sum-exp, in part order, so
// the result does not depend on which part finished first. A grid of combine jobs
// (tessera/runtime/tasks.py) by groups of eight rows, one warp a physical row: each row is a
// short chain of dependent loads, so the rows run side by side across the GPU, not one after
// another in a warp (docs/decisions.md). Variant parameter: Config::BF16.
#include "variant.cuh"
#include "common/element.cuh"
#include "queue.cuh"

extern "C" __global__ void __launch_bounds__(256)
bsa_combine(const int* __restrict__ jobs, const float* __restrict__ part_o,
            const float* __restrict__ part_lse, u16* o_ptr, i64 o_sb, i64 o_sh, i64 o_sl,
            float* lse_ptr, i64 lse_sb, i64 lse_sh, int block_m, int dv, int tile_rows) {
  const int* job = jobs + (i64)blockIdx.x * COMBINE_FIELDS;
  const int b = job[COMBINE_BATCH], h0 = job[COMBINE_Q_HEAD0];
  const int q_start = job[COMBINE_Q_START], q_end = job[COMBINE_Q_END];
  const int slot0 = job[COMBINE_SLOT_BEGIN], parts = job[COMBINE_PARTS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  for (int r = blockIdx.y * nwarps + warp; r < block_m; r += nwarps * gridDim.y) {
    const int tok = q_start + r % tile_rows, head = h0 + r / tile_rows;
    if (tok >= q_end) continue;
    float mx = NEG_INF;
    for (int p = 0; p < parts; ++p) mx = fmaxf(mx, part_lse[(i64)(slot0 + p) * block_m + r]);
    const float base = mx == NEG_INF ? 0.f : mx;
    float wsum = 0.f;
    for (int p = 0; p < parts; ++p) wsum += expf(part_lse[(i64)(slot0 + p) * block_m + r] - base);
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    u16* orow = o_ptr + b * o_sb + head * o_sh + tok * o_sl;
    for (int d = lane * 2; d < dv; d += 64) {
      float a0 = 0.f, a1 = 0.f;
      for (int p = 0; p < parts; ++p) {
        const float w = expf(part_lse[(i64)(slot0 + p) * block_m + r] - base);
        if (w == 0.f) continue;  // a part that saw no key for this row holds no partial
        const float2 x = *reinterpret_cast<const float2*>(
            part_o + ((i64)(slot0 + p) * block_m + r) * dv + d);
        a0 += w * x.x;
        a1 += w * x.y;
      }
      *reinterpret_cast<u32*>(orow + d) = pack2(a0 * inv, a1 * inv);
    }
    if (lse_ptr != nullptr && lane == 0)
      lse_ptr[b * lse_sb + head * lse_sh + tok] = wsum > 0.f ? base + logf(wsum) : NEG_INF;
  }
}
