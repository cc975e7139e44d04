// Device planner kernels: the row-parallel part of the physical mapping
// (tessera/runtime/mapping.py), run on the dense block matrix of a device mask so a new mask is
// planned in a few launches instead of dozens of array operations. One warp per mask row; each
// lane looks at key blocks lane, lane + 32, ... of the row and of the row before it.
//
// Semantics are those of mapping._row_stats and of the spans of groups without restricted
// merges; tests compare both planners array for array.
#include "common.cuh"

namespace {
struct RowWalk {
  const unsigned char* row;
  const unsigned char* prev;  // nullptr for the first row of a head
  int n_kv;
  __device__ __forceinline__ bool sel(int c) const { return c >= 0 && c < n_kv && row[c]; }
  __device__ __forceinline__ bool sel_prev(int c) const {
    return prev != nullptr && c < n_kv && prev[c];
  }
};

// Start column of the span ending at this lane's column, given the ballot of span starts in
// this 32-column step and the start of the span left open by the previous step.
__device__ __forceinline__ int span_start_of(u32 starts, int lane, int base, int carry) {
  const u32 upto = starts & (lane == 31 ? 0xffffffffu : ((2u << lane) - 1u));
  return upto ? base + 31 - __clz(upto) : carry;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
}  // namespace

// Per row: selected blocks, key spans, selected key tokens, key tokens shared with the previous
// row of the same head, BN-chunks of its spans, and whether it equals the previous row.
extern "C" __global__ void plan_row_stats(const unsigned char* __restrict__ dense, int n_rows,
                                          int n_kv, int n_q, const i64* __restrict__ kv_bounds,
                                          int block_n, int* count, int* nspans, i64* key_tokens,
                                          i64* overlap_tokens, int* chunks,
                                          unsigned char* identical) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= n_rows) return;
  const int r = warp;
  RowWalk w{dense + (i64)r * n_kv, (r % n_q) ? dense + (i64)(r - 1) * n_kv : nullptr, n_kv};
  int cnt = 0, prev_cnt = 0, ov_cnt = 0, spans = 0, carry = -1;
  i64 ktok = 0, otok = 0, chk = 0;
  for (int base = 0; base < n_kv; base += 32) {
    const int c = base + lane;
    const bool s = w.sel(c), p = w.sel_prev(c);
    const bool start = s && !w.sel(c - 1), end = s && !w.sel(c + 1);
    const u32 starts = __ballot_sync(0xffffffffu, start);
    cnt += __popc(__ballot_sync(0xffffffffu, s));
    prev_cnt += __popc(__ballot_sync(0xffffffffu, p));
    ov_cnt += __popc(__ballot_sync(0xffffffffu, s && p));
    spans += __popc(starts);
    if (s) {
      const i64 len = kv_bounds[c + 1] - kv_bounds[c];
      ktok += len;
      if (p) otok += len;
    }
    if (end) {
      const int s0 = span_start_of(starts, lane, base, carry);
      chk += (kv_bounds[c + 1] - kv_bounds[s0] + block_n - 1) / block_n;
    }
    const u32 last_sel = __ballot_sync(0xffffffffu, s) >> 31;
    carry = last_sel ? (starts ? base + 31 - __clz(starts) : carry) : -1;
  }
  ktok = warp_sum(ktok);
  otok = warp_sum(otok);
  chk = warp_sum(chk);
  if (lane == 0) {
    count[r] = cnt;
    nspans[r] = spans;
    key_tokens[r] = ktok;
    overlap_tokens[r] = w.prev ? otok : 0;
    chunks[r] = (int)chk;
    identical[r] = w.prev != nullptr && cnt == prev_cnt && ov_cnt == cnt;
  }
}

// Writes the key spans of every row with span_dst[r] >= 0 (the first row of each group) at
// span_dst[r], with the group's query range as their row restriction: int32 [S, 4] rows of
// (k_start, k_end, r_start, r_end), the task-queue span layout.
extern "C" __global__ void plan_write_spans(const unsigned char* __restrict__ dense, int n_rows,
                                            int n_kv, const i64* __restrict__ kv_bounds,
                                            const i64* __restrict__ span_dst,
                                            const i64* __restrict__ row_q0,
                                            const i64* __restrict__ row_q1, int* spans) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= n_rows || span_dst[warp] < 0) return;
  const int r = warp;
  RowWalk w{dense + (i64)r * n_kv, nullptr, n_kv};
  i64 out = span_dst[r];
  const int q0 = (int)row_q0[r], q1 = (int)row_q1[r];
  int carry = -1;
  for (int base = 0; base < n_kv; base += 32) {
    const int c = base + lane;
    const bool s = w.sel(c);
    const bool start = s && !w.sel(c - 1), end = s && !w.sel(c + 1);
    const u32 starts = __ballot_sync(0xffffffffu, start);
    const u32 ends = __ballot_sync(0xffffffffu, end);
    if (end) {
      const int s0 = span_start_of(starts, lane, base, carry);
      int* sp = spans + (out + __popc(ends & ((1u << lane) - 1u))) * SPAN_FIELDS;
      sp[0] = (int)kv_bounds[s0];
      sp[1] = (int)kv_bounds[c + 1];
      sp[2] = q0;
      sp[3] = q1;
    }
    out += __popc(ends);
    const u32 last_sel = __ballot_sync(0xffffffffu, s) >> 31;
    carry = last_sel ? (starts ? base + 31 - __clz(starts) : carry) : -1;
  }
}
