// The Hopper backward's matrix steps and tiles (sm90/bwd_dq.cu, sm90/bwd_dkdv.cu): warpgroup MMA
// (wgmma) reading every operand but P and dS straight from swizzled shared memory (layout.cuh),
// two or three stages of chunks copied by cp.async or (Config::TMA) by TMA. Each warpgroup
// issues its own products (a 64-row slice of the tile) and waits only for its own; one CTA
// barrier a chunk hands the stages over.
//
// Shared memory (dynamic, 1 KiB of slack to align the tiles): two resident tiles of BM x D,
// then STAGES x {two chunk tiles of BN x D}, then (Config::ATOMIC_DQ) dS^T's tile of BM x BN
// and the partial dQ's float32 tiles of BN x D (bwd_atomic_dq.cuh; DQ_BUFFERS sets of them),
// then STAGES x {BN LSE, BN Delta} floats, then (Config::TMA) an mbarrier a stage.
// tessera/cuda/variants.py's smem_bytes mirrors this formula.
#pragma once

#include "common/backward.cuh"
#include "common/softmax.cuh"
#include "common/walk.cuh"
#include "sm90/bwd_loads.cuh"

namespace {
constexpr int WGS = BM / 64;  // warpgroups, 64 rows each
constexpr int NT = WGS * 128;
constexpr int RESIDENT_BYTES = BM * D * 2;
constexpr int CHUNK_BYTES = BN * D * 2;
constexpr int STAGE_BYTES = 2 * CHUNK_BYTES;
constexpr int DS_BYTES = Config::ATOMIC_DQ ? BM * BN * 2 : 0;
// dQ by atomics: at head dim 128 the two warpgroups split dQ's columns, each D / 2 of them over
// all BM keys (a D-wide partial a warpgroup spills there, 255 registers); at 64 and 96 each
// takes its own 64 keys and every column (a column split would start inside a swizzle chunk),
// twice the atomics. The partial goes through a float32 tile of BN x D: the CTA's one (column
// split) or one a warpgroup.
constexpr bool DQ_COLUMN_SPLIT = D == 128;
constexpr int DQ_TILE_BYTES = BN * D * 4;
// Config::DQ_BUFFERS = 2: chunk c's partial dQ in set c % 2 of the tiles, so that the bulk
// reduce a chunk waits for before it rewrites its set is the one issued a chunk earlier.
constexpr int DQ_BUFFERS = Config::DQ_BUFFERS;
static_assert(DQ_BUFFERS == 1 || (DQ_BUFFERS == 2 && Config::ATOMIC_DQ),
              "two partial-dQ sets: dQ by atomics");
constexpr int DQ_SET_BYTES = DQ_TILE_BYTES * (DQ_COLUMN_SPLIT ? 1 : WGS);
constexpr int DQ_BYTES = Config::ATOMIC_DQ ? DQ_SET_BYTES * DQ_BUFFERS : 0;
// Chunks by TMA: one thread issues a chunk's copies, which complete on the stage's mbarrier
// (the LSE and Delta, and the resident tiles, stay cp.async copies of every thread). A box is
// BN consecutive rows: rows past the span's end hold rows no task's pair selects, zeroed where
// a product would multiply them by a zero weight (wait_for_chunk: 0 x Inf is NaN).
constexpr bool TMA = Config::TMA != 0;
static_assert(BM % 64 == 0 && BN % 64 == 0, "64 rows a warpgroup, 64-wide steps");
// Chunk c + 1 loads while chunk c computes. With three stages chunk c - 1's last product (dK
// or dQ) is left in flight into chunk c, still reading its stage; with two (64-row tasks at
// head dim 128, two CTAs an SM) every chunk waits for its products before the next barrier.
static_assert(STAGES == 2 || STAGES == 3, "two or three stages");
constexpr bool LAST_IN_FLIGHT = STAGES == 3;
static_assert(RESIDENT_BYTES % 1024 == 0 && CHUNK_BYTES % 1024 == 0, "tiles 1024-byte aligned");
static_assert(NT >= 2 * BN, "a thread for each of a chunk's LSE and Delta values");
using Walk = ChunkWalk<BN>;

// Where the tiles sit: 1024-aligned from the dynamic shared memory's start.
struct Tiles {
  // resident tiles, chunk stages, dS^T, the partial dQ, per-stage LSE and Delta
  u32 a, b, stages, ds, dq, values;
  __device__ __forceinline__ explicit Tiles(const unsigned char* smem_raw) {
    a = (smem_addr(smem_raw) + 1023u) & ~1023u;
    b = a + RESIDENT_BYTES;
    stages = b + RESIDENT_BYTES;
    ds = stages + STAGES * STAGE_BYTES;
    dq = ds + DS_BYTES;
    values = dq + DQ_BYTES;
  }
  __device__ __forceinline__ u32 chunk(int st) const { return stages + (u32)(st * STAGE_BYTES); }
  __device__ __forceinline__ u32 lse(int st) const { return values + (u32)(st * 2 * BN * 4); }
  // (TMA) the mbarrier stage st's copies complete on
  __device__ __forceinline__ u32 full(int st) const {
    return values + (u32)(STAGES * 2 * BN * 4 + 8 * st);
  }
};

// (TMA) The stages' barriers set up by one thread; the CTA barrier that follows makes them
// visible before any thread waits on one or a copy completes on one.
__device__ __forceinline__ void init_stage_barriers(const Tiles& tiles, int tid) {
  if (TMA && tid == 0)
    for (int st = 0; st < STAGES; ++st) mbar_init(tiles.full(st), 1);
  if (TMA) __syncthreads();
}

// Waits until chunk c's copies into its stage have landed (the thread's own cp.async copies,
// and with TMA the stage's bulk copies), zeroes rows `valid` .. BN - 1 of the stage's first
// ZERO_TILES tiles (TMA rows past the span's end, which a product multiplies by zero weights),
// and makes all of it visible to every thread's wgmma after the CTA barrier.
template <int ZERO_TILES>
__device__ __forceinline__ void wait_for_chunk(const Tiles& tiles, int c, int valid, int tid) {
  cp_async_wait<0>();
  if constexpr (TMA) {
    const int st = c % STAGES;
    mbar_wait(tiles.full(st), (c / STAGES) & 1);
    if (valid < BN)  // (uniform: a partial chunk)
      zero_rows<BN, NT, ZERO_TILES, CHUNK_BYTES>(tiles.chunk(st), valid, tid);
  }
  fence_async_smem();
  __syncthreads();
}

// acc = A (the warpgroup's 64 rows of a resident tile, K-major) times B^T (a chunk, K-major):
// D / 16 wgmma of BN columns, committed as one group.
__device__ __forceinline__ void issue_rows_times_chunk(float (&acc)[BN / 8][4], const SmemDesc& a,
                                                       u32 chunk) {
  const SmemDesc b = k_major_desc(chunk);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    Wgmma<BN>::ss(&acc[0][0], a.at(k_major_step<BM>(kk)), b.at(k_major_step<BN>(kk)), kk > 0);
  wgmma_commit();
}

// acc += W (BN columns of the thread's m16n8 values, as A fragments) times a chunk read N-major
// (BN x D): BN / 16 wgmma of D columns, committed as one group.
__device__ __forceinline__ void issue_weights_times_chunk(float (&acc)[D / 8][4],
                                                          const u32 (&w)[BN / 16][4], u32 chunk) {
  const SmemDesc b = n_major_desc<BN>(chunk);
  wgmma_hold<D / 2>(&acc[0][0]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) Wgmma<D>::rs(&acc[0][0], w[kk], b.at(v_step(kk)), 1);
  wgmma_commit();
}

__device__ __forceinline__ void fragments(u32 (&w)[BN / 16][4], const float (&s)[BN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) p_fragment(w[kk], s, kk);
}

__device__ __forceinline__ void zero(float (&acc)[D / 8][4]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}
}  // namespace
