// The Hopper family's softmax around the shared step (common/softmax.cuh): where its
// exponentials sit against the wait for the previous chunk's P V, and O's rescale; and the
// 8-bit form's (INT8) own step: scores from int32 products, P rounded to u8 against the chunk's
// row maxima, the int32 P V folded into O.
#pragma once

#include "common/softmax.cuh"
#include "sm90/traits.cuh"

namespace {
// ptxas places the wait for P_{j-1} V_{j-1} ahead of the softmax's exponentials whatever the
// source order (the SASS of every variant: the wait lands within the row-max reduction), so
// they run only once P V is done. It keeps the wait behind a shared-memory store, so one that
// takes the first exponentials holds part of them ahead of it; the rest then issue after the
// wait with P's conversions between them (as FlashAttention-4's sm90 loop has it), where a
// store of the row sums held every exponential ahead and left the 32 conversions to run alone
// after the wait (docs/decisions.md). The store never executes: its predicate, a negative
// value, is never true (exponentials times the positive scale, launch.check_scale, are >= 0
// or NaN; the scale is there because ptxas knows an exponential is never negative and would
// drop the store), so `addr` is never written.
__device__ __forceinline__ void order_wait_after(u32 addr, float x) {
  asm volatile("{\n.reg .pred p;\nsetp.lt.f32 p, %1, 0f00000000;\n@p st.shared.f32 [%0], %1;\n}"
               ::"r"(addr), "f"(x) : "memory");
}

// O's rows times their factors from the chunk's softmax (al), skipped when neither moved.
__device__ __forceinline__ void rescale_o(float (&o)[D / 8][4], const float (&al)[2]) {
  if (al[0] != 1.f || al[1] != 1.f) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o[i][0] *= al[0]; o[i][1] *= al[0];
      o[i][2] *= al[1]; o[i][3] *= al[1];
    }
  }
}

// ---- the 8-bit form (INT8) ------------------------------------------------------------------

// An int32 product as a float, exactly for |x| < 2^22: x added to the bits of 1.5 x 2^23 is a
// float whose last 23 bits hold 2^22 + x, less 1.5 x 2^23 is x -- an integer add and a float add
// where a conversion instruction issues at a quarter of their rate. S's products stay below
// 127^2 x 128 = 2,064,512 and P V's below 255 x 127 x 128 = 4,145,280 (steps of <= 128 keys).
__device__ __forceinline__ float exact_float(int x) {
  return __int_as_float(x + 0x4B400000) - 12582912.f;
}

// The chunk's scores in log2 units from S's int32 products: the product times the key's step
// (the stage's K steps, k_steps) times the row's step and the scale (qsl).
template <int NB>
__device__ __forceinline__ void int8_scores(const int (&si)[NB][4], float (&s)[NB][4],
                                            u32 k_steps, const float (&qsl)[2], int t) {
#pragma unroll
  for (int nt = 0; nt < NB; ++nt) {
    float k0, k1;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                 : "=f"(k0), "=f"(k1) : "r"(k_steps + 4u * (u32)(8 * nt + 2 * t)));
    s[nt][0] = exact_float(si[nt][0]) * k0 * qsl[0];
    s[nt][1] = exact_float(si[nt][1]) * k1 * qsl[0];
    s[nt][2] = exact_float(si[nt][2]) * k0 * qsl[1];
    s[nt][3] = exact_float(si[nt][3]) * k1 * qsl[1];
  }
}

// One chunk of the 8-bit form for the thread's two rows: s holds scores in log2 units of the
// keys start + c (masked here: keys outside [k_lo, k_end), rows whose ok flag is false; the
// chunk's first column sits at a multiple of 16 keys, at or below the span's start k_lo). P is
// taken against each row's own maximum over the chunk (cm), so the chunk's largest P rounds to
// 255 whatever the running max m: s becomes P in [0, 1], f the factor P V's int32 sum is folded
// into O by, exp2(cm - m) / 255, and l gains P's sum times exp2(cm - m) -- the unrounded P, as
// the oracle (tessera/quantization.py) sums it. m moves as softmax_chunk's does (by more than
// RESCALE_SLACK), al the factor O is multiplied by then.
template <int NB>
__device__ __forceinline__ void softmax_chunk8(float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                               float (&al)[2], float (&f)[2], int start,
                                               int k_lo, int k_end, bool ok0, bool ok1, int t) {
  mask_scores<NB, true>(s, start, k_end, ok0, ok1, t, k_lo);
  float cm[2];
  thread_row_maxima(s, cm[0], cm[1]);
  cm[0] = warp_quad_max(cm[0]);
  cm[1] = warp_quad_max(cm[1]);
  float base[2], g[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    al[i] = 1.f;
    if (cm[i] > m[i] + RESCALE_SLACK) {  // (never true for a row with nothing in the chunk)
      al[i] = fast_exp2(m[i] - cm[i]);  // 0 while m is -inf: O and l are 0 then
      m[i] = cm[i];
    }
    // A row with nothing unmasked in the chunk: P = exp2(-inf) = 0 and nothing to fold.
    const bool none = cm[i] == NEG_INF;
    base[i] = none ? 0.f : cm[i];
    g[i] = none ? 0.f : fast_exp2(cm[i] - m[i]);
  }
  float r0[NB], r1[NB];
#pragma unroll
  for (int nt = 0; nt < NB; ++nt) {
    s[nt][0] = fast_exp2(s[nt][0] - base[0]);
    s[nt][1] = fast_exp2(s[nt][1] - base[0]);
    s[nt][2] = fast_exp2(s[nt][2] - base[1]);
    s[nt][3] = fast_exp2(s[nt][3] - base[1]);
    r0[nt] = s[nt][0] + s[nt][1];
    r1[nt] = s[nt][2] + s[nt][3];
  }
  const auto add = [](float a, float b) { return a + b; };
  l[0] = l[0] * al[0] + tree_reduce<NB>(r0, add) * g[0];
  l[1] = l[1] * al[1] + tree_reduce<NB>(r1, add) * g[1];
  f[0] = g[0] * (1.f / 255.f);
  f[1] = g[1] * (1.f / 255.f);
}

// Four P values in [0, 1] as u8 codes round(255 p) (ties to even: the float add rounds), packed
// low byte first: each value plus 1.5 x 2^23 holds its code in its low byte.
__device__ __forceinline__ u32 pack_u8x4(float a, float b, float c, float d) {
  const auto code = [](float p) { return __float_as_uint(fmaf(p, 255.f, 12582912.f)); };
  return __byte_perm(__byte_perm(code(a), code(b), 0x0040), __byte_perm(code(c), code(d), 0x0040),
                     0x5410);
}

// The u8 A fragment (m16k32) of P for keys 32 kk .. 32 kk + 31 of the chunk: register i holds
// row g (+8 for odd i) at fragment columns 4t .. 4t + 3 (+16 for i >= 2), which V's key order
// (quantize_launch.v_key_order) makes keys 2t, 2t + 1 of one octet and of the next -- the
// thread's own accumulators.
template <int NB>
__device__ __forceinline__ void p8_fragment(u32 (&pa)[4], const float (&s)[NB][4], int kk) {
  const int o = 4 * kk;
  pa[0] = pack_u8x4(s[o][0], s[o][1], s[o + 1][0], s[o + 1][1]);
  pa[1] = pack_u8x4(s[o][2], s[o][3], s[o + 1][2], s[o + 1][3]);
  pa[2] = pack_u8x4(s[o + 2][0], s[o + 2][1], s[o + 3][0], s[o + 3][1]);
  pa[3] = pack_u8x4(s[o + 2][2], s[o + 2][3], s[o + 3][2], s[o + 3][3]);
}

// O += the previous chunk's int32 P V times its rows' factors (f, from softmax_chunk8).
__device__ __forceinline__ void fold_pv(float (&o)[D / 8][4], const int (&pv)[D / 8][4],
                                        const float (&f)[2]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    o[i][0] = fmaf(exact_float(pv[i][0]), f[0], o[i][0]);
    o[i][1] = fmaf(exact_float(pv[i][1]), f[0], o[i][1]);
    o[i][2] = fmaf(exact_float(pv[i][2]), f[1], o[i][2]);
    o[i][3] = fmaf(exact_float(pv[i][3]), f[1], o[i][3]);
  }
}
}  // namespace
