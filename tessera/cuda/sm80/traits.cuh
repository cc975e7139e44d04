// The portable family's compile-time constants, from the variant's Config (variant.cuh, written
// by tessera/cuda/loader.py from tessera/cuda/variants.py):
//   BM, BN       physical tile: rows per task, keys per step
//   D            head dim (q, k and v), a multiple of 16
//   WARPS        warps per CTA
//   MT           m16 row tiles per warp (BM = WARPS * 16 * MT). Two tiles per warp halve the
//                shared-memory reads of K and V per matrix operation, which is what bounds this
//                family on large GPUs.
//   STAGES       K/V pipeline depth (>= 2)
//   MIN_BLOCKS   CTAs per SM the register budget is set for
//   BF16         1: bfloat16, 0: float16
//   GUARD        0: no non-finite check of row-restricted chunks (common/guard.cuh)
#pragma once

#include "common/tile.cuh"
#include "common/walk.cuh"

namespace {
constexpr int NW = Config::WARPS;
constexpr int MT = Config::MT;
constexpr int NT = NW * 32;
constexpr int LDS = D + 8;               // padded shared-memory row, elements
constexpr int KV_TILE = BN * LDS;        // elements of one K or V tile
constexpr int STAGE = 2 * KV_TILE;       // K then V
constexpr int Q_TILE = BM * LDS;
constexpr int CPR = D / 8;               // 16-byte chunks per row
static_assert(BM == NW * 16 * MT, "BM = warps x 16 x MT");
static_assert(D % 16 == 0 && BN % 16 == 0, "D and BN must be multiples of 16");
static_assert(STAGES >= 2, "at least double buffering");

using Walk = ChunkWalk<BN>;
}  // namespace
