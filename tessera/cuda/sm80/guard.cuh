// Non-finite values in rows a span does not select (common/guard.cuh), the portable family's
// way: V's non-finite values zeroed in place, their columns' classes kept for the rows the span
// applies to.
#pragma once

#include "common/guard.cuh"
#include "sm80/traits.cuh"

namespace {
// The V tile's non-finite values are zeroed in place and their classes kept per column, 4 bits
// a column (NONFINITE_*), 8 columns a word, in the padding of the tile's first rows (LDS - D
// spare elements a row: no copy reads them).
constexpr int FLAG_WORDS = D / 8;
static_assert(FLAG_WORDS <= 4 * BN && (LDS - D) * 2 >= 16, "the flags fit in V's row padding");
__device__ __forceinline__ u32 flag_word(u32 vs, int w) {
  return vs + (u32)(((w / 4) * LDS + D) * 2 + (w % 4) * 4);
}

// Zeroes the Inf and NaN values of the V tile at vs and records their columns' classes; true
// (for every thread of the CTA) when there were any. Called by every thread, after the tile
// has landed and a barrier.
__device__ __noinline__ bool guard_values(u32 vs, int tid) {
  if (tid < FLAG_WORDS) asm volatile("st.shared.u32 [%0], 0;" ::"r"(flag_word(vs, tid)) : "memory");
  __syncthreads();
  u32 found = 0;
#pragma unroll 1
  for (int i = tid; i < BN * D / 2; i += NT) {
    const int row = i / (D / 2), col = i % (D / 2) * 2;
    const u32 at = vs + (u32)((row * LDS + col) * 2);
    u32 x;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(x) : "r"(at));
    const u32 bad = non_finite_pair(x);
    if (bad) {
      found = 1;
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(x & ~bad) : "memory");
      const u32 bits = (non_finite_class((u16)x) << (4 * (col % 8))) |
                       (non_finite_class((u16)(x >> 16)) << (4 * (col % 8 + 1)));
      asm volatile("red.shared.or.b32 [%0], %1;" ::"r"(flag_word(vs, col / 8)), "r"(bits)
                   : "memory");
    }
  }
  return __syncthreads_or(found) != 0;
}

// What column 8 * w + c of the guarded V tile adds to a row that selects all its keys: 0, or
// the sum of its non-finite values (Inf, -Inf or NaN).
__device__ __forceinline__ float column_non_finite(u32 vs, int w, int c) {
  u32 f;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(f) : "r"(flag_word(vs, w)));
  return non_finite_sum((f >> (4 * c)) & 0xfu);
}
}  // namespace
