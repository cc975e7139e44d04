// The Hopper family's compile-time constants: the variant's parameters, from its Config
// (variant.cuh, written by tessera/cuda/loader.py from tessera/cuda/variants.py), and what
// derives from them: threads, registers, shared-memory layout, barriers, which paths exist.
//
// Parameters:
//   BM         rows per task, 64 per warpgroup (192, three warpgroups: producer only)
//   BN         keys per step: 64 or 128 (a width wgmma.cuh instantiates)
//   D          head dim: 64, 96 or 128
//   STAGES     K/V stages (>= 3: chunk j computes, j-1's V is read, STAGES-2 load ahead)
//   BF16       1: bfloat16, 0: float16
//   PRODUCER   1: warp-specialized and persistent (a producer warpgroup copies, consumers
//              compute, with register reallocation and strictly alternating consumer issue; the
//              next task's chunks load while the current one computes); 0: every warpgroup
//              copies and computes, one CTA barrier per key step
//   Q_BUFFERS  2 (producer only, where shared memory allows): the next task's Q loads while the
//              current task computes, so the consumers start it without waiting for Q (a tile
//              read once, from DRAM); 1: it loads after the current task's last S
//   TMA        1 (producer, unpacked walk only): one producer thread copies each Q tile and K/V
//              chunk with bulk tensor copies (TMA) described by the tensor maps in the tma_maps
//              parameter (tessera/cuda/tma.py), completing on the full barriers by byte count,
//              and stages each chunk's span fields beside it (STAGED_SPANS); 0: 128 threads of
//              cp.async
//   RINGS      (TMA producer, 64-row tiles only; 1 elsewhere) lone consumer warpgroups a CTA,
//              each with its own tasks, Q buffer and K/V stage ring, each ring fed by its own
//              warp of the one producer warpgroup: a ring is what a 64-row CTA is otherwise, but
//              the rings share one producer warpgroup's registers, which leaves four rings'
//              consumers 112 each (four CTAs an SM would leave 104, where ptxas serializes their
//              wgmma): a fourth consumer warp an SM sub-partition at head dim 64
//              (docs/decisions.md)
//   MIN_BLOCKS CTAs per SM the producer variant's registers are split for: 2 (or 3, 64x64 tiles
//              at head dim 64 with TMA) lets 64-row CTAs share an SM, each with one consumer
//              warpgroup, instead of one CTA holding the whole register file
//   SMEM_ALIGNED 1: no slack reserved to align the tiles (the dynamic shared memory starts
//              1024-aligned; checked): the 1 KB that lets two 64x64 producer CTAs with one Q
//              buffer share an SM at head dim 128
//   PACK_KEYS  1: a task's keys are walked end to end (PackedWalk, common/walk.cuh), spans
//              sharing chunks; 0: span by span (ChunkWalk)
//   GUARD      0: no non-finite check of row-restricted chunks (common/guard.cuh, GuardedRows)
//   PV_WAIT_ANCHOR 1: the softmax's first exponentials issued before the wait for the previous
//              chunk's P V (order_wait_after, softmax.cuh), where ptxas otherwise moves the wait
//              ahead of them all (variants.py says where it pays)
//   WHOLE_TASKS 1 (producer variants of the span-by-span walk): every task of the plan is a
//              whole-span task (whole_span_task, walks.cuh) -- a mask that selects every block,
//              which the plan checks (Regime.whole_spans) -- so the consumers walk all of them
//              by arithmetic in one loop
//   WIDE_BN    (TMA producer only; 0: off) a wider key step for tasks whose few spans are long:
//              the producer takes a task of at most WIDE_SPANS spans at WIDE_BN keys a step when
//              that computes at most ~3% more padded keys than BN-key steps (wide_task), telling
//              the consumers with the task's index; they run the task's loop instantiated for
//              that width (no P V overlap: its registers do not fit at 192 keys). Fewer, longer
//              steps spread each step's fixed costs (waits, turns, the running max and O's
//              rescale) over more keys: dense CogVideoX (head dim 64) ran 3% faster than with BN
//              alone, but random and spatial-temporal masks 3-8% slower though most of their
//              tasks keep BN's steps (not explained yet; suspects: a 128-key chunk copied as two
//              64-key boxes, less L1 beside 181 KB of shared memory -- the 128-key loop's SASS
//              is the default's) -- hence opt-in (Regime.wide_steps).
//   INT8       1 or 2: the 8-bit forwards (TMA producer, span-by-span walk, 128-row tiles, head
//              dim 64 or 128); 2 keeps P V in 16 bits (V as given, P bf16/fp16, into O as the
//              16-bit form does) and takes only the scores from int8. 1: Q and K int8 with a step a
//              token, S = Q K^T by s8 wgmma; P rounded to u8
//              against each chunk's own row maxima and multiplied by V int8 (a step a channel,
//              transposed: keys contiguous, in quantize_launch.v_key_order within each 16) by
//              u8 x s8 wgmma; the int32 products turned to float exactly (the 2^23 trick) and
//              summed into O in float32 (tessera/quantization.py is its float64 oracle; the
//              pre-pass, quantize.cu, writes its operands). Integer V holds no Inf or NaN, so
//              it runs without the guard and without zeroing a partial chunk's tail.
//   WIDE_SPANS, WIDE_SLACK  the wide step's rule, from the host's mirror of it
//              (tessera/cuda/variants.py): tasks of more spans than WIDE_SPANS never take it (the
//              producer reads each span's bounds to decide, before its copies), nor tasks whose
//              keys rounded up to wide steps exceed those rounded up to BN-key steps by more
//              than 1 / WIDE_SLACK.
#pragma once

#include "common/tile.cuh"
#include "common/walk.cuh"
#include "sm90/layout.cuh"  // SW, PPC

namespace {
constexpr int WGS = BM / 64;  // consumer warpgroups of a task (they own the rows)
// PRODUCER = 1 adds a producer warpgroup that alone copies Q and K/V, handing stages over on
// mbarriers; the consumers then never wait for one another at a CTA-wide barrier.
constexpr bool WS = Config::PRODUCER != 0;
constexpr int RINGS = Config::RINGS;  // independent task streams a CTA (see RINGS above)
constexpr int CONSUMERS = WGS * 128;  // a ring's consumer threads: the threads of one task
constexpr int NT = RINGS * CONSUMERS + (WS ? 128 : 0);
constexpr int LOADERS = WS ? 128 : NT;  // threads that issue the copies
// The producer warpgroup's threads that run its task loop. With TMA one thread issues every
// copy and arrive, so only its warp stays: the other three would only poll the same barriers,
// taking issue slots from the consumer warps of their SM sub-partitions.
constexpr int PRODUCER_THREADS = Config::TMA ? 32 : LOADERS;
constexpr int CPR = D * ELEM_BYTES / 16;    // 16-byte pieces per row (Q, K)
constexpr int V_CPR = D * V_ELEM_BYTES / 16;  // of a V row
constexpr int WIDE_BN = Config::WIDE_BN;
constexpr bool WIDE = WIDE_BN != 0;
// Rows of a K/V stage: the widest step's keys. Every K/V tile keeps this row count (its column
// chunks KV_ROWS * SW bytes apart) whichever width a task steps by, reading its first rows.
constexpr int KV_ROWS = WIDE ? WIDE_BN : BN;
constexpr int Q_BYTES = BM * D * ELEM_BYTES;
// A stage's K tile (keys x D), then its V tile (keys x D; INT8_PV: V^T, D x keys)
constexpr int K_BYTES = KV_ROWS * D * ELEM_BYTES;
constexpr int V_BYTES = KV_ROWS * D * V_ELEM_BYTES;
constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
constexpr int Q_BUFS = Config::Q_BUFFERS;
// The 8-bit form's K steps of a stage (a float a key), after the ring's tiles.
constexpr int K_STEP_BYTES = INT8 ? KV_ROWS * 4 : 0;
// A ring's tiles: its Q buffers, then its stages (ring r's start RING_BYTES x r in), then the
// 8-bit form's K steps.
constexpr int RING_BYTES = Q_BUFS * Q_BYTES + STAGES * (STAGE_BYTES + K_STEP_BYTES);
// The 8-bit form's V^T tile: D rows of a step's keys, swizzled over their bytes.
constexpr int SW_V = INT8_PV ? (KV_ROWS % 128 == 0 ? 128 : 64) : SW;
// Keys of one P V product (the k of the wgmma): a P fragment's keys.
constexpr int PK = INT8_PV ? 32 : 16;
static_assert(!INT8 || (Config::TMA && Config::PRODUCER && Config::RINGS == 1 &&
                        !Config::WIDE_BN && !Config::PACK_KEYS && !Config::WHOLE_TASKS &&
                        !Config::GUARD && BM == 128 && (D == 64 || D == 128) &&
                        (BN == 64 || BN == 128)),
              "the 8-bit form: TMA producer, span-by-span walk, 128-row tiles, no guard, head "
              "dim 64 or 128, 64- or 128-key steps");
static_assert(Q_BUFS == 1 || (Q_BUFS == 2 && WS), "two Q buffers need the producer");
static_assert(BM % 64 == 0 && BM >= 64, "64 rows per warpgroup");
static_assert(BN % 64 == 0, "BN must be a multiple of 64");
static_assert(D == 64 || D == 96 || D == 128, "head dim 64, 96 or 128");
static_assert(STAGES >= 3, "P V of chunk j-1 reads its stage while chunk j+1 loads");
// Chunks loaded ahead of the one computed: every stage but the current chunk's and the previous
// chunk's (whose V the pipelined P V still reads).
constexpr int PREFETCH = STAGES - 2;
static_assert(Q_BYTES % 1024 == 0 && K_BYTES % 1024 == 0 && V_BYTES % 1024 == 0,
              "tiles stay 1024-byte aligned");

constexpr bool PACKED = Config::PACK_KEYS != 0;
// K/V chunks by TMA: a chunk is BN consecutive keys from the walk's position (rows past the
// span's end read the keys that follow, or zeros past the sequence: masked, their V rows zeroed
// by zero_v_tail), which the packed walk's chunks are not.
constexpr bool TMA = Config::TMA != 0;
static_assert(!TMA || (WS && !PACKED), "TMA copies are the producer's, for the span-by-span walk");
// One warp of the producer warpgroup a ring: one thread of it issues the ring's copies.
static_assert(RINGS == 1 || (TMA && WGS == 1 && RINGS <= 4),
              "rings are lone consumer warpgroups, up to four, each fed by a TMA producer warp");
static_assert(!WIDE || (TMA && WIDE_BN > BN && WIDE_BN % 64 == 0 && BN % 64 == 0),
              "the wide step is the TMA producer's, copied in boxes of 64 keys");
static_assert(!WIDE || (Config::WIDE_SPANS > 0 && Config::WIDE_SLACK > 0),
              "the wide step needs its rule (WIDE_SPANS, WIDE_SLACK)");
// K/V rows one TMA box holds: a step's copies are STEP / KV_BOX of them, one map for both widths.
constexpr int KV_BOX = WIDE ? 64 : BN;
constexpr int WIDE_SPANS = Config::WIDE_SPANS;
constexpr int WIDE_SLACK = Config::WIDE_SLACK;
// The softmax of chunk j starts while the tensor cores multiply P_{j-1} by V_{j-1} where the
// registers allow P, S and O to be live at once: not at head dim 128 with 128-key steps, where
// ptxas spills even at the consumers' 224 registers (there the wait for S_j also waits for
// P_{j-1} V_{j-1}, and only the two warpgroups' alternation overlaps softmax and matrix work)
// -- unless a TMA producer leaves them 240 -- nor with three warpgroups and 128-key steps
// except at head dim 64 with a TMA producer (the consumers' 160 registers hold it there; the
// cp.async producer's 56 leave too few, and ptxas serializes).
// A lone consumer warpgroup (64-row tiles) with a TMA producer overlapping there spills too
// (ptxas 13.0: 4 bytes at 255 registers), so 64x128 tiles at D=128 keep the serial wait.
// (The wide step never overlaps: see WIDE_BN above.)
constexpr bool OVERLAP_PV = !(D == 128 && BN == 128 && (!TMA || WGS == 1)) &&
                            !(WGS == 3 && BN == 128 && !(TMA && D == 64));
template <int W>
__device__ constexpr bool overlap_pv() { return W == BN && OVERLAP_PV; }
constexpr bool PV_WAIT_ANCHOR = Config::PV_WAIT_ANCHOR != 0;

// With TMA copies the producer stages each chunk's span fields beside its stage (walks.cuh).
constexpr bool STAGED_SPANS = TMA;
// Every task whole-span (the plan's promise, Regime.whole_spans): one loop, every task walked by
// arithmetic -- Wan's dense layer (head dim 128) 1.0% faster than by the sparse walk, where a
// second loop beside it costs more than the walk gains outside the rings (docs/decisions.md).
constexpr bool WHOLE_TASKS = Config::WHOLE_TASKS != 0;
static_assert(!WHOLE_TASKS || (WS && !PACKED),
              "whole-span plans run the producer variants of the span-by-span walk");
// Tasks taken whole-span one by one beside the sparse walk (whole_span_task, walks.cuh says
// where it pays).
constexpr bool WHOLE_SPANS = !WHOLE_TASKS && STAGED_SPANS && RINGS > 1 && D == 64;

// Registers per thread after reallocation. setmaxnreg moves registers within the pool the CTA
// launched with -- NT times the per-thread count ptxas gives the kernel, which under
// __launch_bounds__(NT, MIN_BLOCKS) is 64K / (NT x MIN_BLOCKS) rounded down to 8 (the loader
// checks that it is) -- and an increase that the pool cannot cover waits forever. The
// producer needs few (56 hold its task loop, the packed walk's too, without spills); the
// consumers take the rest of the pool (multiples of 8), up to setmaxnreg's 256 (one consumer
// warpgroup at head dim 128 needs it).
// (A ring's producer warp keeps its ring's addresses: 32, which four rings' consumers' 112 leave.)
constexpr int PRODUCER_REGS = TMA ? (RINGS > 1 ? 32 : 24) : 56;
constexpr int LAUNCH_REGS = 65536 / (NT * MIN_BLOCKS) / 8 * 8;
constexpr int CONSUMER_REGS_FIT =
    (LAUNCH_REGS * NT - 128 * PRODUCER_REGS) / (RINGS * CONSUMERS) / 8 * 8;
constexpr int CONSUMER_REGS = CONSUMER_REGS_FIT < 256 ? CONSUMER_REGS_FIT : 256;

// PREPARE_FIRST: every chunk's word read and V tail zeroed before its products are issued,
// not only a task's first chunk's (see the consumer loop, mainloop.cuh). After the issue is
// faster on every kernel measured but the lone consumer warpgroup at head dim 128 (64x64 tiles,
// the variant built with PV_WAIT_ANCHOR), which runs 1.03-1.08x faster with them first
// (docs/decisions.md).
constexpr bool PREPARE_FIRST = PV_WAIT_ANCHOR;

// Named barriers (barrier 0 is __syncthreads): the consumers' issue turns (1 .. WGS, sync.cuh),
// then the producer's own (one a ring), a lone consumer warpgroup's own (zero_v_tail, one a
// ring), the non-finite guard's (one a ring and warpgroup, epilogue.cuh).
constexpr int PRODUCER_BAR = 1 + WGS;            // + ring
constexpr int TAIL_BAR = PRODUCER_BAR + RINGS;   // + ring
constexpr int GUARD_BAR = TAIL_BAR + RINGS;      // + ring x WGS + wg
static_assert(GUARD_BAR + RINGS * WGS <= 16, "16 named barriers a CTA");
static_assert(WS || WGS <= 2, "three consumer warpgroups need the producer variant's turns");

// WalkOf: the walk of the threads that copy K/V; ComputeWalkOf: the consumers' (which need no
// key positions: with packed keys, only each chunk's key count) unless a TMA producer stages
// the chunks' fields for them (StagedWalk, walks.cuh).
// The 8-bit form's chunks start at multiples of 16 keys (CHUNK_ALIGN): V's keys are reordered
// within each 16 (quantize_launch.v_key_order), P's fragment columns with them.
constexpr int CHUNK_ALIGN = INT8_PV ? 16 : 1;
template <int W>
using WalkOf = typename Select<PACKED, PackedWalk<W>, ChunkWalk<W, CHUNK_ALIGN>>::type;
template <int W>
using ComputeWalkOf = typename Select<PACKED, PackedCount<W>, ChunkWalk<W, CHUNK_ALIGN>>::type;
using Walk = WalkOf<BN>;
}  // namespace
