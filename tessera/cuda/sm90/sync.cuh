// How the Hopper forward's threads wait for one another: mbarriers (stage and Q hand-overs
// between producer and consumers: barriers.cuh), named barriers (the consumers' issue turns),
// and the register reallocation between producer and consumers (the async-proxy fence:
// layout.cuh).
#pragma once

#include "sm90/barriers.cuh"
#include "sm90/traits.cuh"

namespace {
// threadIdx.x, read anew where it is used (not a value the compiler may keep live, or spill).
__device__ __forceinline__ int thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Named barriers order the consumer warpgroups' matrix work: warpgroup w issues its wgmma only
// after warpgroup w - 1 has issued its own, so the tensor cores run one warpgroup's products
// while the others compute their softmax. With a CTA barrier every key step (no producer, two
// warpgroups) one barrier suffices; without it the turns go round strictly on WGS barriers
// (barrier 1 + w: warpgroup w's turn, passed on by w - 1), so none runs a step ahead.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void wait_issue_turn(int wg) {
  if constexpr (WGS > 1) {
    if (WS) named_bar_sync(1 + wg, 256);
    else if (wg == 1) named_bar_sync(1, 256);
  }
}
__device__ __forceinline__ void pass_issue_turn(int wg) {
  if constexpr (WGS > 1) {
    if (WS) named_bar_arrive(1 + (wg + 1) % WGS, 256);
    else if (wg == 0) named_bar_arrive(1, 256);
  }
}

// Register reallocation (PRODUCER_REGS, CONSUMER_REGS: traits.cuh).
template <int REGS>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}
}  // namespace
