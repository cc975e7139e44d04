// The epilogue both families end a task with: normalise the rows, store them with their
// log-sum-exp, to the output or to a split-KV workspace slot.
#pragma once

#include "common/element.cuh"

// Where a task's rows go: the output and lse (slot < 0) or a split-KV workspace slot.
struct Output {
  u16* o;
  i64 sb, sh, sl;
  float* lse;  // may be null
  i64 lse_sb, lse_sh;
  float* part_o;
  float* part_lse;
};

// Normalise and store the two rows (tokens tok0 and tok0 + 8 of query head `head`; physical rows
// row0 and row0 + 8 of a bm-row task) a thread holds; rows at or past q_end are padding.
template <int D_>
__device__ __forceinline__ void store_rows(const Output& out, const float (&acc)[D_ / 8][4],
                                           const float (&m)[2], const float (&l)[2], int b,
                                           int head, int tok0, int q_end, int row0, int bm,
                                           int slot, int t) {
  constexpr float LN2 = 0.69314718055994530942f;
  const float l0 = warp_quad_sum(l[0]), l1 = warp_quad_sum(l[1]);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const float lse0 = l0 > 0.f ? (m[0] + __log2f(l0)) * LN2 : NEG_INF;
  const float lse1 = l1 > 0.f ? (m[1] + __log2f(l1)) * LN2 : NEG_INF;
  const int tok1 = tok0 + 8;
  const bool real0 = tok0 < q_end, real1 = tok1 < q_end;
  if (slot < 0) {
    u16* o0 = out.o + b * out.sb + head * out.sh + tok0 * out.sl;
    u16* o1 = out.o + b * out.sb + head * out.sh + tok1 * out.sl;
#pragma unroll
    for (int nt = 0; nt < D_ / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      if (real0) *reinterpret_cast<u32*>(o0 + col) = pack2(acc[nt][0] * inv0, acc[nt][1] * inv0);
      if (real1) *reinterpret_cast<u32*>(o1 + col) = pack2(acc[nt][2] * inv1, acc[nt][3] * inv1);
    }
    if (out.lse != nullptr && t == 0) {
      float* lrow = out.lse + b * out.lse_sb + head * out.lse_sh;
      if (real0) lrow[tok0] = lse0;
      if (real1) lrow[tok1] = lse1;
    }
  } else {
    const int row1 = row0 + 8;
    float* p0 = out.part_o + ((i64)slot * bm + row0) * D_;
    float* p1 = out.part_o + ((i64)slot * bm + row1) * D_;
#pragma unroll
    for (int nt = 0; nt < D_ / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      if (real0) *reinterpret_cast<float2*>(p0 + col) = make_float2(acc[nt][0] * inv0, acc[nt][1] * inv0);
      if (real1) *reinterpret_cast<float2*>(p1 + col) = make_float2(acc[nt][2] * inv1, acc[nt][3] * inv1);
    }
    if (t == 0) {
      if (real0) out.part_lse[(i64)slot * bm + row0] = lse0;
      if (real1) out.part_lse[(i64)slot * bm + row1] = lse1;
    }
  }
}
