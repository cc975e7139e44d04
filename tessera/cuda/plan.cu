// Device planner kernels: the row-parallel part of the physical mapping
// (tessera/runtime/mapping.py), run on the dense block matrix of a device mask so a new mask is
// planned in a few launches instead of dozens of array operations. One warp per mask row; each
// lane looks at key blocks lane, lane + 32, ... of the row and of the row before it.
//
// Semantics are those of mapping._row_stats and of the spans of groups without restricted
// merges; tests compare both planners array for array.
#include "common/types.cuh"
#include "queue.cuh"

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
// row of the same head, BN-chunks of its spans (pack != 0: of its keys end to end, the packed
// walk's cost), and whether it equals the previous row. count, key_tokens and overlap_tokens may
// be null (the device planner needs none of them). walk_chunks, unless null: both walks' chunks
// times the row's tiles (its query block's tokens over tile_rows, rounded up) added into
// walk_chunks[0] (span by span) and [1] (packed), which the caller zeroes
// (mapping.key_walk_chunks).
extern "C" __global__ void plan_row_stats(const unsigned char* __restrict__ dense, int n_rows,
                                          int n_kv, int n_q, const i64* __restrict__ kv_bounds,
                                          int block_n, int* count, int* nspans, i64* key_tokens,
                                          i64* overlap_tokens, int* chunks,
                                          unsigned char* identical, int pack,
                                          const i64* __restrict__ q_bounds, int tile_rows,
                                          unsigned long long* walk_chunks) {
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
    if (count != nullptr) count[r] = cnt;
    nspans[r] = spans;
    if (key_tokens != nullptr) key_tokens[r] = ktok;
    if (overlap_tokens != nullptr) overlap_tokens[r] = w.prev ? otok : 0;
    chunks[r] = pack ? (int)((ktok + block_n - 1) / block_n) : (int)chk;
    identical[r] = w.prev != nullptr && cnt == prev_cnt && ov_cnt == cnt;
    if (walk_chunks != nullptr) {
      const int qi = r % n_q;
      const i64 tiles = (q_bounds[qi + 1] - q_bounds[qi] + tile_rows - 1) / tile_rows;
      atomicAdd(walk_chunks, (unsigned long long)(chk * tiles));
      atomicAdd(walk_chunks + 1, (unsigned long long)((ktok + block_n - 1) / block_n * tiles));
    }
  }
}

// The key spans of the columns where `sel` holds (maximal runs of adjacent key blocks), one
// warp: written at spans[out ...] with [q0, q1) as their row restriction (int32 rows of
// (k_start, k_end, r_start, r_end), the task-queue span layout) unless `spans` is null -- those
// before spans[limit] only -- and counted: returned as the number of spans, with their
// BN-chunks added to `chunks`.
template <typename Sel>
__device__ __forceinline__ int walk_spans(const Sel& sel, int n_kv,
                                          const i64* __restrict__ kv_bounds, int block_n,
                                          i64 out, i64 limit, int q0, int q1, int* spans,
                                          int lane, i64& chunks) {
  int carry = -1, n = 0;
  for (int base = 0; base < n_kv; base += 32) {
    const int c = base + lane;
    const bool s = sel(c);
    const bool start = s && !sel(c - 1), end = s && !sel(c + 1);
    const u32 starts = __ballot_sync(0xffffffffu, start);
    const u32 ends = __ballot_sync(0xffffffffu, end);
    if (end) {
      const int s0 = span_start_of(starts, lane, base, carry);
      chunks += (kv_bounds[c + 1] - kv_bounds[s0] + block_n - 1) / block_n;
      const i64 at = out + n + __popc(ends & ((1u << lane) - 1u));
      if (spans != nullptr && at < limit) {
        int* sp = spans + at * SPAN_FIELDS;
        sp[SPAN_K_START] = (int)kv_bounds[s0];
        sp[SPAN_K_END] = (int)kv_bounds[c + 1];
        sp[SPAN_R_START] = q0;
        sp[SPAN_R_END] = q1;
      }
    }
    n += __popc(ends);
    const u32 last_sel = __ballot_sync(0xffffffffu, s) >> 31;
    carry = last_sel ? (starts ? base + 31 - __clz(starts) : carry) : -1;
  }
  return n;
}

// Rows spans[from .. to) as spans of no query rows (the first key block, rows [q0, q0)): what
// a span walk writes where it found fewer spans than the first pass counted.
__device__ __forceinline__ void write_empty_spans(i64 from, i64 to, int q0,
                                                 const i64* __restrict__ kv_bounds, int* spans,
                                                 int lane) {
  for (i64 i = from + lane; i < to; i += 32) {
    int* sp = spans + i * SPAN_FIELDS;
    sp[SPAN_K_START] = (int)kv_bounds[0];
    sp[SPAN_K_END] = (int)kv_bounds[1];
    sp[SPAN_R_START] = q0;
    sp[SPAN_R_END] = q0;
  }
}

// Writes the key spans of dense row `row` (one warp) at spans[out ... out + count), with
// [q0, q1) as their row restriction; `count` is what the first pass (plan_row_stats) counted.
// Should the row read otherwise now -- its memory written while it is planned -- spans past
// `count` are dropped and missing ones are spans of no rows: the queue stays within the bounds
// its counts gave, whatever the rows hold.
__device__ __forceinline__ void write_row_spans(const unsigned char* row, int n_kv,
                                                const i64* __restrict__ kv_bounds, i64 out,
                                                int count, int q0, int q1, int* spans,
                                                int lane) {
  const RowWalk w{row, nullptr, n_kv};
  i64 unused = 0;
  const int found = walk_spans([&](int c) { return w.sel(c); }, n_kv, kv_bounds, 1, out,
                               out + count, q0, q1, spans, lane, unused);
  write_empty_spans(out + found, out + count, q0, kv_bounds, spans, lane);
}

// Writes the nspans[r] key spans of every row with span_dst[r] >= 0 (the first row of each
// group) at span_dst[r], with the group's query range as their row restriction.
extern "C" __global__ void plan_write_spans(const unsigned char* __restrict__ dense, int n_rows,
                                            int n_kv, const i64* __restrict__ kv_bounds,
                                            const i64* __restrict__ span_dst,
                                            const int* __restrict__ nspans,
                                            const i64* __restrict__ row_q0,
                                            const i64* __restrict__ row_q1, int* spans) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= n_rows || span_dst[warp] < 0) return;
  write_row_spans(dense + (i64)warp * n_kv, n_kv, kv_bounds, span_dst[warp], nspans[warp],
                  (int)row_q0[warp], (int)row_q1[warp], spans, lane);
}

// ---- aligned tiles (mapping._aligned_tiles, Regime.align_tiles) ---------------------------------
// Key blocks where blocks a..b of a tile's query blocks (rows `rows`, n_blocks of them) form one
// maximal stretch of consecutive blocks selecting the key block: the tile's pieces restricted to
// those blocks' rows.
struct PieceSel {
  const unsigned char* rows;
  int n_kv, n_blocks, a, b;
  __device__ __forceinline__ bool operator()(int c) const {
    if (c < 0 || c >= n_kv) return false;
    for (int r = a; r <= b; ++r)
      if (!rows[(i64)r * n_kv + c]) return false;
    return !(a > 0 && rows[(i64)(a - 1) * n_kv + c]) &&
           !(b + 1 < n_blocks && rows[(i64)(b + 1) * n_kv + c]);
  }
};

// One warp per aligned tile v = (mask batch*head) * per_bh + t, its rows [t * tile_rows,
// min(+tile_rows, lq)) meeting query blocks tile_lo[t] .. tile_hi[t]. Without span_off: its
// spans and BN-chunks into nspans[v] / chunks[v], and identical[v] = 0 (every tile is a run of
// its own for plan_scan). With span_off: its spans from span_off[v] on, ordered by the
// stretch's first block, then its last, then key -- mapping._aligned_tiles' order -- the
// nspans[v] the count wrote, as write_row_spans keeps a row's.
extern "C" __global__ void plan_aligned_spans(
    const unsigned char* __restrict__ dense, int n_tiles, int per_bh, int n_q, int n_kv,
    const i64* __restrict__ kv_bounds, const i64* __restrict__ q_bounds,
    const int* __restrict__ tile_lo, const int* __restrict__ tile_hi, int tile_rows, int lq,
    int block_n, int* nspans, int* chunks, unsigned char* identical,
    const i64* __restrict__ span_off, int* spans) {
  const int v = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (v >= n_tiles) return;
  const int bh = v / per_bh, t = v % per_bh, lo = tile_lo[t], hi = tile_hi[t];
  const int t0 = t * tile_rows, t1 = min(t0 + tile_rows, lq);
  const unsigned char* rows = dense + ((i64)bh * n_q + lo) * n_kv;
  const bool write = span_off != nullptr;
  const i64 first = write ? span_off[v] : 0, limit = write ? first + nspans[v] : 0;
  i64 out = first, chk = 0;
  for (int a = 0; a <= hi - lo; ++a)
    for (int b = a; b <= hi - lo; ++b) {
      const int r0 = max((int)q_bounds[lo + a], t0), r1 = min((int)q_bounds[lo + b + 1], t1);
      out += walk_spans(PieceSel{rows, n_kv, hi - lo + 1, a, b}, n_kv, kv_bounds, block_n, out,
                        limit, r0, r1, write ? spans : nullptr, lane, chk);
    }
  if (write) write_empty_spans(min(out, limit), limit, t0, kv_bounds, spans, lane);
  chk = warp_sum(chk);
  if (!write && lane == 0) {
    nspans[v] = (int)out;
    chunks[v] = (int)chk;
    identical[v] = 0;
  }
}

// ---- the one-sync planner (tessera/runtime/device_planner.py) -----------------------------------
// Block-wide exclusive scans of N values per thread at once (blockDim.x = SCAN_THREADS):
// x[i] becomes the sum of the threads below this one's x[i], total[i] the sum of all. Every
// thread of the block must call it. N values share the three barriers one scan costs (the
// scan kernel is a single CTA, bound by such latencies).
constexpr int SCAN_THREADS = 1024;
// Sort keys plan_scan keeps in shared memory (32 KB); larger tables use the global scratch.
constexpr int SCAN_SMEM_KEYS = 4096;
template <int N>
__device__ __forceinline__ void block_exclusive_scans(i64 (&x)[N], i64 (&total)[N]) {
  __shared__ i64 warp_incl[N][SCAN_THREADS / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  i64 incl[N];
#pragma unroll
  for (int i = 0; i < N; ++i) incl[i] = x[i];
#pragma unroll
  for (int o = 1; o < 32; o <<= 1)
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const i64 y = __shfl_up_sync(0xffffffffu, incl[i], o);
      if (lane >= o) incl[i] += y;
    }
  if (lane == 31)
#pragma unroll
    for (int i = 0; i < N; ++i) warp_incl[i][warp] = incl[i];
  __syncthreads();
  if (warp < N) {  // warp i scans the warps' sums of value i
    i64 v = warp_incl[warp][lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const i64 y = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += y;
    }
    warp_incl[warp][lane] = v;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const i64 before = warp ? warp_incl[i][warp - 1] : 0;
    total[i] = warp_incl[i][SCAN_THREADS / 32 - 1];
    x[i] = before + incl[i] - x[i];
  }
  __syncthreads();  // warp_incl is reused by the next call
}

// One value's block-wide exclusive scan (block_exclusive_scans).
__device__ __forceinline__ i64 block_exclusive_scan(i64 x, i64& total) {
  i64 v[1] = {x}, t[1];
  block_exclusive_scans<1>(v, t);
  total = t[0];
  return v[0];
}

// Whether a task of `chunks` key chunks is heavy (tasks.launch_keys): more than the task chunks
// in all over heavy_slots (1/HEAVY_SHARE of a task slot's share), or than heavy_mean times the
// mean task.
__device__ __forceinline__ bool heavy_task(i64 chunks, i64 n_tasks, i64 task_chunks,
                                           i64 heavy_slots, i64 heavy_mean) {
  return chunks * heavy_slots > task_chunks || chunks * n_tasks > heavy_mean * task_chunks;
}

// A task's place in plan_scan's key table (tasks.launch_keys' order): rank-major, costs of
// `chunks` descending within a rank; `width` is 1 + the largest cost. plan_write_runs finds a
// light task's keys by the same formula.
__device__ __forceinline__ i64 order_key(i64 rank, i64 chunks, i64 width) {
  return rank * width + (width - 1 - chunks);
}

// plan_scan's pass 5 for one warp: places the lanes' runs (`u`, -1 for none) of `key` and
// `weight` in run order -- lane order here, after every run the warp placed before.
__device__ __forceinline__ void place_runs(i64 u, i64 key, i64 weight, bool heavy, i64* h,
                                           const i64* key_start, i64* run_task_off, int lane) {
  const u32 peers = __match_any_sync(0xffffffffu, (unsigned long long)(u < 0 ? -1 : key));
  const int last = 31 - __clz(peers);  // the key's last lane of these 32
  i64 before = 0;  // weights of the lanes of this key below this one
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const i64 w = __shfl_sync(0xffffffffu, weight, j);
    if (j < lane && ((peers >> j) & 1u)) before += w;
  }
  i64 first = 0;
  if (u >= 0 && lane == last) {
    first = h[key];
    h[key] = first + before + weight;
  }
  first = __shfl_sync(0xffffffffu, first, last);
  if (u >= 0) run_task_off[u] = first + before - (heavy ? 0 : key_start[key]);
  __syncwarp();  // the next 32 may advance the same keys
}

// One CTA of SCAN_THREADS. Pass 1: runs of identical consecutive rows (run_row0/1: first and
// last row of each). Pass 2, per run: its key spans, its tiles (query tokens / tile_rows), its
// tasks (tiles x the (batch, head) pairs reading its mask head), the exclusive scans of spans
// and tiles, and the totals: totals = [runs, spans, tiles, tasks, task chunks (tasks x their
// chunks), most chunks of a tile]. Passes 3-5: where each run's tasks go in launch order, so
// plan_write_runs writes them sorted and no sort follows.
//
// Launch order (tasks.launch_keys): heavy tasks (heavy_task) longest first, then the others
// one (batch, head) assignment at a time, longest first within it; ties in the run-major task
// list's order (run, tile, assignment). All tasks of a run cost the run's chunks, so this is a
// stable counting sort by (rank, cost): rank 0 for a heavy run's tasks, 1 + assignment a0 + e
// for the tiles its e-th assignment reads otherwise (a0 = assign_off of its mask head,
// n_assign assignments in all). The key table (width = 1 + the largest cost entries per rank,
// in hist: at least n_keys x (1 + n_assign)) counts tasks per key and its scan gives each
// key's first position, copied to key_start for plan_write_runs (order_key). Runs of one key
// then take their places in run order (pass 5): run_task_off[u] is a heavy run's first
// position, or a light run's offset within its keys -- the same for every assignment of its
// mask head, whose groups hold the same runs. A light key belongs to one mask head (its rank
// is one of that head's assignments), so each mask head's light runs are placed by one warp,
// walking them in order 32 at a time, with no other warp touching its keys; the heavy runs
// (rank 0, any mask head), listed in run order by pass 3, are placed by one warp the same way.
// Scratch: bh_run0 [mask heads + 1], each mask head's first run (pass 1: a mask head's first
// row always starts a run) and the number of runs; heavy_runs [runs], the heavy runs' list.
// (Launch bounds with one CTA an SM: without it ptxas budgets sm_90a for two, 32 registers a
// thread, and spills.)
extern "C" __global__ void __launch_bounds__(SCAN_THREADS, 1)
plan_scan(const unsigned char* __restrict__ identical, const int* __restrict__ nspans,
          const int* __restrict__ chunks, int n_rows, int n_q, const i64* __restrict__ q_bounds,
          int tile_rows, const int* __restrict__ expansions, const int* __restrict__ assign_off,
          int n_assign, i64 heavy_slots, i64 heavy_mean, i64* hist, i64* key_start, i64* run_row0,
          i64* run_row1, i64* run_span_off, i64* run_tile_off, i64* run_task_off,
          i64* bh_run0, i64* heavy_runs, i64* totals) {
  __shared__ int max_chunks;
  // The key table in shared memory where it fits (random masks of the models' shapes): pass
  // 5's walks read and write it once per 32 runs, in a chain of dependent steps.
  __shared__ i64 s_hist[SCAN_SMEM_KEYS];
  if (threadIdx.x == 0) max_chunks = 0;
  i64 runs = 0, total;
  for (int base = 0; base < n_rows; base += SCAN_THREADS) {
    const int r = base + threadIdx.x;
    const bool first = r < n_rows && !identical[r];
    const bool last = r < n_rows && (r + 1 == n_rows || !identical[r + 1]);
    const i64 before = runs + block_exclusive_scan(first, total);
    if (first) {
      run_row0[before] = r;
      if (r % n_q == 0) bh_run0[r / n_q] = before;
    }
    if (last) run_row1[before + first - 1] = r;
    runs += total;
  }
  if (threadIdx.x == 0) bh_run0[n_rows / n_q] = runs;
  __syncthreads();  // run_row0/1 are read by other threads below
  i64 span_base = 0, tile_base = 0, task_base = 0, task_chunks = 0;
  for (int base = 0; base < runs; base += SCAN_THREADS) {
    const i64 u = base + threadIdx.x;
    i64 sp = 0, tl = 0, tk = 0, ch = 0;
    if (u < runs) {
      const i64 r0 = run_row0[u], r1 = run_row1[u];
      const i64 q0 = q_bounds[r0 % n_q], q1 = q_bounds[r1 % n_q + 1];
      sp = nspans[r0];
      ch = chunks[r0];
      tl = (q1 - q0 + tile_rows - 1) / tile_rows;
      tk = tl * expansions[r0 / n_q];
      atomicMax(&max_chunks, (int)ch);
      run_task_off[u] = tl;  // its tiles: the sort's weight below, replaced by its place there
    }
    i64 x[4] = {sp, tl, tk, tk * ch}, sums[4];
    block_exclusive_scans<4>(x, sums);
    if (u < runs) {
      run_span_off[u] = span_base + x[0];
      run_tile_off[u] = tile_base + x[1];
    }
    span_base += sums[0];
    tile_base += sums[1];
    task_base += sums[2];
    task_chunks += sums[3];
  }
  __syncthreads();  // max_chunks is final (and every thread has the same task_chunks)
  const i64 width = (i64)max_chunks + 1, n_hist = width * (1 + n_assign);
  i64* h = n_hist <= SCAN_SMEM_KEYS ? s_hist : hist;
  // A run's key in the table (for a light run: its first assignment's), and its weight there.
  struct Sort {
    i64 key, weight;
    bool heavy;
  };
  const auto sort_of = [&](i64 u) -> Sort {
    const i64 r0 = run_row0[u], ch = chunks[r0], tl = run_task_off[u];
    const int bh = (int)(r0 / n_q);
    const bool heavy = heavy_task(ch, task_base, task_chunks, heavy_slots, heavy_mean);
    const i64 rank = heavy ? 0 : 1 + assign_off[bh];
    return {order_key(rank, ch, width), heavy ? tl * expansions[bh] : tl, heavy};
  };
  for (i64 c = threadIdx.x; c < n_hist; c += SCAN_THREADS) h[c] = 0;
  __syncthreads();
  // Pass 3: tasks per key (a light run's tiles under each of its assignments' ranks), and the
  // list of heavy runs in run order.
  i64 n_heavy = 0;
  for (int base = 0; base < runs; base += SCAN_THREADS) {
    const i64 u = base + threadIdx.x;
    const bool real = u < runs;
    const Sort so = real ? sort_of(u) : Sort{-1, 0, false};
    if (real) {
      const int copies = so.heavy ? 1 : expansions[run_row0[u] / n_q];
      for (int e = 0; e < copies; ++e)
        atomicAdd(reinterpret_cast<unsigned long long*>(h + so.key + e * width),
                  (unsigned long long)so.weight);
    }
    const i64 at = n_heavy + block_exclusive_scan(real && so.heavy, total);
    if (real && so.heavy) heavy_runs[at] = u;
    n_heavy += total;
  }
  __syncthreads();  // the table is complete
  // Pass 4: first position of each key (exclusive scan of the table, in place and to
  // key_start).
  i64 key_base = 0;
  for (i64 base = 0; base < n_hist; base += SCAN_THREADS) {
    const i64 c = base + threadIdx.x;
    const i64 n = c < n_hist ? h[c] : 0;
    const i64 before = block_exclusive_scan(n, total);
    if (c < n_hist) h[c] = key_start[c] = key_base + before;
    key_base += total;
  }
  __syncthreads();
  // Pass 5: runs take their places in run order (see the kernel's comment): a warp walks a
  // mask head's light runs, or the heavy runs' list, 32 at a time; the lanes of one key find the
  // weights of those below them (__match_any_sync, a shuffle per lane), the key's last lane
  // advances its next position, and each lane's place follows. (The whole block taking each
  // group of SCAN_THREADS runs in 32 warp turns, a block barrier each, costs ~50 of the
  // kernel's 71 us on CogVideoX's 6,672 rows: docs/decisions.md.)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_bh = n_rows / n_q;
  for (int bh = warp; bh < n_bh; bh += SCAN_THREADS / 32) {
    // (A mask head no (batch, head) pair reads has no tasks: its runs' places are never read,
    // and its rank is the next head's, whose keys it must not advance.)
    if (expansions[bh] == 0) continue;
    const i64 end = bh_run0[bh + 1];
    for (i64 c = bh_run0[bh]; c < end; c += 32) {
      const i64 u = c + lane;
      const Sort so = u < end ? sort_of(u) : Sort{-1, 0, true};
      place_runs(so.heavy ? -1 : u, so.key, so.weight, false, h, key_start, run_task_off, lane);
    }
  }
  if (warp == SCAN_THREADS / 32 - 1) {  // rank 0's keys: no mask head's warp touches them
    for (i64 c = 0; c < n_heavy; c += 32) {
      const i64 u = c + lane < n_heavy ? heavy_runs[c + lane] : -1;
      const Sort so = u >= 0 ? sort_of(u) : Sort{-1, 0, true};
      place_runs(u, so.key, so.weight, true, h, key_start, run_task_off, lane);
    }
  }
  if (threadIdx.x == 0) {
    totals[TOTAL_RUNS] = runs;
    totals[TOTAL_SPANS] = span_base;
    totals[TOTAL_TILES] = tile_base;
    totals[TOTAL_TASKS] = task_base;
    totals[TOTAL_TASK_CHUNKS] = task_chunks;
    totals[TOTAL_MAX_CHUNKS] = max_chunks;
  }
}

// One warp per run: its spans (from its first row; none with a null `dense`), its tiles (int32
// [T, 6]: mask_bh, q0, q1, span_begin, span_end, chunks) and, unless `tasks` is null, its tasks
// (the task-queue layout, slot -1) in launch order, where plan_scan placed them (its
// run_task_off, key_start and the same heavy_slots and heavy_mean). The number of runs is
// plan_scan's totals[TOTAL_RUNS], so the grid may be sized for the most runs the mask can have (the
// sync-free plan) and surplus warps return.
extern "C" __global__ void plan_write_runs(
    const unsigned char* __restrict__ dense, int n_kv, int n_q,
    const i64* __restrict__ kv_bounds, const i64* __restrict__ q_bounds, int tile_rows,
    const i64* __restrict__ totals, const i64* __restrict__ run_row0, const i64* __restrict__ run_row1,
    const i64* __restrict__ run_span_off, const i64* __restrict__ run_tile_off,
    const i64* __restrict__ run_task_off, const int* __restrict__ nspans,
    const int* __restrict__ chunks, const int* __restrict__ expansions,
    const int* __restrict__ assign_off, const int* __restrict__ assign_b,
    const int* __restrict__ assign_h0, i64 heavy_slots, i64 heavy_mean,
    const i64* __restrict__ key_start,
    int* spans, int* tiles, int* tasks) {
  const int u = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (u >= totals[TOTAL_RUNS]) return;
  const i64 r0 = run_row0[u], r1 = run_row1[u];
  const int bh = (int)(r0 / n_q);
  const int q0 = (int)q_bounds[r0 % n_q], q1 = (int)q_bounds[r1 % n_q + 1];
  const int span_begin = (int)run_span_off[u], span_end = span_begin + nspans[r0];
  const int ch = chunks[r0], e_count = expansions[bh], a0 = assign_off[bh];
  if (dense != nullptr)  // (aligned tiles: plan_aligned_spans wrote them)
    write_row_spans(dense + r0 * n_kv, n_kv, kv_bounds, span_begin, nspans[r0], q0, q1, spans,
                    lane);
  const int n_tiles = (q1 - q0 + tile_rows - 1) / tile_rows;
  const i64 tile0 = run_tile_off[u], task0 = run_task_off[u];
  for (int i = lane; i < n_tiles; i += 32) {
    int* t = tiles + (tile0 + i) * TILE_FIELDS;
    t[TILE_MASK_BH] = bh;
    t[TILE_Q_START] = q0 + i * tile_rows;
    t[TILE_Q_END] = min(q0 + (i + 1) * tile_rows, q1);
    t[TILE_SPAN_BEGIN] = span_begin;
    t[TILE_SPAN_END] = span_end;
    t[TILE_CHUNKS] = ch;
  }
  if (tasks == nullptr) return;  // tasks are split on the host path (device_planner.py)
  // Where task (tile i, assignment e) goes (plan_scan): a heavy run's tasks from task0 on,
  // tile-major; a light run's tiles at the same offset task0 within each assignment's keys.
  const bool heavy = heavy_task(ch, totals[TOTAL_TASKS], totals[TOTAL_TASK_CHUNKS], heavy_slots,
                                  heavy_mean);
  const i64 width = totals[TOTAL_MAX_CHUNKS] + 1;
  for (int k = lane; k < n_tiles * e_count; k += 32) {
    const int i = k / e_count, e = k % e_count;
    const i64 at = heavy ? task0 + k : key_start[order_key(1 + a0 + e, ch, width)] + task0 + i;
    int* t = tasks + at * TASK_FIELDS;
    t[TASK_BATCH] = assign_b[a0 + e];
    t[TASK_Q_HEAD0] = assign_h0[a0 + e];
    t[TASK_Q_START] = q0 + i * tile_rows;
    t[TASK_Q_END] = min(q0 + (i + 1) * tile_rows, q1);
    t[TASK_SPAN_BEGIN] = span_begin;
    t[TASK_SPAN_END] = span_end;
    t[TASK_SLOT] = -1;
    t[TASK_COST] = ch;
  }
}

// The regime table's mask measures in one launch: the (query token, key token) pairs the mask
// selects in total and in its heaviest row (a row: one (batch, head, query block) of the dense
// block matrix), accumulated into out[0] (sum) and out[1] (max), which the caller zeroes.
extern "C" __global__ void mask_pairs(const unsigned char* __restrict__ dense, int n_rows,
                                      int n_kv, int n_q, const i64* __restrict__ q_bounds,
                                      const i64* __restrict__ kv_bounds,
                                      unsigned long long* out) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= n_rows) return;
  const unsigned char* row = dense + (i64)warp * n_kv;
  i64 keys = 0;
  for (int c = lane; c < n_kv; c += 32)
    if (row[c]) keys += kv_bounds[c + 1] - kv_bounds[c];
  keys = warp_sum(keys);
  if (lane == 0 && keys) {
    const int i = warp % n_q;
    const unsigned long long pairs = (unsigned long long)(keys * (q_bounds[i + 1] - q_bounds[i]));
    atomicAdd(out, pairs);
    atomicMax(out + 1, pairs);
  }
}

// The pair estimate of regime.align_pays (mapping.tiling_pairs) in one launch, accumulated into
// out[0] (plain tiling) and out[1] (aligned tiling), which the caller zeroes. Warps 0 ..
// n_rows-1 take the mask rows: a block's selected key tokens times its rows rounded up to whole
// tiles. Warps n_rows .. n_rows + n_bh * per_bh - 1 take the aligned tiles of each mask (batch,
// head): the key tokens of the union of the rows of blocks lo[t] .. hi[t] times the tile's rows.
extern "C" __global__ void tiling_pairs(const unsigned char* __restrict__ dense, int n_rows,
                                        int n_kv, int n_q, int per_bh,
                                        const i64* __restrict__ q_bounds,
                                        const i64* __restrict__ kv_bounds,
                                        const int* __restrict__ lo, const int* __restrict__ hi,
                                        int tile_rows, unsigned long long* out) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  const int n_tiles = n_rows / n_q * per_bh;
  if (warp >= n_rows + n_tiles) return;
  const bool plain = warp < n_rows;
  int first, last;  // the dense rows whose union this warp counts
  i64 rows;         // query tokens the tiling computes them for
  if (plain) {
    first = last = warp;
    const i64 size = q_bounds[warp % n_q + 1] - q_bounds[warp % n_q];
    rows = (size + tile_rows - 1) / tile_rows * tile_rows;
  } else {
    const int a = warp - n_rows, bh = a / per_bh, t = a % per_bh;
    first = bh * n_q + lo[t];
    last = bh * n_q + hi[t];
    const i64 t0 = (i64)t * tile_rows;
    rows = min(t0 + tile_rows, q_bounds[n_q]) - t0;
  }
  i64 keys = 0;
  for (int c = lane; c < n_kv; c += 32) {
    bool any = false;
    for (int r = first; r <= last && !any; ++r) any = dense[(i64)r * n_kv + c] != 0;
    if (any) keys += kv_bounds[c + 1] - kv_bounds[c];
  }
  keys = warp_sum(keys);
  if (lane == 0 && keys) atomicAdd(out + (plain ? 0 : 1), (unsigned long long)(keys * rows));
}
