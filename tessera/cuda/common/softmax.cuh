// The online softmax step both families run on a chunk of scores held in mma.sync's m16n8
// accumulator layout (wgmma's is the same per warp), and P's conversion to matrix operands.
#pragma once

#include "common/element.cuh"

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

// Sets to -inf the scores of keys at or past k_end (with LOWER, also of keys below k_lo) and of
// rows whose ok flag is false: s[NB][4] are the scores of NB key octets for the two rows (g and
// g + 8 of a 16-row tile) a thread holds, in the m16n8 accumulator layout, keys
// key0 + 8 * j + 2 * t (+1).
template <int NB, bool LOWER = false>
__device__ __forceinline__ void mask_scores(float (&s)[NB][4], int key0, int k_end, bool ok0,
                                            bool ok1, int t, int k_lo = 0) {
  if (key0 + NB * 8 > k_end || !(ok0 && ok1) || (LOWER && key0 < k_lo)) {
#pragma unroll
    for (int nt = 0; nt < NB; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        bool key_ok;
        if constexpr (LOWER) {
          const int key = key0 + nt * 8 + 2 * t + (e & 1);
          key_ok = key >= k_lo && key < k_end;
        } else {
          key_ok = key0 + nt * 8 + 2 * t + (e & 1) < k_end;
        }
        if (!(key_ok && (e < 2 ? ok0 : ok1))) s[nt][e] = NEG_INF;
      }
  }
}

// The largest of the thread's scores of each of its two rows (mask_scores' layout). Reductions
// over the thread's scores run as trees (tree_reduce): a serial chain would leave the consumer
// warp waiting out each instruction's latency, with little else to issue.
template <int NB>
__device__ __forceinline__ void thread_row_maxima(const float (&s)[NB][4], float& mx0,
                                                  float& mx1) {
  float r0[NB], r1[NB];
#pragma unroll
  for (int nt = 0; nt < NB; ++nt) {
    r0[nt] = fmaxf(s[nt][0], s[nt][1]);
    r1[nt] = fmaxf(s[nt][2], s[nt][3]);
  }
  mx0 = tree_reduce<NB>(r0, [](float a, float b) { return fmaxf(a, b); });
  mx1 = tree_reduce<NB>(r1, [](float a, float b) { return fmaxf(a, b); });
}

// One key chunk for the two rows a thread holds: s[NB][4] are raw scores (mask_scores' layout).
// Masks them (mask_scores), exponentiates s in place against the running max m (log2 units),
// adds the row sums to l, and sets al to the factor the output accumulators must be multiplied
// by (1 when the max did not move). Returns whether any did.
template <int NB>
__device__ __forceinline__ bool softmax_chunk(float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                              float (&al)[2], int key0, int k_end, bool ok0,
                                              bool ok1, int t, float scale_log2) {
  al[0] = al[1] = 1.f;
  mask_scores(s, key0, k_end, ok0, ok1, t);
  float mx0, mx1;
  thread_row_maxima(s, mx0, mx1);
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
