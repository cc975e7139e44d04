// Non-finite values in rows a span does not select: what both families check and keep out of
// their products.
#pragma once

#include "common/element.cuh"

// Where a span applies to some of a tile's rows only (combined short query blocks, aligned
// tiles), the other rows' P is 0 for its keys, yet P V is one matrix product: an Inf or NaN in
// those keys' V would turn 0 x Inf into NaN in rows whose reference output is finite. A chunk
// of such a span has its V checked (rare chunks; V is in shared memory already); only when it
// holds a non-finite value does the kernel keep the excluded rows out of that product (a copy
// of their accumulators taken back after it, or a product over V with those values zeroed that
// the other rows then add back).

// Config::GUARD 1 (the default) builds that check; 0 leaves it out, for the variants of regimes
// whose plans restrict no span to some of a tile's rows (Regime.restricts_rows).
constexpr bool GUARD = Config::GUARD;

// Nonzero when either 16-bit half of x is an Inf or a NaN (every exponent bit set).
__device__ __forceinline__ u32 non_finite_pair(u32 x) {
  constexpr u32 EXP = Config::BF16 ? 0x7f807f80u : 0x7c007c00u;
  return __vcmpeq2(x & EXP, EXP);
}

// Nonzero when the 32-bit word at shared address a holds a non-finite value. (One word at a
// time: the scan runs beside accumulators that fill the register file.)
__device__ __forceinline__ u32 non_finite_word(u32 a) {
  u32 x;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(x) : "r"(a));
  return non_finite_pair(x);
}

// Which of the thread's two rows (bit 0: row g, bit 1: row g + 8) a span excludes.
__device__ __forceinline__ int excluded_rows(int t0, int lo, int hi) {
  const int t1 = t0 + 8;
  return (t0 >= lo && t0 < hi ? 0 : 1) | (t1 >= lo && t1 < hi ? 0 : 2);
}

// The class of a non-finite 16-bit value: NONFINITE_NAN, _POS (Inf) or _NEG (-Inf); 0 if finite.
constexpr u32 NONFINITE_POS = 1, NONFINITE_NEG = 2, NONFINITE_NAN = 4;
__device__ __forceinline__ u32 non_finite_class(u16 h) {
  constexpr u32 EXP = Config::BF16 ? 0x7f80u : 0x7c00u, MANT = Config::BF16 ? 0x007fu : 0x03ffu;
  if ((h & EXP) != EXP) return 0;
  if (h & MANT) return NONFINITE_NAN;
  return (h & 0x8000u) ? NONFINITE_NEG : NONFINITE_POS;
}

// The sum of values of the classes in `classes` (an or of non_finite_class results).
__device__ __forceinline__ float non_finite_sum(u32 classes) {
  if (classes == 0) return 0.f;
  if ((classes & NONFINITE_NAN) || classes == (NONFINITE_POS | NONFINITE_NEG))
    return __int_as_float(0x7fc00000);
  return (classes & NONFINITE_POS) ? __int_as_float(0x7f800000) : NEG_INF;
}
