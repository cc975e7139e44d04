// Integer and float helpers every kernel shares, written without CUDA headers (NVRTC compiles
// these sources with none of the toolkit's include files).
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

// -inf without <math.h>.
#define NEG_INF __int_as_float(0xff800000u)

// Row `row` of [B, H, L] rows taken in order (the row-wise kernels: a warp or a thread group a
// row): its batch, head and token, and its (batch, head) index b * heads + h.
struct FlatRow {
  i64 bh;
  int b, h, tok;
  __device__ __forceinline__ FlatRow(i64 row, int heads, int seq)
      : bh(row / seq), b((int)(bh / heads)), h((int)(bh % heads)), tok((int)(row % seq)) {}
};

// A if C, else B: a type chosen by a variant's parameter (std::conditional without <type_traits>).
template <bool C, typename A, typename B>
struct Select {
  using type = A;
};
template <typename A, typename B>
struct Select<false, A, B> {
  using type = B;
};

// f(Index<0>{}), ..., f(Index<N - 1>{}): an unrolled loop whose index is a constant expression
// in the body (a template argument, an asm immediate).
template <int I>
struct Index {
  static constexpr int value = I;
};
template <int N, int I = 0, typename F>
__device__ __forceinline__ void static_for(const F& f) {
  if constexpr (I < N) {
    f(Index<I>{});
    static_for<N, I + 1>(f);
  }
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float warp_quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
