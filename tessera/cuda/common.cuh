// Shared pieces of every Tessera kernel family: the task-queue contract, 16-bit number handling
// without CUDA headers (NVRTC needs none of the toolkit's include files this way), the warp-level
// matrix and copy primitives of sm_80 and newer as inline PTX, the key-span walk, the online
// softmax step and the output epilogue (both families hold scores and outputs in mma.sync's
// m16n8 accumulator layout, wgmma's being the same per warp).
//
// The task-queue layout is defined in tessera/runtime/queue.py; queue.cuh is generated from it.
#pragma once

#include "queue.cuh"

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

// -inf without <math.h> (NVRTC compiles these sources with no toolkit headers).
#define NEG_INF __int_as_float(0xff800000u)

// ---- element types ------------------------------------------------------------------------------
// TESSERA_BF16 = 1 selects bfloat16 inputs/outputs, 0 selects float16. Values travel as raw
// 16-bit patterns; only the conversions below and the mma instruction care which one it is.
#ifndef TESSERA_BF16
#define TESSERA_BF16 1
#endif

__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
#if TESSERA_BF16
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

__device__ __forceinline__ float to_float(u16 x) {
#if TESSERA_BF16
  return __uint_as_float(((u32)x) << 16);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
#endif
}

// f(Index<0>{}), ..., f(Index<N - 1>{}): an unrolled loop whose index is a constant expression
// in the body (a template argument, an asm immediate).
template <int I>
struct Index {
  static constexpr int value = I;
};
template <int N, int I = 0, typename F>
__device__ __forceinline__ void static_for(const F& f) {
  if constexpr (I < N) {
    f(Index<I>{});
    static_for<N, I + 1>(f);
  }
}

// ---- memory ----------------------------------------------------------------------------------
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
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// ---- tensor cores: D = A(16x16) * B(16x8) + D, fp32 accumulate ------------------------------------
__device__ __forceinline__ void mma16816(float* d, const u32* a, u32 b0, u32 b1) {
#if TESSERA_BF16
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- strided [B, H, L, D] operand -------------------------------------------------------------
// Strides are in elements and 64-bit, so [B,H,L,D] and [B,L,H,D] views both pass without copies
// and offsets past 2^31 elements are safe. The last dimension is contiguous (checked in Python).
struct Operand {
  const u16* ptr;
  i64 sb, sh, sl;
  __device__ __forceinline__ const u16* row(int b, int h, int l) const {
    return ptr + b * sb + h * sh + l * sl;
  }
};

__device__ __forceinline__ float warp_quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float warp_quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- kernel arguments and the task a CTA runs --------------------------------------------------
// Every attention family takes the same arguments (tessera/api.py passes them): the task queue,
// q/k/v and the output as [B, H, L, D] strides in elements, lse, the split-KV workspace, rows per
// tile of one head, query heads per kv head, the softmax scale times log2(e), the number of
// tasks -- max_tasks, or *task_count when that is not null (a sync-free plan: the device planner
// wrote the count, the host only knows a bound and sized the grid by it) -- and the counter
// persistent kernels take tasks from (null for one-task CTAs): zero at the launch, and zero
// again when the launch ends (the kernel resets it; see bsa_sm90.cu).
// Tensor maps (driver-encoded CUtensorMap, 128 bytes each) of q, k and v for kernels that copy
// by TMA (bsa_sm90.cu with TESSERA_TMA); zeros for the others. A __grid_constant__ kernel
// parameter: the copies read them where the launch put them (param space), no device copy.
struct alignas(128) TmaMaps {
  unsigned long long q[16], k[16], v[16];
};

#define TESSERA_BSA_PARAMS                                                        \
  const int *__restrict__ tasks, const int *__restrict__ spans, const u16 *q_ptr,  \
      i64 q_sb, i64 q_sh, i64 q_sl, const u16 *k_ptr, i64 k_sb, i64 k_sh, i64 k_sl, \
      const u16 *v_ptr, i64 v_sb, i64 v_sh, i64 v_sl, u16 *o_ptr, i64 o_sb, i64 o_sh, \
      i64 o_sl, float *lse_ptr, i64 lse_sb, i64 lse_sh, float *part_o,              \
      float *part_lse, int tile_rows, int group, float scale_log2, int max_tasks,     \
      const i64 *task_count, int *task_counter,                                  \
      const __grid_constant__ TmaMaps tma_maps

// The number of tasks, at the top of every attention kernel (see TESSERA_BSA_PARAMS): a device
// count is clamped to the queue's rows, so no count makes a kernel read past them.
#define TESSERA_NUM_TASKS                                                               \
  const int num_tasks = task_count != nullptr                                           \
                            ? (int)min(max(*task_count, (i64)0), (i64)max_tasks)        \
                            : max_tasks

// Task `index` of the queue (layout in tessera/runtime/tasks.py) and where its keys live.
struct Task {
  int b, h0, q_start, q_end, slot, span_begin, span_end;
  const u16* k_head;  // (batch, kv head) row 0 of k and v
  const u16* v_head;
  __device__ __forceinline__ Task(const int* tasks, int index, const u16* k_ptr, i64 k_sb,
                                  i64 k_sh, const u16* v_ptr, i64 v_sb, i64 v_sh, int group) {
    const int* t = tasks + (i64)index * TASK_FIELDS;
    b = t[TASK_BATCH];
    h0 = t[TASK_Q_HEAD0];
    q_start = t[TASK_Q_START];
    q_end = t[TASK_Q_END];
    slot = t[TASK_SLOT];
    span_begin = t[TASK_SPAN_BEGIN];
    span_end = t[TASK_SPAN_END];
    const int kvh = h0 / group;
    k_head = k_ptr + b * k_sb + kvh * k_sh;
    v_head = v_ptr + b * v_sb + kvh * v_sh;
  }
  // The q row behind physical row r of the tile; padding rows read a real row (never stored).
  __device__ __forceinline__ const u16* q_row(const Operand& q, int r, int tile_rows) const {
    const int tok = q_start + r % tile_rows;
    return q.row(b, h0 + r / tile_rows, tok < q_end ? tok : q_start);
  }
};

// ---- the walk over a task's key spans ---------------------------------------------------------
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
template <int BN_>
struct ChunkWalk : SpanPosition {
  int k1, kpos;
  __device__ __forceinline__ void open(const int* spans, int s, int se) {
    si = s;
    if (si < se) {
      kpos = spans[(i64)si * SPAN_FIELDS + SPAN_K_START];
      k1 = spans[(i64)si * SPAN_FIELDS + SPAN_K_END];
    }
  }
  __device__ __forceinline__ void next(const int* spans, int se) {
    kpos += BN_;
    if (kpos >= k1) open(spans, si + 1, se);
  }
  // Whether the current chunk is the task's last (next would leave no span).
  __device__ __forceinline__ bool last(int se) const { return kpos + BN_ >= k1 && si + 1 >= se; }
  // The key row r of the current chunk is copied from: rows past the span end repeat its last
  // key (finite data; their scores are masked), so no read leaves the span.
  __device__ __forceinline__ i64 row_key(int r) const { return min(kpos + r, k1 - 1); }
  // Keys of the current chunk's columns: kpos + c, those at or past k1 masked.
  __device__ __forceinline__ int key0() const { return kpos; }
  __device__ __forceinline__ int key_end() const { return k1; }
  // Row -> key for a loader thread (rows asked in increasing order).
  struct Cursor {
    const ChunkWalk& w;
    __device__ __forceinline__ Cursor(const ChunkWalk& w_, const int*, int) : w(w_) {}
    __device__ __forceinline__ i64 key(int r) { return w.row_key(r); }
  };
};

// The packed walk (TESSERA_PACK_KEYS): a task's keys -- its spans end to end -- BN_ at a time,
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
  __device__ __forceinline__ int key_end() const { return left < BN_ ? left : BN_; }
  __device__ __forceinline__ int row_lo(const int*) const { return lo; }
  __device__ __forceinline__ int row_hi(const int*) const { return hi; }
};

// ---- online softmax step ----------------------------------------------------------------------
// How far (log2 units) a score may exceed the running max before the accumulators are rescaled.
constexpr float RESCALE_SLACK = 8.f;

// Reduces v[0 .. N) with op pairwise (log2 N dependent steps instead of N - 1), in place.
template <int N, typename Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
#pragma unroll
  for (int stride = 1; stride < N; stride *= 2)
#pragma unroll
    for (int i = 0; i + stride < N; i += 2 * stride) v[i] = op(v[i], v[i + stride]);
  return v[0];
}

// One key chunk for the two rows (g and g + 8 of a 16-row tile) a thread holds: s[NB][4] are raw
// scores of NB key octets in the m16n8 accumulator layout, keys key0 + 8 * j + 2 * t (+1).
// Masks keys at or past k_end and rows whose ok flag is false, exponentiates s in place against
// the running max m (log2 units), adds the row sums to l, and sets al to the factor the output
// accumulators must be multiplied by (1 when the max did not move). Returns whether any did.
template <int NB>
__device__ __forceinline__ bool softmax_chunk(float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                              float (&al)[2], int key0, int k_end, bool ok0,
                                              bool ok1, int t, float scale_log2) {
  al[0] = al[1] = 1.f;
  if (key0 + NB * 8 > k_end || !(ok0 && ok1)) {
#pragma unroll
    for (int nt = 0; nt < NB; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool key_ok = key0 + nt * 8 + 2 * t + (e & 1) < k_end;
        if (!(key_ok && (e < 2 ? ok0 : ok1))) s[nt][e] = NEG_INF;
      }
  }
  // Reductions over the thread's scores run as trees (tree_reduce): a serial chain would leave
  // the consumer warp waiting out each instruction's latency, with little else to issue.
  float mx0, mx1;
  {
    float r0[NB], r1[NB];
#pragma unroll
    for (int nt = 0; nt < NB; ++nt) {
      r0[nt] = fmaxf(s[nt][0], s[nt][1]);
      r1[nt] = fmaxf(s[nt][2], s[nt][3]);
    }
    mx0 = tree_reduce<NB>(r0, [](float a, float b) { return fmaxf(a, b); });
    mx1 = tree_reduce<NB>(r1, [](float a, float b) { return fmaxf(a, b); });
  }
  // The running max moves only when a score exceeds it by more than RESCALE_SLACK (the softmax
  // is invariant to the shift; p stays <= 2^RESCALE_SLACK), so most chunks skip rescaling.
  // A row's max exceeds the limit exactly when one of its quad's four threads' own maxima does
  // (scaling by the positive scale_log2 keeps the order), so a vote of the warp on its own
  // maxima decides whether any of its rows moves: most chunks then skip the quad shuffles,
  // which sit on the chunk's dependent chain between S and the exponentials. The result is the
  // same either way.
  const float lim0 = m[0] + RESCALE_SLACK, lim1 = m[1] + RESCALE_SLACK;
  bool rescale = false;
  if (__any_sync(0xffffffffu, mx0 * scale_log2 > lim0 || mx1 * scale_log2 > lim1)) {
    const float mn0 = warp_quad_max(mx0) * scale_log2, mn1 = warp_quad_max(mx1) * scale_log2;
    if (mn0 > lim0) {
      al[0] = fast_exp2(m[0] - mn0);
      m[0] = mn0;
      rescale = true;
    }
    if (mn1 > lim1) {
      al[1] = fast_exp2(m[1] - mn1);
      m[1] = mn1;
      rescale = true;
    }
  }
  // A row with nothing unmasked yet keeps m = -inf; subtract 0 so exp2 gives 0, not NaN.
  const float base0 = m[0] == NEG_INF ? 0.f : m[0];
  const float base1 = m[1] == NEG_INF ? 0.f : m[1];
  float r0[NB], r1[NB];
#pragma unroll
  for (int nt = 0; nt < NB; ++nt) {
    s[nt][0] = fast_exp2(fmaf(s[nt][0], scale_log2, -base0));
    s[nt][1] = fast_exp2(fmaf(s[nt][1], scale_log2, -base0));
    s[nt][2] = fast_exp2(fmaf(s[nt][2], scale_log2, -base1));
    s[nt][3] = fast_exp2(fmaf(s[nt][3], scale_log2, -base1));
    r0[nt] = s[nt][0] + s[nt][1];
    r1[nt] = s[nt][2] + s[nt][3];
  }
  const auto add = [](float a, float b) { return a + b; };
  l[0] = l[0] * al[0] + tree_reduce<NB>(r0, add);
  l[1] = l[1] * al[1] + tree_reduce<NB>(r1, add);
  return rescale;
}

// The A fragment (m16k16) of P for keys 16 * kk .. 16 * kk + 15: two key octets of scores.
template <int NB>
__device__ __forceinline__ void p_fragment(u32 (&pa)[4], const float (&s)[NB][4], int kk) {
  pa[0] = pack2(s[2 * kk][0], s[2 * kk][1]);
  pa[1] = pack2(s[2 * kk][2], s[2 * kk][3]);
  pa[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  pa[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// ---- non-finite values in rows a span does not select ------------------------------------------
// Where a span applies to some of a tile's rows only (combined short query blocks, aligned
// tiles), the other rows' P is 0 for its keys, yet P V is one matrix product: an Inf or NaN in
// those keys' V would turn 0 x Inf into NaN in rows whose reference output is finite. A chunk
// of such a span has its V checked (rare chunks; V is in shared memory already); only when it
// holds a non-finite value does the kernel keep the excluded rows out of that product (a copy
// of their accumulators taken back after it, or a product over V with those values zeroed that
// the other rows then add back).

// TESSERA_GUARD 1 (the default) builds that check; 0 leaves it out, for the variants of regimes
// whose plans restrict no span to some of a tile's rows (Regime.restricts_rows).
#ifndef TESSERA_GUARD
#define TESSERA_GUARD 1
#endif
constexpr bool GUARD = TESSERA_GUARD;

// Nonzero when either 16-bit half of x is an Inf or a NaN (every exponent bit set).
__device__ __forceinline__ u32 non_finite_pair(u32 x) {
#if TESSERA_BF16
  constexpr u32 EXP = 0x7f807f80u;
#else
  constexpr u32 EXP = 0x7c007c00u;
#endif
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
#if TESSERA_BF16
  constexpr u32 EXP = 0x7f80u, MANT = 0x007fu;
#else
  constexpr u32 EXP = 0x7c00u, MANT = 0x03ffu;
#endif
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

// ---- epilogue ---------------------------------------------------------------------------------
// Where a task's rows go: the output and lse (slot < 0) or a split-KV workspace slot.
struct Output {
  u16* o;
  i64 sb, sh, sl;
  float* lse;  // may be null
  i64 lse_sb, lse_sh;
  float* part_o;
  float* part_lse;
};

// Normalise and store the two rows (tokens tok0 and tok0 + 8 of query head `head`; physical rows
// row0 and row0 + 8 of a bm-row task) a thread holds; rows at or past q_end are padding.
template <int D_>
__device__ __forceinline__ void store_rows(const Output& out, const float (&acc)[D_ / 8][4],
                                           const float (&m)[2], const float (&l)[2], int b,
                                           int head, int tok0, int q_end, int row0, int bm,
                                           int slot, int t) {
  constexpr float LN2 = 0.69314718055994530942f;
  const float l0 = warp_quad_sum(l[0]), l1 = warp_quad_sum(l[1]);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const float lse0 = l0 > 0.f ? (m[0] + __log2f(l0)) * LN2 : NEG_INF;
  const float lse1 = l1 > 0.f ? (m[1] + __log2f(l1)) * LN2 : NEG_INF;
  const int tok1 = tok0 + 8;
  const bool real0 = tok0 < q_end, real1 = tok1 < q_end;
  if (slot < 0) {
    u16* o0 = out.o + b * out.sb + head * out.sh + tok0 * out.sl;
    u16* o1 = out.o + b * out.sb + head * out.sh + tok1 * out.sl;
#pragma unroll
    for (int nt = 0; nt < D_ / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      if (real0) *reinterpret_cast<u32*>(o0 + col) = pack2(acc[nt][0] * inv0, acc[nt][1] * inv0);
      if (real1) *reinterpret_cast<u32*>(o1 + col) = pack2(acc[nt][2] * inv1, acc[nt][3] * inv1);
    }
    if (out.lse != nullptr && t == 0) {
      float* lrow = out.lse + b * out.lse_sb + head * out.lse_sh;
      if (real0) lrow[tok0] = lse0;
      if (real1) lrow[tok1] = lse1;
    }
  } else {
    const int row1 = row0 + 8;
    float* p0 = out.part_o + ((i64)slot * bm + row0) * D_;
    float* p1 = out.part_o + ((i64)slot * bm + row1) * D_;
#pragma unroll
    for (int nt = 0; nt < D_ / 8; ++nt) {
      const int col = nt * 8 + 2 * t;
      if (real0) *reinterpret_cast<float2*>(p0 + col) = make_float2(acc[nt][0] * inv0, acc[nt][1] * inv0);
      if (real1) *reinterpret_cast<float2*>(p1 + col) = make_float2(acc[nt][2] * inv1, acc[nt][3] * inv1);
    }
    if (t == 0) {
      if (real0) out.part_lse[(i64)slot * bm + row0] = lse0;
      if (real1) out.part_lse[(i64)slot * bm + row1] = lse1;
    }
  }
}
