// The portable backward's matrix steps and the tiles both of its kernels keep (sm80/bwd_dq.cu,
// sm80/bwd_dkdv.cu): one warp owns 16 rows of a resident tile (MT = 1) and multiplies them by a
// chunk of BN rows, read as rows or transposed, with ldmatrix and mma.sync.
//
// Shared memory (dynamic), in elements: two resident tiles of BM x (D + 8), then STAGES x {two
// chunk tiles of BN x (D + 8)}, then STAGES x {BN LSE, BN Delta} floats (the key-major kernel's).
// tessera/cuda/variants.py's smem_bytes mirrors this formula.
#pragma once

#include "common/backward.cuh"
#include "common/softmax.cuh"
#include "sm80/bwd_loads.cuh"
#include "sm80/loads.cuh"
#include "sm80/mma.cuh"

namespace {
constexpr int RESIDENT = 2 * BM * LDS;  // elements of the two resident tiles
static_assert(MT == 1, "the backward kernels own 16 rows a warp");
static_assert(NT >= 2 * BN, "a thread for each of a chunk's LSE and Delta values");

// Per-thread ldmatrix byte offsets (see bsa.cu): A fragments of a resident tile (the warp's
// rows), B fragments of a chunk read as rows (k_frag) or transposed (v_frag).
struct Fragments {
  u32 a, b_rows, b_trans;
  __device__ __forceinline__ Fragments(int warp, int lane) {
    a = (u32)((((warp * 16) + (lane % 8) + 8 * ((lane / 8) % 2)) * LDS + 8 * (lane / 16)) * 2);
    b_rows = (u32)((((lane % 8) + 8 * (lane / 16)) * LDS + 8 * ((lane / 8) % 2)) * 2);
    b_trans = (u32)((((lane % 8) + 8 * ((lane / 8) % 2)) * LDS + 8 * (lane / 16)) * 2);
  }
};

// acc[NB][4] = A (16 x D, the warp's rows of the resident tile at a) times B^T (the chunk at b,
// BN rows x D): scores in the m16n8 layout.
__device__ __forceinline__ void rows_times_chunk(float (&acc)[BN / 8][4], u32 a, u32 b,
                                                 const Fragments& f) {
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    u32 fa[4];
    ldmatrix_x4(fa[0], fa[1], fa[2], fa[3], a + f.a + (u32)(kk * 16 * 2));
#pragma unroll
    for (int np = 0; np < BN / 16; ++np) {
      u32 b0, b1, b2, b3;
      ldmatrix_x4(b0, b1, b2, b3, b + f.b_rows + (u32)((np * 16 * LDS + kk * 16) * 2));
      mma16816(acc[2 * np], fa, b0, b1);
      mma16816(acc[2 * np + 1], fa, b2, b3);
    }
  }
}

// acc[D / 8][4] += W (16 x BN, the thread's m16n8 values) times the chunk at b (BN x D).
__device__ __forceinline__ void add_weights_times_chunk(float (&acc)[D / 8][4],
                                                        const float (&w)[BN / 8][4], u32 b,
                                                        const Fragments& f) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    u32 wa[4];
    p_fragment(wa, w, kk);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      u32 b0, b1, b2, b3;
      ldmatrix_x4_trans(b0, b1, b2, b3, b + f.b_trans + (u32)((kk * 16 * LDS + dp * 16) * 2));
      mma16816(acc[2 * dp], wa, b0, b1);
      mma16816(acc[2 * dp + 1], wa, b2, b3);
    }
  }
}

__device__ __forceinline__ void zero(float (&acc)[D / 8][4]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}
}  // namespace
