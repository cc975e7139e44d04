// The Hopper family's mbarriers and bulk tensor copies (forward and backward): a copy by TMA
// completes on an mbarrier by its byte count, and the threads that read the tile wait on the
// barrier's phase.
#pragma once

#include "common/types.cuh"

namespace {
__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar)
               : "memory");
}
// Arrives on `bar` once every cp.async this thread issued before has completed (the TMA
// producer's copies complete on the barriers by byte count instead).
__device__ __forceinline__ void mbar_arrive_on_copies(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, int parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}" ::"r"(bar), "r"(parity) : "memory");
}
// Expects `bytes` more on `bar` (the TMA copies' completion) and arrives once.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}"
               ::"r"(bar), "r"(bytes) : "memory");
}

// One box of a 4-D tensor map (coordinates innermost first) into shared memory at `dst`,
// completing on `bar` with its byte count.
__device__ __forceinline__ void tma_load_4d(u32 dst, const void* map, int c0, int c1, int c2,
                                            int c3, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3), "r"(bar) : "memory");
}
}  // namespace
