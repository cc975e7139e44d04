// The walks over a task's key spans: which keys each chunk of a task holds and which of the
// tile's rows they apply to. Both families step through tasks with these.
#pragma once

#include "common/task.cuh"

// What the walks over a task's spans share: the current span `si`, whether any is left, and
// the query tokens it applies to, [row_lo, row_hi).
struct SpanPosition {
  int si;
  __device__ __forceinline__ bool more(int se) const { return si < se; }
  __device__ __forceinline__ int row_lo(const int* spans) const {
    return spans[(i64)si * SPAN_FIELDS + SPAN_R_START];
  }
  __device__ __forceinline__ int row_hi(const int* spans) const {
    return spans[(i64)si * SPAN_FIELDS + SPAN_R_END];
  }
};

// Span by span, bn keys at a time. Kept to three registers (the row restriction is read from
// the span when a chunk is computed): two walks, loading and computing, are live at once.
// ALIGN_ (a power of two; 1 but in the Hopper 8-bit form) puts every chunk's first column at a
// multiple of ALIGN_ keys: a span's first chunk starts at or below the span, its columns before
// the span masked like those past its end.
template <int BN_, int ALIGN_ = 1>
struct ChunkWalk : SpanPosition {
  int k1, kpos;  // the span's end; the chunk's first key of the span (the span's start, then
                 // the chunk's first column)
  __device__ __forceinline__ void open(const int* spans, int s, int se) {
    si = s;
    if (si < se) {
      kpos = spans[(i64)si * SPAN_FIELDS + SPAN_K_START];
      k1 = spans[(i64)si * SPAN_FIELDS + SPAN_K_END];
    }
  }
  __device__ __forceinline__ void next(const int* spans, int se) {
    kpos = chunk_start() + BN_;
    if (kpos >= k1) open(spans, si + 1, se);
  }
  // The key of the current chunk's first column.
  __device__ __forceinline__ int chunk_start() const { return kpos & -ALIGN_; }
  // Whether the current chunk is the task's last (next would leave no span).
  __device__ __forceinline__ bool last(int se) const {
    return chunk_start() + BN_ >= k1 && si + 1 >= se;
  }
  // The key row r of the current chunk is copied from: rows past the span end repeat its last
  // key (finite data; their scores are masked), so no read leaves the span.
  __device__ __forceinline__ i64 row_key(int r) const { return min(chunk_start() + r, k1 - 1); }
  // The chunk's keys of the span, [key0, key_end): column c holds key chunk_start() + c; those
  // outside are masked.
  __device__ __forceinline__ int key0() const { return kpos; }
  __device__ __forceinline__ int key_end() const { return k1; }
  // Row -> key for a loader thread (rows asked in increasing order).
  struct Cursor {
    const ChunkWalk& w;
    __device__ __forceinline__ Cursor(const ChunkWalk& w_, const int*, int) : w(w_) {}
    __device__ __forceinline__ i64 key(int r) { return w.row_key(r); }
  };
};

// The packed walk (Config::PACK_KEYS): a task's keys -- its spans end to end -- BN_ at a time,
// so a span shorter than BN_ (a small edge block) shares its chunk with the next span's keys
// instead of costing a chunk of its own; only the task's last chunk is partial. Needs one row
// restriction for all of a task's spans (the planner packs only plans without restricted
// merges). The chunk starts `off` keys into span si and holds `valid` keys.
template <int BN_>
struct PackedWalk : SpanPosition {
  int off, valid;
  __device__ __forceinline__ static int span_len(const int* spans, int s) {
    return spans[(i64)s * SPAN_FIELDS + SPAN_K_END] - spans[(i64)s * SPAN_FIELDS + SPAN_K_START];
  }
  // Keys from (si, off) on, at most BN_.
  __device__ __forceinline__ void count(const int* spans, int se) {
    valid = 0;
    for (int s = si, o = off; s < se && valid < BN_; ++s, o = 0) valid += span_len(spans, s) - o;
    valid = min(valid, BN_);
  }
  __device__ __forceinline__ void open(const int* spans, int s, int se) {
    si = s;
    off = 0;
    count(spans, se);
  }
  __device__ __forceinline__ void next(const int* spans, int se) {
    int left = BN_;
    while (si < se) {
      const int rest = span_len(spans, si) - off;
      if (left < rest) {
        off += left;
        break;
      }
      left -= rest;
      ++si;
      off = 0;
    }
    count(spans, se);
  }
  // Columns are positions in the chunk; those at or past `valid` are masked.
  __device__ __forceinline__ int key0() const { return 0; }
  __device__ __forceinline__ int chunk_start() const { return 0; }
  __device__ __forceinline__ int key_end() const { return valid; }
  // Row -> key for a loader thread (rows asked in increasing order): walks the spans from the
  // chunk's start; rows past the task's keys repeat its last key (finite data, masked).
  struct Cursor {
    const int* spans;
    int s, se, base, k0, len;  // span s starts at chunk row `base` and holds keys k0 .. k0+len-1
    __device__ __forceinline__ Cursor(const PackedWalk& w, const int* spans_, int se_)
        : spans(spans_), s(w.si), se(se_), base(-w.off) {
      k0 = spans[(i64)s * SPAN_FIELDS + SPAN_K_START];
      len = spans[(i64)s * SPAN_FIELDS + SPAN_K_END] - k0;
    }
    __device__ __forceinline__ i64 key(int r) {
      while (r >= base + len && s + 1 < se) {
        base += len;
        ++s;
        k0 = spans[(i64)s * SPAN_FIELDS + SPAN_K_START];
        len = spans[(i64)s * SPAN_FIELDS + SPAN_K_END] - k0;
      }
      return k0 + min(r - base, len - 1);
    }
  };
};

// What the computing threads need of the packed walk: each chunk's number of keys (BN_ but in
// the task's last chunk) and the task's one row restriction. Read once per task -- a warp's
// lanes sum the spans' lengths -- instead of walking the spans chunk by chunk, a chain of
// global loads per chunk that only the threads copying keys need. The same chunks as
// PackedWalk's: spans are never empty (block bounds strictly increase), so that walk takes
// ceil(keys / BN_) chunks too. Every lane of the warp must call open.
template <int BN_>
struct PackedCount {
  int left, lo, hi;  // keys from the current chunk on; the task's row restriction
  __device__ __forceinline__ void open(const int* spans, int s, int se) {
    int keys = 0;
    for (int i = s + (int)(threadIdx.x % 32); i < se; i += 32)
      keys += spans[(i64)i * SPAN_FIELDS + SPAN_K_END] - spans[(i64)i * SPAN_FIELDS + SPAN_K_START];
    left = __reduce_add_sync(0xffffffffu, keys);
    lo = s < se ? spans[(i64)s * SPAN_FIELDS + SPAN_R_START] : 0;
    hi = s < se ? spans[(i64)s * SPAN_FIELDS + SPAN_R_END] : 0;
  }
  __device__ __forceinline__ void next(const int*, int) { left -= BN_; }
  __device__ __forceinline__ bool more(int) const { return left > 0; }
  __device__ __forceinline__ int key0() const { return 0; }
  __device__ __forceinline__ int chunk_start() const { return 0; }
  __device__ __forceinline__ int key_end() const { return left < BN_ ? left : BN_; }
  __device__ __forceinline__ int row_lo(const int*) const { return lo; }
  __device__ __forceinline__ int row_hi(const int*) const { return hi; }
};
