// Hopper block-sparse attention forward (sm_90a): warpgroup MMA (wgmma) with Q and K/V read by
// the tensor cores straight from swizzled shared memory, P kept in registers, a cp.async K/V
// pipeline, and the same online softmax, masking and epilogue as the portable family
// (common.cuh). Same task queue and kernel arguments as bsa_sm80.cu.
//
// A CTA runs one task at a time (the plain variant one task; the producer variant is persistent,
// taking tasks from a counter, see the kernel; with rings, TESSERA_RINGS, one task a ring):
// BM = 64 x WGS physical rows, warpgroup w owning rows 64w .. 64w+63 (warp i of the task's
// warpgroups owns rows 16i .. 16i+15, as in the portable family),
// walking the task's key spans BN keys at a time: S = Q K^T (wgmma, both operands K-major in
// shared memory), softmax on the S accumulators, O += P V (wgmma, P from registers, V N-major in
// shared memory). The softmax of one chunk starts while the tensor cores multiply the previous
// chunk's P by its V (how much of it runs beside that product: order_wait_after).
//
// Variant parameters (macros, set by tessera/cuda/loader.py):
//   TESSERA_BM       rows per task, 64 per warpgroup (192, three warpgroups: producer only)
//   TESSERA_BN       keys per step: 64 or 128 (a width wgmma.cuh instantiates)
//   TESSERA_D        head dim: 64, 96 or 128
//   TESSERA_STAGES   K/V stages (>= 3: chunk j computes, j-1's V is read, STAGES-2 load ahead)
//   TESSERA_BF16     1: bfloat16, 0: float16
//   TESSERA_PRODUCER 1: warp-specialized and persistent (a producer warpgroup copies, consumers
//                    compute, with register reallocation and strictly alternating consumer
//                    issue; the next task's chunks load while the current one computes); 0: every
//                    warpgroup copies and computes, one CTA barrier per key step
//   TESSERA_Q_BUFFERS 2 (producer only, where shared memory allows): the next task's Q loads
//                    while the current task computes, so the consumers start it without waiting
//                    for Q (a tile read once, from DRAM); 1: it loads after the current task's
//                    last S
//   TESSERA_TMA      1 (producer, unpacked walk only): one producer thread copies each Q tile
//                    and K/V chunk with bulk tensor copies (TMA) described by the tensor maps in
//                    the tma_maps parameter (tessera/cuda/tma.py), completing on the full
//                    barriers by byte count, and stages each chunk's span fields beside it
//                    (STAGED_SPANS); 0: 128 threads of cp.async
//   TESSERA_RINGS    (TMA producer, 64-row tiles only; default 1) lone consumer warpgroups a CTA,
//                    each with its own tasks, Q buffer and K/V stage ring, each ring fed by its
//                    own warp of the one producer warpgroup: a ring is what a 64-row CTA is
//                    otherwise, but the rings share one producer warpgroup's registers, which
//                    leaves four rings' consumers 112 each (four CTAs an SM would leave 104,
//                    where ptxas serializes their wgmma): a fourth consumer warp an SM
//                    sub-partition at head dim 64 (docs/decisions.md)
//   TESSERA_MIN_BLOCKS CTAs per SM the producer variant's registers are split for (default 1):
//                    2 (or 3, 64x64 tiles at head dim 64 with TMA) lets 64-row CTAs share an
//                    SM, each with one consumer warpgroup, instead of one CTA holding the whole
//                    register file
//   TESSERA_SMEM_ALIGNED 1: no slack reserved to align the tiles (the dynamic shared memory
//                    starts 1024-aligned; checked): the 1 KB that lets two 64x64 producer CTAs
//                    with one Q buffer share an SM at head dim 128
//   TESSERA_GUARD    0: no non-finite check of row-restricted chunks (common.cuh, GuardedRows)
//   TESSERA_PV_WAIT_ANCHOR 1: the softmax's first exponentials issued before the wait for the
//                    previous chunk's P V (order_wait_after), where ptxas otherwise moves the
//                    wait ahead of them all (variants.py says where it pays)
//   TESSERA_WHOLE_TASKS 1 (producer variants of the span-by-span walk): every task of the plan
//                    is a whole-span task (whole_span_task) -- a mask that selects every block,
//                    which the plan checks (Regime.whole_spans) -- so the consumers walk all of
//                    them by arithmetic in one loop
//   TESSERA_WIDE_BN  (TMA producer only; 0: off) a wider key step for tasks whose few spans are
//                    long: the producer takes a task of at most WIDE_SPANS spans at WIDE_BN
//                    keys a step when that computes at most ~3% more padded keys than BN-key
//                    steps, telling the consumers with the task's index; they run the task's
//                    loop instantiated for that width (no P V overlap: its registers do not fit
//                    at 192 keys). Fewer, longer steps spread each step's fixed costs (waits,
//                    turns, the running max and O's rescale) over more keys: dense CogVideoX
//                    (head dim 64) ran 3% faster than with BN alone, but random and
//                    spatial-temporal masks 3-8% slower though most of their tasks keep BN's
//                    steps (not explained yet; suspects: a 128-key chunk copied as two 64-key
//                    boxes, less L1 beside 181 KB of shared memory -- the 128-key loop's SASS
//                    is the default's) -- hence opt-in (Regime.wide_steps).
//
// Shared memory: Q_BUFFERS x Q (BM x D), then STAGES x {K, V} (KV_ROWS x D each: BN keys, or
// WIDE_BN with the wide step) -- with rings that for each ring in turn --, every tile in the
// layout wgmma reads: rows cut into SW-byte
// column chunks (SW = 128 when D is a multiple of 64, else 64), chunk-major ([chunk][row][SW
// bytes]), 16-byte pieces XOR-swizzled by the row within each 8-row group, each tile starting
// on a 1024-byte boundary; the producer variant's barriers and task-index words after them, a
// block a ring (with TMA also a 16-byte chunk word a stage). variants.smem_bytes mirrors the
// size.
#include "common.cuh"
#include "wgmma.cuh"

#ifndef TESSERA_PRODUCER
#define TESSERA_PRODUCER 0
#endif
#ifndef TESSERA_Q_BUFFERS
#define TESSERA_Q_BUFFERS 1
#endif
#ifndef TESSERA_MIN_BLOCKS
#define TESSERA_MIN_BLOCKS 1
#endif
#ifndef TESSERA_TMA
#define TESSERA_TMA 0
#endif
#ifndef TESSERA_WIDE_BN
#define TESSERA_WIDE_BN 0
#endif
#ifndef TESSERA_SMEM_ALIGNED
#define TESSERA_SMEM_ALIGNED 0
#endif
#ifndef TESSERA_PV_WAIT_ANCHOR
#define TESSERA_PV_WAIT_ANCHOR 0
#endif

namespace {
constexpr int BM = TESSERA_BM;
constexpr int BN = TESSERA_BN;
constexpr int D = TESSERA_D;
constexpr int STAGES = TESSERA_STAGES;
constexpr int WGS = BM / 64;  // consumer warpgroups of a task (they own the rows)
// TESSERA_PRODUCER = 1 adds a producer warpgroup that alone copies Q and K/V, handing stages
// over on mbarriers; the consumers then never wait for one another at a CTA-wide barrier.
constexpr bool WS = TESSERA_PRODUCER != 0;
#ifndef TESSERA_RINGS
#define TESSERA_RINGS 1
#endif
constexpr int RINGS = TESSERA_RINGS;  // independent task streams a CTA (see the macro)
constexpr int CONSUMERS = WGS * 128;  // a ring's consumer threads: the threads of one task
constexpr int NT = RINGS * CONSUMERS + (WS ? 128 : 0);
constexpr int LOADERS = WS ? 128 : NT;  // threads that issue the copies
// The producer warpgroup's threads that run its task loop. With TMA one thread issues every
// copy and arrive, so only its warp stays: the other three would only poll the same barriers,
// taking issue slots from the consumer warps of their SM sub-partitions.
constexpr int PRODUCER_THREADS = TESSERA_TMA ? 32 : LOADERS;
constexpr int SW = D % 64 == 0 ? 128 : 64;  // swizzle span and chunk width, bytes
constexpr int PPC = SW / 16;                // 16-byte pieces per chunk row
constexpr int CPR = D / 8;                  // 16-byte pieces per row
constexpr int WIDE_BN = TESSERA_WIDE_BN;
constexpr bool WIDE = WIDE_BN != 0;
// Rows of a K/V stage: the widest step's keys. Every K/V tile keeps this row count (its column
// chunks KV_ROWS * SW bytes apart) whichever width a task steps by, reading its first rows.
constexpr int KV_ROWS = WIDE ? WIDE_BN : BN;
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_BYTES = KV_ROWS * D * 2;
constexpr int STAGE_BYTES = 2 * KV_BYTES;
constexpr int Q_BUFS = TESSERA_Q_BUFFERS;
// A ring's tiles: its Q buffers, then its stages (ring r's start RING_BYTES x r in).
constexpr int RING_BYTES = Q_BUFS * Q_BYTES + STAGES * STAGE_BYTES;
static_assert(Q_BUFS == 1 || (Q_BUFS == 2 && WS), "two Q buffers need the producer");
static_assert(BM % 64 == 0 && BM >= 64, "64 rows per warpgroup");
static_assert(BN % 64 == 0, "BN must be a multiple of 64");
static_assert(D == 64 || D == 96 || D == 128, "head dim 64, 96 or 128");
static_assert(STAGES >= 3, "P V of chunk j-1 reads its stage while chunk j+1 loads");
// Chunks loaded ahead of the one computed: every stage but the current chunk's and the previous
// chunk's (whose V the pipelined P V still reads).
constexpr int PREFETCH = STAGES - 2;
static_assert(Q_BYTES % 1024 == 0 && KV_BYTES % 1024 == 0, "tiles stay 1024-byte aligned");

// TESSERA_PACK_KEYS = 1: a task's keys are walked end to end (PackedWalk, common.cuh), spans
// sharing chunks; 0: span by span (ChunkWalk).
#ifndef TESSERA_PACK_KEYS
#define TESSERA_PACK_KEYS 0
#endif
constexpr bool PACKED = TESSERA_PACK_KEYS != 0;
// K/V chunks by TMA: a chunk is BN consecutive keys from the walk's position (rows past the
// span's end read the keys that follow, or zeros past the sequence: masked, their V rows zeroed
// by zero_v_tail), which the packed walk's chunks are not.
constexpr bool TMA = TESSERA_TMA != 0;
static_assert(!TMA || (TESSERA_PRODUCER && !TESSERA_PACK_KEYS),
              "TMA copies are the producer's, for the span-by-span walk");
// One warp of the producer warpgroup a ring: one thread of it issues the ring's copies.
static_assert(RINGS == 1 || (TMA && WGS == 1 && RINGS <= 4),
              "rings are lone consumer warpgroups, up to four, each fed by a TMA producer warp");
static_assert(!WIDE || (TMA && WIDE_BN > BN && WIDE_BN % 64 == 0 && BN % 64 == 0),
              "the wide step is the TMA producer's, copied in boxes of 64 keys");
// K/V rows one TMA box holds: a step's copies are STEP / KV_BOX of them, one map for both widths.
constexpr int KV_BOX = WIDE ? 64 : BN;
// The wide step's rule (wide_task), set by the loader from the host's mirror of it
// (tessera/runtime/tasks.py WIDE_SPANS, WIDE_SLACK): tasks of more spans than WIDE_SPANS never
// take it (the producer reads each span's bounds to decide, before its copies), nor tasks whose
// keys rounded up to wide steps exceed those rounded up to BN-key steps by more than
// 1 / WIDE_SLACK.
#if TESSERA_WIDE_BN && !(defined(TESSERA_WIDE_SPANS) && defined(TESSERA_WIDE_SLACK))
#error "the wide step needs TESSERA_WIDE_SPANS and TESSERA_WIDE_SLACK (tessera/cuda/loader.py)"
#endif
#ifndef TESSERA_WIDE_SPANS
#define TESSERA_WIDE_SPANS 1  // (no wide step: unused)
#define TESSERA_WIDE_SLACK 1
#endif
constexpr int WIDE_SPANS = TESSERA_WIDE_SPANS;
constexpr int WIDE_SLACK = TESSERA_WIDE_SLACK;
// The softmax of chunk j starts while the tensor cores multiply P_{j-1} by V_{j-1} where the
// registers allow P, S and O to be live at once: not at head dim 128 with 128-key steps, where
// ptxas spills even at the consumers' 224 registers (there the wait for S_j also waits for
// P_{j-1} V_{j-1}, and only the two warpgroups' alternation overlaps softmax and matrix work)
// -- unless a TMA producer leaves them 240 -- nor with three warpgroups and 128-key steps
// except at head dim 64 with a TMA producer (the consumers' 160 registers hold it there; the
// cp.async producer's 56 leave too few, and ptxas serializes).
// A lone consumer warpgroup (64-row tiles) with a TMA producer overlapping there spills too
// (ptxas 13.0: 4 bytes at 255 registers), so 64x128 tiles at D=128 keep the serial wait.
// (The wide step, TESSERA_WIDE_BN, never overlaps: see there.)
constexpr bool OVERLAP_PV = !(D == 128 && BN == 128 && (!TMA || WGS == 1)) &&
                            !(WGS == 3 && BN == 128 && !(TMA && D == 64));
template <int W>
__device__ constexpr bool overlap_pv() { return W == BN && OVERLAP_PV; }
// ptxas places the wait for P_{j-1} V_{j-1} ahead of the softmax's exponentials whatever the
// source order (the SASS of every variant: the wait lands within the row-max reduction), so
// they run only once P V is done. It keeps the wait behind a shared-memory store, so one that
// takes the first exponentials holds part of them ahead of it; the rest then issue after the
// wait with P's conversions between them (as FlashAttention-4's sm90 loop has it), where a
// store of the row sums held every exponential ahead and left the 32 conversions to run alone
// after the wait (docs/decisions.md). The store never executes: its predicate, a negative
// value, is never true (exponentials times the positive scale, launch.check_scale, are >= 0
// or NaN; the scale is there because ptxas knows an exponential is never negative and would
// drop the store), so `addr` is never written.
constexpr bool PV_WAIT_ANCHOR = TESSERA_PV_WAIT_ANCHOR != 0;
__device__ __forceinline__ void order_wait_after(u32 addr, float x) {
  asm volatile("{\n.reg .pred p;\nsetp.lt.f32 p, %1, 0f00000000;\n@p st.shared.f32 [%0], %1;\n}"
               ::"r"(addr), "f"(x) : "memory");
}
// WalkOf: the walk of the threads that copy K/V; ComputeWalkOf: the consumers' (which need no
// key positions: with packed keys, only each chunk's key count) unless a TMA producer stages
// the chunks' fields for them (StagedWalk, ConsumerWalkOf).
#if TESSERA_PACK_KEYS
template <int W> using WalkOf = PackedWalk<W>;
template <int W> using ComputeWalkOf = PackedCount<W>;
#else
template <int W> using WalkOf = ChunkWalk<W>;
template <int W> using ComputeWalkOf = ChunkWalk<W>;
#endif
using Walk = WalkOf<BN>;
// A step width as a type, so that one generic lambda holds a task's loop for either width.
template <int W>
struct Step {
  static constexpr int keys = W;
};

// Byte offset of 16-byte piece `piece` (along D) of row `row` in a tile of ROWS rows. The XOR
// is the hardware's swizzle of address bits [4, 4 + log2(PPC)) by bits [7, ...), which the
// tile's 1024-byte alignment makes the same on offsets as on addresses.
template <int ROWS>
__device__ __forceinline__ u32 tile_offset(int row, int piece) {
  const u32 o = (u32)((piece / PPC) * ROWS * SW + row * SW + (piece % PPC) * 16);
  return o ^ (((o >> 7) & (PPC - 1)) << 4);
}

// wgmma shared-memory matrix descriptor, held as its two words: the low one the start address
// and the leading byte offset, the high one the stride byte offset and the swizzle mode (1:
// 128-byte, 2: 64-byte), all byte counts >> 4. A tile's descriptor is built once and each
// operand slice addressed as a byte offset from it: one integer add per wgmma on the issue path
// instead of rebuilding the fields. The add cannot carry out of the 14-bit start-address field,
// since shared addresses stay below 256 KB.
struct SmemDesc {
  u32 lo, hi;
  __device__ __forceinline__ u64 at(u32 byte_offset) const {
    return ((u64)hi << 32) | (u64)(lo + (byte_offset >> 4));
  }
};
__device__ __forceinline__ SmemDesc smem_desc(u32 addr, u32 lbo, u32 sbo) {
  constexpr u32 mode = SW == 128 ? 1 : 2;
  return {((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16), (sbo >> 4) | (mode << 30)};
}

// K-major operand (rows of D elements: Q or K) of a tile of ROWS rows: its descriptor, and the
// byte offset of the 16 columns of step kk. Within a chunk the step is a plain byte offset: the
// hardware applies the swizzle to the address it forms.
__device__ __forceinline__ SmemDesc k_major_desc(u32 base) { return smem_desc(base, 16, 8 * SW); }
template <int ROWS>
__device__ __forceinline__ u32 k_major_step(int kk) {
  constexpr int STEPS_PER_CHUNK = SW / 32;
  return (u32)((kk / STEPS_PER_CHUNK) * ROWS * SW + (kk % STEPS_PER_CHUNK) * 32);
}

// N-major operand V (keys x D, D contiguous): chunks of D are LBO apart, groups of 8 keys SBO
// apart; keys 16 kk .. 16 kk + 15 start kk * 16 * SW bytes in.
__device__ __forceinline__ SmemDesc v_desc(u32 base) {
  return smem_desc(base, KV_ROWS * SW, 8 * SW);
}
__device__ __forceinline__ u32 v_step(int kk) { return (u32)(kk * 16 * SW); }

// threadIdx.x, read anew where it is used (not a value the compiler may keep live, or spill).
__device__ __forceinline__ int thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Issue the asynchronous copies of one K/V chunk (which key each row holds: Walk::Cursor).
__device__ __forceinline__ void load_kv(u32 ks, const u16* k_head, i64 k_sl, const u16* v_head,
                                        i64 v_sl, const Walk& w, const int* spans, int se,
                                        int tid) {
  typename Walk::Cursor cur(w, spans, se);
  const u32 vs = ks + KV_BYTES;
  constexpr int ROW_STEP = LOADERS / CPR;
  // Rows a copy instruction covers when each takes one PPC-piece column chunk (one 128-byte line
  // at SW = 128) of a row: see below.
  constexpr int LINE_ROWS = LOADERS / PPC;
  if constexpr (PACKED && CPR > PPC && LOADERS % PPC == 0 && BN % LINE_ROWS == 0 &&
                LINE_ROWS % 8 == 0) {
    // The packed walk finds a row's key by walking the task's spans (a data-dependent loop over
    // global span fields), and its K and V addresses take 64-bit products: here PPC adjacent
    // threads share a row, each copying one piece of every column chunk of it, so a thread
    // does that for BN / LINE_ROWS rows instead of BN / ROW_STEP (4 against 8 at head dim 128),
    // and each copy instruction still reads whole lines (four rows of 128 bytes): Wan's top-k
    // cubes run 14-16% faster (H200, docs/decisions.md). Two threads a row (16 rows of 32 bytes
    // a copy instruction) ran them 22% slower. Rows LINE_ROWS apart (a multiple of 8) keep the
    // swizzle pattern: offsets step by constants. (A row of one column chunk, head dim 64,
    // takes the layout below, which is then the same.)
    // (The thread's index read anew rather than `tid`: from a loop invariant the compiler
    // hoists the row-derived offsets out of the producer's chunk loop, past its 56 registers
    // in this change's first layout; this form is the one timed.)
    const int lt = thread_index() % LOADERS, r0 = lt / PPC, p = lt % PPC;
    const u32 off0 = tile_offset<KV_ROWS>(r0, p);
#pragma unroll
    for (int it = 0; it < BN / LINE_ROWS; ++it) {
      const i64 key = cur.key(r0 + it * LINE_ROWS);
      const u16* k_row = k_head + key * k_sl + p * 8;
      const u16* v_row = v_head + key * v_sl + p * 8;
      const u32 off = off0 + (u32)(it * LINE_ROWS * SW);
      static_for<CPR / PPC>([&](auto c) {
        constexpr int C = decltype(c)::value;
        cp_async16_at<C * SW>(ks + off + (u32)(C * KV_ROWS * SW), k_row);
        cp_async16_at<C * SW>(vs + off + (u32)(C * KV_ROWS * SW), v_row);
      });
    }
  } else if constexpr (LOADERS % CPR == 0 && ROW_STEP % 8 == 0) {
    // Each thread copies the same piece of every ROW_STEP-th row: a multiple of 8 rows keeps the
    // swizzle pattern, so the shared-memory offsets step by a compile-time constant.
    const int r0 = tid / CPR, p = tid % CPR;
    const u32 off0 = tile_offset<KV_ROWS>(r0, p);
    // The packed walk's cursor (a data-dependent loop per row) unrolled less: the producer has
    // few registers (PRODUCER_REGS).
    constexpr int UNROLL = PACKED ? 4 : BN / ROW_STEP;
#pragma unroll UNROLL
    for (int it = 0; it < BN / ROW_STEP; ++it) {
      const i64 key = cur.key(r0 + it * ROW_STEP);
      const u32 off = off0 + (u32)(it * ROW_STEP * SW);
      cp_async16(ks + off, k_head + key * k_sl + p * 8);
      cp_async16(vs + off, v_head + key * v_sl + p * 8);
    }
  } else {
#pragma unroll 2
    for (int i = tid; i < BN * CPR; i += LOADERS) {
      const int r = i / CPR, p = i % CPR;
      const i64 key = cur.key(r);
      const u32 off = tile_offset<KV_ROWS>(r, p);
      cp_async16(ks + off, k_head + key * k_sl + p * 8);
      cp_async16(vs + off, v_head + key * v_sl + p * 8);
    }
  }
}

// Named barriers order the consumer warpgroups' matrix work (barrier 0 is __syncthreads):
// warpgroup w issues its wgmma only after warpgroup w - 1 has issued its own, so the tensor
// cores run one warpgroup's products while the others compute their softmax. With a CTA
// barrier every key step (no producer, two warpgroups) one barrier suffices; without it the
// turns go round strictly on WGS barriers (barrier 1 + w: warpgroup w's turn, passed on by
// w - 1), so none runs a step ahead. The producer's own barriers (one a ring) come after them.
constexpr int PRODUCER_BAR = 1 + WGS;  // + ring
static_assert(WS || WGS <= 2, "three consumer warpgroups need the producer variant's turns");
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

// Whether warpgroup wg's rows of a task are all padding: its 64 rows lie within one head's
// tile_rows and start at or past the task's `q_len` tokens. Only the producer variant's
// consumers can sit a task out (the plain variant's copy and meet at CTA barriers).
__device__ __forceinline__ bool idle_rows(int wg, int tile_rows, int q_len) {
  if constexpr (!WS || WGS == 1) return false;
  const int first = 64 * wg % tile_rows;
  return first >= q_len && first + 64 <= tile_rows;
}

// ---- warp specialization (TESSERA_PRODUCER) -----------------------------------------------------
__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar)
               : "memory");
}
#if !TESSERA_TMA  // (the TMA producer's copies complete on the barriers by byte count)
// Arrives on `bar` once every cp.async this thread issued before has completed.
__device__ __forceinline__ void mbar_arrive_on_copies(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
#endif
__device__ __forceinline__ void mbar_wait(u32 bar, int parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}" ::"r"(bar), "r"(parity) : "memory");
}
// Expects `bytes` more on `bar` (the TMA copies' completion) and arrives once.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}"
               ::"r"(bar), "r"(bytes) : "memory");
}
// One box of a 4-D tensor map (coordinates innermost first) into shared memory at `dst`,
// completing on `bar` with its byte count.
__device__ __forceinline__ void tma_load_4d(u32 dst, const void* map, int c0, int c1, int c2,
                                            int c3, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3), "r"(bar) : "memory");
}
// A chunk's K and V (W keys from `key0` of kv head `kvh`, batch `b`): per SW-byte column chunk
// of the tile, W / KV_BOX boxes (the maps' boxes are SW / 2 elements by KV_BOX rows, swizzled
// as tile_offset lays them out).
template <int W>
__device__ __forceinline__ void tma_load_kv(u32 ks, const TmaMaps& maps, int key0, int kvh,
                                            int b, u32 bar) {
  mbar_arrive_expect_tx(bar, 2 * W * D * 2);
#pragma unroll
  for (int p = 0; p < D * 2 / SW; ++p)
#pragma unroll
    for (int r = 0; r < W / KV_BOX; ++r) {
      const u32 off = (u32)(p * KV_ROWS * SW + r * KV_BOX * SW);
      tma_load_4d(ks + off, maps.k, p * SW / 2, key0 + r * KV_BOX, kvh, b, bar);
      tma_load_4d(ks + KV_BYTES + off, maps.v, p * SW / 2, key0 + r * KV_BOX, kvh, b, bar);
    }
}
// Whether a task takes the wide step (TESSERA_WIDE_BN): at most WIDE_SPANS spans, whose keys
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
// A task's Q tile: the Q map's box is SW / 2 elements by tile_rows tokens by the task's heads
// (GQA packing), which lands as tile row head * tile_rows + token -- Task::q_row's order. Rows
// past the task's end read the tokens that follow (never stored) or zeros.
__device__ __forceinline__ void tma_load_q(u32 qs, const TmaMaps& maps, int q_start, int h0,
                                           int b, u32 bar) {
  mbar_arrive_expect_tx(bar, Q_BYTES);
#pragma unroll
  for (int p = 0; p < D * 2 / SW; ++p)
    tma_load_4d(qs + (u32)(p * BM * SW), maps.q, p * SW / 2, q_start, h0, b, bar);
}

// ---- each chunk's span fields, staged by the TMA producer ---------------------------------------
// With TMA copies the producer writes each chunk's key range and its span's row restriction
// into a 16-byte word beside the chunk's stage (before the arrive that completes the stage's
// full barrier with the copies: the barrier's release and the consumers' acquiring wait order
// it), so the consumers never read the spans from global memory. Read there, the row
// restriction's loads sat between a chunk's wgmma issues (ptxas placed its compares there)
// and the next span's key range in the loop's back edge (moved into a uniform register): a
// global load's latency per span on the consumers' path, every chunk at 64-token blocks.
// The task's last chunk has key0's sign bit set (keys stay below 2^31).
constexpr bool STAGED_SPANS = TMA;
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
  __device__ __forceinline__ int key_end() const { return k1; }
  __device__ __forceinline__ int row_lo(const int*) const { return lo; }
  __device__ __forceinline__ int row_hi(const int*) const { return hi; }
};
// The walk the consumers compute a task's chunks by, for step width W.
template <bool STAGED, int W> struct ConsumerWalkSel { using type = ComputeWalkOf<W>; };
template <int W> struct ConsumerWalkSel<true, W> { using type = StagedWalk; };
template <int W> using ConsumerWalkOf = typename ConsumerWalkSel<STAGED_SPANS, W>::type;

// A whole-span task: one span whose row restriction covers the tile's rows (every task of a
// dense mask, most of a band's or a window's). Its consumers step through the span by
// arithmetic instead of reading each chunk's word, and its bounds (INT_MIN / INT_MAX) fold the
// rows' clip and the non-finite guard away: per chunk one shared-memory read, its decoding and
// the restriction's compares fewer. The producer decides it per task and publishes it with the
// index; the stages' words it writes anyway go unread. Only the rings at head dim 64 take it:
// there the second loop buys 2.6-6.5% on dense and band masks and costs nothing on random
// ones; every other variant measured runs slower with both loops, on sparse masks by 0.3-2.5%
// (docs/decisions.md).
#ifndef TESSERA_WHOLE_TASKS
#define TESSERA_WHOLE_TASKS 0
#endif
// Every task whole-span (the plan's promise, Regime.whole_spans): one loop, every task walked by
// arithmetic -- Wan's dense layer (head dim 128) 1.0% faster than by the sparse walk, where a
// second loop beside it costs more than the walk gains outside the rings (docs/decisions.md).
constexpr bool WHOLE_TASKS = TESSERA_WHOLE_TASKS != 0;
static_assert(!WHOLE_TASKS || (TESSERA_PRODUCER && !TESSERA_PACK_KEYS),
              "whole-span plans run the producer variants of the span-by-span walk");
constexpr bool WHOLE_SPANS = !WHOLE_TASKS && STAGED_SPANS && RINGS > 1 && D == 64;
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
  __device__ __forceinline__ int key_end() const { return k1; }
  __device__ __forceinline__ int row_lo(const int*) const { return (int)0x80000000u; }
  __device__ __forceinline__ int row_hi(const int*) const { return 0x7fffffff; }
};
// The consumers' walk of a task: Whole ? WholeSpanWalk : ConsumerWalkOf.
template <bool WHOLE, int W> struct TaskWalkSel { using type = ConsumerWalkOf<W>; };
template <int W> struct TaskWalkSel<true, W> { using type = WholeSpanWalk<W>; };
// A task's two choices as types, so that one generic lambda holds its loop for each.
template <bool B>
struct Flag {
  static constexpr bool value = B;
};
template <int REGS>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}
// Registers per thread after reallocation. setmaxnreg moves registers within the pool the CTA
// launched with -- NT times the per-thread count ptxas gives the kernel, which under
// __launch_bounds__(NT, MIN_BLOCKS) is 64K / (NT x MIN_BLOCKS) rounded down to 8 (the loader
// checks that it is) -- and an increase that the pool cannot cover waits forever. The
// producer needs few (56 hold its task loop, the packed walk's too, without spills); the
// consumers take the rest of the pool (multiples of 8), up to setmaxnreg's 256 (one consumer
// warpgroup at head dim 128 needs it).
// (A ring's producer warp keeps its ring's addresses: 32, which four rings' consumers' 112 leave.)
constexpr int PRODUCER_REGS = TMA ? (RINGS > 1 ? 32 : 24) : 56;
constexpr int MIN_BLOCKS = TESSERA_MIN_BLOCKS;
constexpr int LAUNCH_REGS = 65536 / (NT * MIN_BLOCKS) / 8 * 8;
constexpr int CONSUMER_REGS_FIT =
    (LAUNCH_REGS * NT - 128 * PRODUCER_REGS) / (RINGS * CONSUMERS) / 8 * 8;
constexpr int CONSUMER_REGS = CONSUMER_REGS_FIT < 256 ? CONSUMER_REGS_FIT : 256;

// Makes this thread's completed cp.async writes visible to the tensor cores' (async proxy)
// reads that follow the next barrier.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// PREPARE_FIRST: every chunk's word read and V tail zeroed before its products are issued,
// not only a task's first chunk's (see the consumer loop). After the issue is faster on every
// kernel measured but the lone consumer warpgroup at head dim 128 (64x64 tiles, the variant
// built with PV_WAIT_ANCHOR), which runs 1.03-1.08x faster with them first (docs/decisions.md).
constexpr bool PREPARE_FIRST = PV_WAIT_ANCHOR;
// A lone consumer warpgroup's own barrier (zero_v_tail), one a ring, after the producer's.
constexpr int TAIL_BAR = PRODUCER_BAR + RINGS;  // + ring
// A TMA chunk copies W consecutive keys: rows past the span's end hold keys that follow it,
// which no row of the task selects. Their P is 0, but 0 x Inf is NaN, so an Inf in such a V row
// would reach rows whose reference output is finite: warpgroup 0 zeroes those rows before any
// P V reads the stage (cp.async copies repeat the span's last key there instead, a selected
// one). The issue turns order the other warpgroups' wgmma after warpgroup 0's (a barrier chain);
// a lone warpgroup syncs its own threads. Only partial chunks pay (`valid` is uniform).
template <int W>
__device__ __forceinline__ void zero_v_tail(u32 vs, int valid, int wg, int ring) {
  if constexpr (TMA) {
    if (valid >= W) return;
    if (wg == 0) {
      const int t = thread_index() % 128;
#pragma unroll 1
      for (int i = t; i < (W - valid) * CPR; i += 128) {
        const u32 at = vs + tile_offset<KV_ROWS>(valid + i / CPR, i % CPR);
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(at), "r"(0u) : "memory");
      }
      fence_async_smem();  // the zeros, for the tensor cores' reads
    }
    if constexpr (WGS == 1) named_bar_sync(TAIL_BAR + ring, 128);
  }
}

// A copy of one 16-row tile's accumulators in local memory (volatile: never promoted to the
// registers the accumulators already fill), kept by the rows a chunk excludes across its P V.
template <int NB>
struct GuardedRows {
  volatile float v[NB][4];
  __device__ __forceinline__ void keep(const float (&acc)[NB][4]) {
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      v[i][0] = acc[i][0]; v[i][1] = acc[i][1];
      v[i][2] = acc[i][2]; v[i][3] = acc[i][3];
    }
  }
  // Sets the rows in `rows` to zero through the copy (a constant would have ptxas keep
  // another set of registers for the accumulators).
  __device__ __forceinline__ void restore_zeros(float (&acc)[NB][4], int rows) {
#pragma unroll
    for (int i = 0; i < NB; ++i) v[i][0] = v[i][1] = v[i][2] = v[i][3] = 0.f;
    restore(acc, rows);
  }
  // Takes back the rows in `rows` (excluded_rows' bits).
  __device__ __forceinline__ void restore(float (&acc)[NB][4], int rows) const {
    if (rows & 1) {
#pragma unroll
      for (int i = 0; i < NB; ++i) { acc[i][0] = v[i][0]; acc[i][1] = v[i][1]; }
    }
    if (rows & 2) {
#pragma unroll
      for (int i = 0; i < NB; ++i) { acc[i][2] = v[i][2]; acc[i][3] = v[i][3]; }
    }
  }
};

// Whether V rows [0, valid) of a stage hold an Inf or NaN: one answer for the warpgroup (a
// barrier reduction over its 128 threads, on a barrier of its own). Rows past `valid` are
// left alone: zero_v_tail may be writing them.
constexpr int GUARD_BAR = TAIL_BAR + RINGS;  // + ring x WGS + wg
static_assert(GUARD_BAR + RINGS * WGS <= 16, "16 named barriers a CTA");
template <int W>
__device__ __forceinline__ bool stage_v_non_finite(u32 vs, int valid, int bar) {
  const int t = thread_index() % 128;
  const int n = (valid < W ? valid : W) * CPR;
  u32 bad = 0;
#pragma unroll 1
  for (int i = t; i < n; i += 128) {
    const u32 at = vs + tile_offset<KV_ROWS>(i / CPR, i % CPR);
#pragma unroll
    for (int w = 0; w < 4; ++w) bad |= non_finite_word(at + 4 * w);
  }
  u32 any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 q, %1, 0;\n bar.red.or.pred p, %2, 128, q;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(any) : "r"(bad), "r"(bar) : "memory");
  return any != 0;
}
}  // namespace

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_fwd_sm90(TESSERA_BSA_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Read again where it is used (a cached load) rather than kept live across the register
  // reallocation, where ptxas would spill it.
  const auto num_tasks = [&] { TESSERA_NUM_TASKS; return num_tasks; };
  // (a grid sized by a bound: sync-free plan)
  if ((int)blockIdx.x * RINGS >= num_tasks()) return;
  const Operand q{q_ptr, q_sb, q_sh, q_sl};
  const int tid = threadIdx.x, warp = tid / 32;
  // Broadcast from lane 0: the compiler then knows it is warp-uniform and keeps what derives
  // from it (the Q descriptor) in uniform registers, next to the wgmma that read them.
  const int cwg = __shfl_sync(0xffffffffu, warp / 4, 0);  // the CTA's warpgroup
  const bool producer = WS && cwg == RINGS * WGS;
  // The ring a thread works for (TMA producer: its warp's; the cp.async producer's 128 threads
  // feed the one ring), and its warpgroup within the ring's task (WGS: the producer).
  const int pwarp = __shfl_sync(0xffffffffu, warp % 4, 0);  // (a TMA producer warp's ring)
  const int ring = RINGS == 1 ? 0 : producer ? pwarp : cwg;
  const int wg = producer ? WGS : cwg % WGS;
  const int twarp = warp - 4 * WGS * ring;  // a consumer's warp within its task

  // wgmma's swizzle alignment. TESSERA_SMEM_ALIGNED: the launch reserved no slack for it
  // (loader.smem_bytes), which holds where the dynamic shared memory starts 1024-aligned -- as it
  // does right after the CTA's reserved 1 KB, with no static shared memory; a CTA where it does
  // not stops at once rather than overrun.
  const u32 smem_base = smem_addr(smem_raw);
  if (TESSERA_SMEM_ALIGNED && (smem_base & 1023u)) __trap();
  const u32 tiles_base = (smem_base + 1023u) & ~1023u;
  const u32 q_base = tiles_base + (u32)(ring * RING_BYTES);
  const u32 stage_base = q_base + Q_BUFS * Q_BYTES;
  // mbarriers after every ring's tiles (producer variant), a block a ring: full[STAGES],
  // empty[STAGES], Q full[Q_BUFS], Q empty[Q_BUFS], then four task-index words (and with
  // STAGED_SPANS a chunk word a stage). Task n's Q sits in buffer n % Q_BUFS.
  constexpr u32 RING_BAR_BYTES = 16 * (STAGES + Q_BUFS) + 16 + (TMA ? 16 * STAGES : 0);
  const u32 full_bar = tiles_base + RINGS * RING_BYTES + (u32)ring * RING_BAR_BYTES;
  const u32 empty_bar = full_bar + 8 * STAGES;
  const u32 q_full_bar = empty_bar + 8 * STAGES;
  const u32 q_empty_bar = q_full_bar + 8 * Q_BUFS;

  // The producer variant is persistent: CTA blockIdx.x starts with task blockIdx.x and then
  // takes the next untaken task of the queue from a global counter (gridDim.x + the count), so
  // tasks start longest first, in queue order, on whichever CTA is free -- the hardware's own
  // order for one-task CTAs, which keeps the K/V being read by concurrent tasks together in L2.
  // The producer takes the next task as soon as it has issued the current one's copies, and the
  // K/V stage ring runs on across tasks: the next task's first chunks load while the current
  // one is computed. Its Q follows once the consumers have finished the current task's S, and
  // goes to them with the task's index through shared memory; an index past the queue ends
  // the CTA. Otherwise one CTA runs one task.
  // Two words each, used alternately by successive tasks: the index published to the
  // consumers with a task's Q, and the index the producer takes ahead for itself.
  volatile int* task_slot = reinterpret_cast<volatile int*>(
      smem_raw + (q_empty_bar + 8 * Q_BUFS - smem_addr(smem_raw)));
  volatile int* next_slot = task_slot + 2;
  // STAGED_SPANS: one 16-byte word a stage after them, the chunk it holds (stage_chunk_info).
  const u32 chunk_info = q_empty_bar + 8 * Q_BUFS + 16;

  if constexpr (WS) {
    if (tid % (4 * 32 * WGS) == 0 && !producer) {  // the first thread of each ring's task
      for (int st = 0; st < STAGES; ++st) {
        mbar_init(full_bar + 8 * st, TMA ? 1 : LOADERS);  // TMA: one expecting arrive
        mbar_init(empty_bar + 8 * st, CONSUMERS);
      }
      for (int b = 0; b < Q_BUFS; ++b) {
        // + the arrive publishing the task index (TMA: that and the one expecting Q's bytes)
        mbar_init(q_full_bar + 8 * b, TMA ? 2 : LOADERS + 1);
        mbar_init(q_empty_bar + 8 * b, CONSUMERS);
      }
    }
    __syncthreads();
    if (producer) {
      // The producer: per task its Q (once the consumers are done with the previous task's),
      // then every chunk c into stage c % STAGES once the consumers have released chunk
      // c - STAGES. Its copies arrive on the Q / stage full barriers.
      regs_decrease<PRODUCER_REGS>();
      if (TMA && pwarp >= RINGS) return;  // a warp a ring
      const int ptid = tid - RINGS * CONSUMERS - (TMA ? 32 * ring : 0);
      int c = 0;  // chunks loaded, over all of this ring's tasks
      // The first task; later ones are taken from the shared counter (each ring a CTA of the
      // grid's RINGS x gridDim.x).
      int ti = (int)blockIdx.x * RINGS + ring;
      for (int n = 0;; ++n) {
        bool wide = false;  // the task's step: WIDE_BN keys, else BN
        bool whole = false;  // a whole-span task (whole_span_task)
        // Task n's Q, into buffer n % Q_BUFS once the consumers are done with the task that
        // used it last (n - Q_BUFS), published with its index.
        const auto hand_over_q = [&](bool real) {
          const int qb = n % Q_BUFS;
          const u32 full = q_full_bar + 8 * qb;
          if (n >= Q_BUFS) mbar_wait(q_empty_bar + 8 * qb, (n / Q_BUFS - 1) & 1);
          if (ptid == 0) {
            task_slot[n & 1] = 4 * ti + 2 * (int)whole + (int)wide;
            mbar_arrive(full);  // releases the index to the consumers
          }
          if (!real) {
            // no Q to copy: the consumers find the end of the queue
            if (!TMA || ptid == 0) mbar_arrive(full);
            return;
          }
          const Task task(tasks, ti, k_ptr, k_sb, k_sh, v_ptr, v_sb, v_sh, group);
          const u32 qs = q_base + (u32)(qb * Q_BYTES);
#if TESSERA_TMA
          if (ptid == 0) tma_load_q(qs, tma_maps, task.q_start, task.h0, task.b, full);
#else
          for (int i = ptid; i < BM * CPR; i += LOADERS) {
            const int r = i / CPR, p = i % CPR;
            cp_async16(qs + tile_offset<BM>(r, p), task.q_row(q, r, tile_rows) + p * 8);
          }
          mbar_arrive_on_copies(full);
#endif
        };
        if (ti >= num_tasks()) {
          hand_over_q(false);
          break;
        }
        // Task n's chunks go into the stages as soon as the previous task's chunks leave them.
        // With one Q buffer its Q can only follow the previous task's last S, so the chunks are
        // issued first, up to the point where the producer would wait for a stage holding one
        // of this task's own chunks -- the consumers release those only once they have this Q.
        // With two, the buffer is free (task n-2's) and Q goes first.
        const Task task(tasks, ti, k_ptr, k_sb, k_sh, v_ptr, v_sb, v_sh, group);
        // The step width the consumers will compute this task at (published with its index):
        // its chunks are copied at that width.
        wide = wide_task(spans, task.span_begin, task.span_end);
        whole = whole_span_task(spans, task);
        const int c0 = c;
        bool q_sent = false;
        if (Q_BUFS == 2) {
          hand_over_q(true);
          q_sent = true;
        }
        const auto load_task = [&](auto step) {
          constexpr int W = decltype(step)::keys;
          WalkOf<W> w;
          for (w.open(spans, task.span_begin, task.span_end); w.si < task.span_end; ++c) {
            const int st = c % STAGES;
            if (!q_sent && c - STAGES >= c0) {
              hand_over_q(true);
              q_sent = true;
            }
            if (c >= STAGES) mbar_wait(empty_bar + 8 * st, (c / STAGES - 1) & 1);
#if TESSERA_TMA
            if (ptid == 0) {
              if constexpr (STAGED_SPANS)
                stage_chunk_info(chunk_info + 16 * st, w.key0(), w.key_end(), w.row_lo(spans),
                                 w.row_hi(spans), w.last(task.span_end));
              tma_load_kv<W>(stage_base + (u32)(st * STAGE_BYTES), tma_maps, w.key0(),
                             task.h0 / group, task.b, full_bar + 8 * st);
            }
#else
            load_kv(stage_base + (u32)(st * STAGE_BYTES), task.k_head, k_sl, task.v_head, v_sl,
                    w, spans, task.span_end, ptid);
            mbar_arrive_on_copies(full_bar + 8 * st);
#endif
            w.next(spans, task.span_end);
          }
        };
        if (wide) load_task(Step<KV_ROWS>{});  // (KV_ROWS is BN without the wide step)
        else load_task(Step<BN>{});
        if (!q_sent) hand_over_q(true);
        // The next task, taken now so that its chunks load while this one is computed. Every
        // task run takes one ticket, so the launch takes num_tasks in all: the CTA holding the
        // last one knows no other will touch the counter again and zeroes it for the next run
        // (the host never resets it: a run is one launch, which a CUDA graph replays as is).
        if (ptid == 0) {
          const int ticket = atomicAdd(task_counter, 1);
          if (ticket == num_tasks() - 1) *task_counter = 0;
          next_slot[(n + 1) & 1] = ticket + (int)gridDim.x * RINGS;
        }
        named_bar_sync(PRODUCER_BAR + ring, PRODUCER_THREADS);  // the producer's: index written
        ti = next_slot[(n + 1) & 1];
      }
      cp_async_wait<0>();
      return;
    }
    regs_increase<CONSUMER_REGS>();
    if (WGS > 1 && wg == WGS - 1) named_bar_arrive(1, 256);  // warpgroup 0 issues first
  }

  int j = 0;  // chunks computed, over all of this CTA's tasks: chunk j sits in stage j % STAGES
  for (int n = 0;; ++n) {
    int ti = blockIdx.x;
    bool wide = false;  // the task's step: WIDE_BN keys, else BN (the producer's choice)
    bool whole = WHOLE_TASKS;  // a whole-span task (the plan's promise or the producer's choice)
    const int qb = n % Q_BUFS;
    if constexpr (WS) {
      mbar_wait(q_full_bar + 8 * qb, (n / Q_BUFS) & 1);  // the task's index, and its Q
      const int word = task_slot[n & 1];
      ti = word >> 2;
      wide = WIDE && (word & 1);
      whole = WHOLE_TASKS || (WHOLE_SPANS && (word & 2));
      if (ti >= num_tasks()) break;
    } else if (n > 0) {
      break;
    }
    const SmemDesc q_desc = k_major_desc(q_base + (u32)(qb * Q_BYTES + wg * 64 * SW));
    const Task task(tasks, ti, k_ptr, k_sb, k_sh, v_ptr, v_sb, v_sh, group);
    const int q_start = task.q_start, q_end = task.q_end, se = task.span_end;
    // This warp's 16 rows are one head and 16 consecutive tokens (tile_rows is a multiple of
    // 16).
    // (Padding rows of the tile, tok_base >= q_end, fall outside every span's clipped
    // restriction below, so the softmax needs no separate flag for them.)
    const int tok_base = q_start + twarp * 16 % tile_rows;

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    // A warpgroup whose 64 rows are all padding (a tile of one head shorter than 64 x wg rows:
    // the tail of a variable-size query block) computes nothing: it only keeps the issue turns
    // and releases the stages, so the others run alone on the tensor cores.
    const bool idle = idle_rows(wg, tile_rows, q_end - q_start);

    // The task's loop, for its step width W and its walk (a generic lambda: one instantiation
    // per width and walk).
    const auto run_task = [&](auto step, auto whole_span) {
      constexpr int W = decltype(step)::keys;
      WalkOf<W> load_walk;  // (the plain variant's: with a producer the consumers copy nothing)
      if constexpr (!WS) load_walk.open(spans, task.span_begin, se);
      typename TaskWalkSel<decltype(whole_span)::value, W>::type walk;
      if constexpr (!WS && !PACKED) walk = load_walk;  // the same walk: no second read
      else walk.open(spans, task.span_begin, se);
      if (idle) {
        for (; walk.more(se); ++j) {
          if constexpr (STAGED_SPANS) {  // (the chunk's word says whether another follows)
            mbar_wait(full_bar + 8 * (j % STAGES), (j / STAGES) & 1);
            walk.read(chunk_info + 16 * (j % STAGES));
          }
          wait_issue_turn(wg);
          pass_issue_turn(wg);
          mbar_arrive(empty_bar + 8 * (j % STAGES));  // (the turn came after chunk j landed)
          walk.next(spans, se);
        }
        mbar_arrive(q_empty_bar + 8 * qb);
        return;
      }
      if constexpr (!WS) {
        // Prologue: the Q tile and chunks 0 .. PREFETCH-1, one commit group per chunk (Q rides
        // with the first); every iteration then commits one chunk (PREFETCH ahead), so "all but
        // the newest PREFETCH-1 groups have landed" means the current chunk has.
        for (int i = tid; i < BM * CPR; i += NT) {
          const int r = i / CPR, p = i % CPR;
          cp_async16(q_base + tile_offset<BM>(r, p), task.q_row(q, r, tile_rows) + p * 8);
        }
#pragma unroll
        for (int st = 0; st < PREFETCH; ++st) {
          if (load_walk.more(se)) {
            load_kv(stage_base + (u32)(st * STAGE_BYTES), task.k_head, k_sl, task.v_head, v_sl,
                    load_walk, spans, se, tid);
            load_walk.next(spans, se);
          }
          cp_async_commit();
        }
      }

      // Software pipeline, per warpgroup: iteration j issues S_j = Q K_j^T and then O += P_{j-1}
      // V_{j-1}, waits for S_j only, starts the softmax of chunk j while the tensor cores still
      // work on P V (some of its exponentials too where order_wait_after keeps them there), then
      // waits for that, turns S_j into P_j -- before O's rescale, a branch, so that ptxas
      // interleaves the conversions with the exponentials it issues after the wait -- and
      // rescales O. The stage being refilled
      // in iteration j (with chunk j + PREFETCH) held chunk j-2, which every warpgroup finished
      // with before the barrier. The matrix operations are issued unconditionally (a row tile
      // with no part in a chunk gets P = 0): ptxas serializes wgmma issued on paths it cannot
      // prove uniform across the warpgroup. A task's first chunk has no previous P: it issues
      // P V with P = 0 over its own V (landed), which adds nothing to O -- but 0 x Inf where that
      // V holds an Inf: rows a restricted first chunk excludes are set back to zero after it
      // (the rows it applies to select that value). Issuing that P V
      // only from the second chunk on made ptxas close every iteration with an empty wgmma group
      // (a dummy HGMMA after the merge), so the wait for S_j also waited for P_{j-1} V_{j-1} and
      // the softmax never overlapped it.
      u32 pa[W / 16][4];  // P of the previous chunk, bf16/fp16 pairs (A fragments)
#pragma unroll
      for (int kk = 0; kk < W / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
      float s[W / 8][4];
      u32 vs_prev = 0;  // V of the previous chunk of this task
      // jt counts this task's chunks: conditions on it (not on vs_prev) are ones the compiler can
      // prove uniform, which keeps the wgmma under them from being serialized.
      int jt = 0;
      // The rows the previous chunk excludes that keep their accumulators across its P V
      // (excluded_rows' bits; 0 unless that chunk's V holds a non-finite value).
      int guard_prev = 0;
      GuardedRows<D / 8> kept;
      // The thread's two rows and its place in the quad, fixed for the task: read once here,
      // the chunk's row checks read no thread index between the issue and the softmax.
      const int lane = thread_index() % 32;
      const int t0 = tok_base + lane / 4, quad = lane % 4;
      for (; walk.more(se); ++j, ++jt) {
        if constexpr (WS) {
          mbar_wait(full_bar + 8 * (j % STAGES), (j / STAGES) & 1);
          fence_async_smem();
        } else {
          cp_async_wait<PREFETCH - 1>();
          fence_async_smem();
          __syncthreads();
          if (load_walk.more(se)) {
            load_kv(stage_base + (u32)(((j + PREFETCH) % STAGES) * STAGE_BYTES), task.k_head,
                    k_sl, task.v_head, v_sl, load_walk, spans, se, tid);
            load_walk.next(spans, se);
          }
          cp_async_commit();
        }

        const u32 ks = stage_base + (u32)((j % STAGES) * STAGE_BYTES);
        // The chunk's word (STAGED_SPANS) is read and a partial chunk's V tail zeroed once this
        // iteration's products are issued -- they read K_j and V_{j-1} only, so the issue never
        // waits for the chunk's fields -- but before the turn passes, which orders the other
        // warpgroups' products after the zeros. A task's first chunk does both first: its P V
        // (P = 0) reads its own V.
        const bool prepare_first = PREPARE_FIRST || jt == 0;
        const auto prepare = [&] {
          if constexpr (STAGED_SPANS) walk.read(chunk_info + 16 * (j % STAGES));
          zero_v_tail<W>(ks + KV_BYTES, walk.key_end() - walk.key0(), wg, ring);
        };
        if (prepare_first) prepare();
        if (guard_prev) kept.keep(o);

        wait_issue_turn(wg);
        wgmma_hold<D / 2>(&o[0][0]);
        wgmma_fence();
        const SmemDesc k_desc = k_major_desc(ks), vd = v_desc(jt > 0 ? vs_prev : ks + KV_BYTES);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          Wgmma<W>::ss(&s[0][0], q_desc.at(k_major_step<BM>(kk)),
                       k_desc.at(k_major_step<KV_ROWS>(kk)), kk > 0);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) Wgmma<D>::rs(&o[0][0], pa[kk], vd.at(v_step(kk)), 1);
        wgmma_commit();
        if (!prepare_first) prepare();
        pass_issue_turn(wg);
        // Rows this span applies to, clipped to the tile's real rows.
        const int lo = max(walk.row_lo(spans), q_start);
        const int hi = min(walk.row_hi(spans), q_end);
        const int valid = walk.key_end() - walk.key0();
        // (checked while the tensor cores work; `lo`, `hi` are uniform, so is the branch)
        int guard = 0;
        if (GUARD && (lo > q_start || hi < q_end) &&
            stage_v_non_finite<W>(ks + KV_BYTES, valid, GUARD_BAR + ring * WGS + wg))
          guard = excluded_rows(t0, lo, hi);

        wgmma_wait<overlap_pv<W>() ? 1 : 0>();
        wgmma_hold<W / 2>(&s[0][0]);
        // Mask: keys past the span end, rows outside the span's restriction or the tile. A warp
        // with no row in the chunk runs it too, every score masked (P = 0, m and l unchanged):
        // a branch around the softmax had every iteration zero S's registers in advance (32
        // CS2R at head dim 64), for warps that are rare (padding rows, restricted spans).
        float al[2];
        softmax_chunk(s, m, l, al, walk.key0(), walk.key_end(), t0 >= lo && t0 < hi,
                      t0 + 8 >= lo && t0 + 8 < hi, quad, scale_log2);
        if constexpr (PV_WAIT_ANCHOR && overlap_pv<W>())
          order_wait_after(q_base, (s[0][0] + s[0][2]) * scale_log2);
        wgmma_wait<0>();
        wgmma_hold<D / 2>(&o[0][0]);
        wgmma_hold<W / 2>(&s[0][0]);  // P is rewritten only after the P V that read it is done
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) p_fragment(pa[kk], s, kk);
        if (WS && jt > 0) mbar_arrive(empty_bar + 8 * ((j - 1) % STAGES));  // j-1 is done
        if (guard_prev) kept.restore(o, guard_prev);
        if (jt == 0 && guard) kept.restore_zeros(o, guard);  // (the first chunk's P V: see above)
        guard_prev = guard;
        if (al[0] != 1.f || al[1] != 1.f) {
#pragma unroll
          for (int i = 0; i < D / 8; ++i) {
            o[i][0] *= al[0]; o[i][1] *= al[0];
            o[i][2] *= al[1]; o[i][3] *= al[1];
          }
        }
        vs_prev = ks + KV_BYTES;
        walk.next(spans, se);
      }
      // Every S of this task has been waited for: the producer may reuse its Q buffer.
      if constexpr (WS) mbar_arrive(q_empty_bar + 8 * qb);
      if (jt > 0) {  // the last chunk's P V (uniform: every thread walked the same spans)
        if (guard_prev) kept.keep(o);
        wgmma_hold<D / 2>(&o[0][0]);
        wgmma_fence();
        const SmemDesc vd = v_desc(vs_prev);
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) Wgmma<D>::rs(&o[0][0], pa[kk], vd.at(v_step(kk)), 1);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_hold<D / 2>(&o[0][0]);
        if (guard_prev) kept.restore(o, guard_prev);
        if (WS) mbar_arrive(empty_bar + 8 * ((j - 1) % STAGES));  // the task's last chunk is done
      }
    };
    const auto run_walk = [&](auto step) {
      // (one loop where neither is set, or where every task is whole-span: whole is constant)
      if (whole) run_task(step, Flag<WHOLE_SPANS || WHOLE_TASKS>{});
      else run_task(step, Flag<false>{});
    };
    if (wide) run_walk(Step<KV_ROWS>{});  // (KV_ROWS is BN without the wide step)
    else run_walk(Step<BN>{});
    if constexpr (!WS) cp_async_wait<0>();

    // Every warp runs the epilogue (store_rows writes real rows only): a branch on whether the
    // warp's rows are real would put the accumulators on a divergent path before the next
    // task's wgmma, which ptxas answers by serializing them (C7520).
    // The thread's row coordinates are derived again from a fresh read of its index: kept
    // live across the task's loop, ptxas spilled them in the variant with two step widths.
    // (% CONSUMERS: the thread's place in its ring's task)
    const int e_tid = thread_index() % CONSUMERS, e_warp = e_tid / 32, e_g = e_tid % 32 / 4;
    const int e_row = e_warp * 16 % tile_rows + e_g;
    const Output out{o_ptr, o_sb, o_sh, o_sl, lse_ptr, lse_sb, lse_sh, part_o, part_lse};
    store_rows<D>(out, o, m, l, task.b, task.h0 + e_warp * 16 / tile_rows, q_start + e_row,
                  q_end, e_warp * 16 + e_g, BM, task.slot, e_tid % 4);
  }
  if constexpr (WS) {
    if (WGS > 1 && wg == 0) named_bar_sync(1, 256);  // the turn the last warpgroup passed
  }
}
