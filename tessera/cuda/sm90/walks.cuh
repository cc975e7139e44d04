// The Hopper family's walks over a task's key spans, beyond the shared ones (common/walk.cuh):
// the chunk fields the TMA producer stages for the consumers, the whole-span walk by
// arithmetic, the wide step's choice, and which walk each side takes.
#pragma once

#include "sm90/traits.cuh"

namespace {
// A step width as a type, so that one template holds a task's loop for either width.
template <int W>
struct Step {
  static constexpr int keys = W;
};

// Whether a task takes the wide step (WIDE_BN): at most WIDE_SPANS spans, whose keys
// rounded up to WIDE_BN-key steps exceed those rounded to BN-key steps by at most 1/WIDE_SLACK.
__device__ __forceinline__ bool wide_task(const int* spans, int sb, int se) {
  if (!WIDE || se - sb > WIDE_SPANS) return false;
  // Key counts below 2^31 (the sequence-length limit) plus a few steps' padding: unsigned fits.
  u32 narrow = 0, wide = 0;
#pragma unroll
  for (int i = 0; i < WIDE_SPANS; ++i) {
    if (sb + i < se) {
      const int* f = spans + (i64)(sb + i) * SPAN_FIELDS;
      const u32 len = (u32)(f[SPAN_K_END] - f[SPAN_K_START]);
      narrow += (len + BN - 1) / BN * BN;
      wide += (len + KV_ROWS - 1) / KV_ROWS * KV_ROWS;
    }
  }
  return wide <= narrow + narrow / WIDE_SLACK;
}

// With TMA copies the producer writes each chunk's key range and its span's row restriction
// into a 16-byte word beside the chunk's stage (before the arrive that completes the stage's
// full barrier with the copies: the barrier's release and the consumers' acquiring wait order
// it), so the consumers never read the spans from global memory. Read there, the row
// restriction's loads sat between a chunk's wgmma issues (ptxas placed its compares there)
// and the next span's key range in the loop's back edge (moved into a uniform register): a
// global load's latency per span on the consumers' path, every chunk at 64-token blocks.
// The task's last chunk has key0's sign bit set (keys stay below 2^31).
constexpr int LAST_CHUNK = (int)0x80000000u;
__device__ __forceinline__ void stage_chunk_info(u32 at, int key0, int key_end, int row_lo,
                                                 int row_hi, bool last) {
  asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};" ::"r"(at),
               "r"(last ? key0 | LAST_CHUNK : key0), "r"(key_end), "r"(row_lo), "r"(row_hi)
               : "memory");
}
// The consumers' walk with STAGED_SPANS (ChunkWalk's interface): `read` takes a landed
// chunk's word; whether a chunk is left comes from the last word read (a task with no span
// has none).
struct StagedWalk {
  int k0, k1, lo, hi;
  bool left;
  __device__ __forceinline__ void open(const int*, int s, int se) { left = s < se; }
  __device__ __forceinline__ bool more(int) const { return left; }
  __device__ __forceinline__ void read(u32 at) {
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(k0), "=r"(k1), "=r"(lo), "=r"(hi) : "r"(at) : "memory");
    left = k0 >= 0;
    k0 &= ~LAST_CHUNK;
  }
  __device__ __forceinline__ void next(const int*, int) {}
  __device__ __forceinline__ int key0() const { return k0; }
  __device__ __forceinline__ int chunk_start() const { return k0 & -CHUNK_ALIGN; }
  __device__ __forceinline__ int key_end() const { return k1; }
  __device__ __forceinline__ int row_lo(const int*) const { return lo; }
  __device__ __forceinline__ int row_hi(const int*) const { return hi; }
};
// The walk the consumers compute a task's chunks by, for step width W.
template <int W>
using ConsumerWalkOf = typename Select<STAGED_SPANS, StagedWalk, ComputeWalkOf<W>>::type;

// A whole-span task: one span whose row restriction covers the tile's rows (every task of a
// dense mask, most of a band's or a window's). Its consumers step through the span by
// arithmetic instead of reading each chunk's word, and its bounds (INT_MIN / INT_MAX) fold the
// rows' clip and the non-finite guard away: per chunk one shared-memory read, its decoding and
// the restriction's compares fewer. The producer decides it per task and publishes it with the
// index; the stages' words it writes anyway go unread. Only the rings at head dim 64 take it:
// there the second loop buys 2.6-6.5% on dense and band masks and costs nothing on random
// ones; every other variant measured runs slower with both loops, on sparse masks by 0.3-2.5%
// (docs/decisions.md).
__device__ __forceinline__ bool whole_span_task(const int* spans, const Task& task) {
  if (!WHOLE_SPANS || task.span_end - task.span_begin != 1) return false;
  const int* f = spans + (i64)task.span_begin * SPAN_FIELDS;
  return f[SPAN_R_START] <= task.q_start && f[SPAN_R_END] >= task.q_end;
}
template <int W>
struct WholeSpanWalk {
  int kpos, k1;
  __device__ __forceinline__ void open(const int* spans, int s, int se) {
    kpos = k1 = 0;
    if (s < se) {
      kpos = spans[(i64)s * SPAN_FIELDS + SPAN_K_START];
      k1 = spans[(i64)s * SPAN_FIELDS + SPAN_K_END];
    }
  }
  __device__ __forceinline__ bool more(int) const { return kpos < k1; }
  __device__ __forceinline__ void read(u32) {}
  __device__ __forceinline__ void next(const int*, int) { kpos += W; }
  __device__ __forceinline__ int key0() const { return kpos; }
  __device__ __forceinline__ int chunk_start() const { return kpos; }
  __device__ __forceinline__ int key_end() const { return k1; }
  __device__ __forceinline__ int row_lo(const int*) const { return (int)0x80000000u; }
  __device__ __forceinline__ int row_hi(const int*) const { return 0x7fffffff; }
};
// The consumers' walk of a task: WHOLE ? WholeSpanWalk : ConsumerWalkOf.
template <bool WHOLE, int W>
using TaskWalkOf = typename Select<WHOLE, WholeSpanWalk<W>, ConsumerWalkOf<W>>::type;
}  // namespace
