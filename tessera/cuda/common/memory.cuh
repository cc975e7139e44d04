// Shared-memory addresses and the sm_80+ asynchronous copies both families load tiles with.
#pragma once

#include "common/types.cuh"

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// 16-byte asynchronous global->shared copy (L2 only: the tile is used once per CTA).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
// The same, BYTES past src: one base address serves a row's pieces (an immediate offset in the
// instruction instead of a 64-bit address register pair per piece).
template <int BYTES>
__device__ __forceinline__ void cp_async16_at(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1+%2], 16;" ::"r"(dst), "l"(src), "n"(BYTES));
}
// 4-byte asynchronous global->shared copy (per-row floats: the backward's LSE and Delta).
__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
