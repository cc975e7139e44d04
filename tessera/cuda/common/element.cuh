// The 16-bit element type of a variant (Config::BF16: 1 bfloat16, 0 float16). Values travel as
// raw 16-bit patterns; only these conversions, the non-finite checks (guard.cuh) and the matrix
// instructions care which one it is.
#pragma once

#include "variant.cuh"
#include "common/types.cuh"

__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
  if constexpr (Config::BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float to_float(u16 x) {
  if constexpr (Config::BF16) {
    return __uint_as_float(((u32)x) << 16);
  } else {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
  }
}
