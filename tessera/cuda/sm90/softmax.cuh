// The Hopper family's softmax around the shared step (common/softmax.cuh): where its
// exponentials sit against the wait for the previous chunk's P V, and O's rescale.
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
}  // namespace
