// The Hopper family's main loop: the consumer warpgroups' (or, in the plain variant, every
// warpgroup's) walk over a task's chunks -- S = Q K^T, the softmax, O += P V -- pipelined so the
// softmax of one chunk runs while the tensor cores multiply the previous chunk's P by its V.
#pragma once

#include "sm90/epilogue.cuh"
#include "sm90/loads.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/softmax.cuh"
#include "sm90/walks.cuh"

namespace {
// Whether warpgroup wg's rows of a task are all padding: its 64 rows lie within one head's
// tile_rows and start at or past the task's `q_len` tokens. Only the producer variant's
// consumers can sit a task out (the plain variant's copy and meet at CTA barriers).
__device__ __forceinline__ bool idle_rows(int wg, int tile_rows, int q_len) {
  if constexpr (!WS || WGS == 1) return false;
  const int first = 64 * wg % tile_rows;
  return first >= q_len && first + 64 <= tile_rows;
}

// One ring's consumer warpgroup (warpgroup wg of its task), or one warpgroup of the plain
// variant's CTA.
struct Consumer {
  const Args& a;
  const Ring& r;
  int ring, wg, twarp, tid;
  int j = 0;  // chunks computed, over all of this CTA's tasks: chunk j sits in stage j % STAGES

  // A warpgroup whose 64 rows are all padding (a tile of one head shorter than 64 x wg rows:
  // the tail of a variable-size query block) computes nothing: it only keeps the issue turns
  // and releases the stages, so the others run alone on the tensor cores.
  template <typename Walk_>
  __device__ __forceinline__ void sit_out(Walk_& walk, int se, int qb) {
    for (; walk.more(se); ++j) {
      if constexpr (STAGED_SPANS) {  // (the chunk's word says whether another follows)
        mbar_wait(r.full_bar + 8 * (j % STAGES), (j / STAGES) & 1);
        walk.read(r.chunk_info + 16 * (j % STAGES));
      }
      wait_issue_turn(wg);
      pass_issue_turn(wg);
      mbar_arrive(r.empty_bar + 8 * (j % STAGES));  // (the turn came after chunk j landed)
      walk.next(a.spans, se);
    }
    mbar_arrive(r.q_empty_bar + 8 * qb);
  }

  // The 8-bit form's rows' Q steps times the scale (log2 units), for the thread's rows t0 and
  // t0 + 8 (padding rows, at or past the task's end, read the first row: never stored).
  __device__ __forceinline__ void row_steps(const Task& task, int t0, float (&qsl)[2]) const {
    const int h = task.h0 + twarp * 16 / a.tile_rows;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int tok = t0 + 8 * i < task.q_end ? t0 + 8 * i : task.q_start;
      // (the int8 q is contiguous [B, Hq, Lq, D]: its row index is the step's)
      const i64 row = (task.b * a.q.sb + h * a.q.sh + tok * a.q.sl) / D;
      qsl[i] = a.q_step[row] * a.scale_log2;
    }
  }

  // The 8-bit form's P V of a chunk (u8 P from pa, V^T from the stage at `vt`) into pv, from
  // zero (O takes it scaled, fold_pv: each chunk's P is against its own maxima), committed.
  template <int W>
  __device__ __forceinline__ void pv_int8(int (&pv)[D / 8][4], const u32 (&pa)[W / PK][4],
                                          u32 vt) {
    const SmemDesc vd = v8_desc(vt);
#pragma unroll
    for (int kk = 0; kk < W / PK; ++kk) Wgmma8<D>::rs(&pv[0][0], pa[kk], vd.at(32 * kk), kk > 0);
    wgmma_commit();
  }

  // The 8-bit forms' products of one step: S = Q K^T (s8) into si, then the previous chunk's
  // P V from the stage at `vt`: INT8_PV's (pv_int8), else the 16-bit form's into O.
  template <int W>
  __device__ __forceinline__ void issue_int8(int (&si)[W / 8][4], int (&pv)[D / 8][4],
                                             float (&o)[D / 8][4], const u32 (&pa)[W / PK][4],
                                             const SmemDesc& q_desc, u32 ks, u32 vt) {
    if constexpr (INT8_PV) wgmma_hold<D / 2>(&pv[0][0]);
    else wgmma_hold<D / 2>(&o[0][0]);
    wgmma_fence();
    const SmemDesc k_desc = k_major_desc(ks);
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk)
      Wgmma8<W>::ss(&si[0][0], q_desc.at(k_major_step<BM>(kk)),
                    k_desc.at(k_major_step<KV_ROWS>(kk)), kk > 0);
    wgmma_commit();
    if constexpr (INT8_PV) {
      pv_int8<W>(pv, pa, vt);
    } else {
      const SmemDesc vd = v_desc(vt);
#pragma unroll
      for (int kk = 0; kk < W / PK; ++kk) Wgmma<D>::rs(&o[0][0], pa[kk], vd.at(v_step(kk)), 1);
      wgmma_commit();
    }
  }

  // The 8-bit form's last P V of a task, waited for.
  template <int W>
  __device__ __forceinline__ void last_pv_int8(int (&pv)[D / 8][4], const u32 (&pa)[W / PK][4],
                                               u32 vt) {
    wgmma_hold<D / 2>(&pv[0][0]);
    wgmma_fence();
    pv_int8<W>(pv, pa, vt);
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&pv[0][0]);
  }

  // The task's loop, for its step width W and its walk (WHOLE: whole-span): one instantiation
  // per width and walk.
  //
  // Software pipeline, per warpgroup: iteration j issues S_j = Q K_j^T and then O += P_{j-1}
  // V_{j-1}, waits for S_j only, starts the softmax of chunk j while the tensor cores still
  // work on P V (some of its exponentials too where order_wait_after keeps them there), then
  // waits for that, turns S_j into P_j -- before O's rescale, a branch, so that ptxas
  // interleaves the conversions with the exponentials it issues after the wait -- and
  // rescales O. The stage being refilled in iteration j (with chunk j + PREFETCH) held chunk
  // j-2, which every warpgroup finished with before the barrier. The matrix operations are
  // issued unconditionally (a row tile with no part in a chunk gets P = 0): ptxas serializes
  // wgmma issued on paths it cannot prove uniform across the warpgroup. A task's first chunk
  // has no previous P: it issues P V with P = 0 over its own V (landed), which adds nothing to
  // O -- but 0 x Inf where that V holds an Inf: rows a restricted first chunk excludes are set
  // back to zero after it (the rows it applies to select that value). Issuing that P V only
  // from the second chunk on made ptxas close every iteration with an empty wgmma group (a
  // dummy HGMMA after the merge), so the wait for S_j also waited for P_{j-1} V_{j-1} and the
  // softmax never overlapped it.
  template <int W, bool WHOLE>
  __device__ __forceinline__ void run_task(const Task& task, int qb, const SmemDesc& q_desc,
                                           bool idle, int tok_base, float (&o)[D / 8][4],
                                           float (&m)[2], float (&l)[2]) {
    const int* spans = a.spans;
    const int q_start = task.q_start, q_end = task.q_end, se = task.span_end;
    WalkOf<W> load_walk;  // (the plain variant's: with a producer the consumers copy nothing)
    if constexpr (!WS) load_walk.open(spans, task.span_begin, se);
    TaskWalkOf<WHOLE, W> walk;
    if constexpr (!WS && !PACKED) walk = load_walk;  // the same walk: no second read
    else walk.open(spans, task.span_begin, se);
    if (idle) {
      sit_out(walk, se, qb);
      return;
    }
    if constexpr (!WS) {
      // Prologue: the Q tile and chunks 0 .. PREFETCH-1, one commit group per chunk (Q rides
      // with the first); every iteration then commits one chunk (PREFETCH ahead), so "all but
      // the newest PREFETCH-1 groups have landed" means the current chunk has.
      load_q<NT>(r.q_base, task, a.q, a.tile_rows, tid);
#pragma unroll
      for (int st = 0; st < PREFETCH; ++st) {
        if (load_walk.more(se)) {
          load_kv(r.stage_base + (u32)(st * STAGE_BYTES), task.k_head, a.k_sl, task.v_head,
                  a.v_sl, load_walk, spans, se, tid);
          load_walk.next(spans, se);
        }
        cp_async_commit();
      }
    }

    // P of the previous chunk (A fragments): bf16/fp16 pairs, or the 8-bit form's u8 quads
    u32 pa[W / PK][4];
#pragma unroll
    for (int kk = 0; kk < W / PK; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
    float s[W / 8][4];
    // The 8-bit form: S's and the previous chunk's P V int32 products, that P V's factors
    // (softmax_chunk8), the thread's rows' Q steps times the scale.
    int si[W / 8][4], pv[D / 8][4];
    float f_prev[2] = {0.f, 0.f}, qsl[2];
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
    if constexpr (INT8) row_steps(task, t0, qsl);
    for (; walk.more(se); ++j, ++jt) {
      if constexpr (WS) {
        mbar_wait(r.full_bar + 8 * (j % STAGES), (j / STAGES) & 1);
        fence_async_smem();
      } else {
        cp_async_wait<PREFETCH - 1>();
        fence_async_smem();
        __syncthreads();
        if (load_walk.more(se)) {
          load_kv(r.stage_base + (u32)(((j + PREFETCH) % STAGES) * STAGE_BYTES), task.k_head,
                  a.k_sl, task.v_head, a.v_sl, load_walk, spans, se, tid);
          load_walk.next(spans, se);
        }
        cp_async_commit();
      }

      const u32 ks = r.stage_base + (u32)((j % STAGES) * STAGE_BYTES);
      // The chunk's word (STAGED_SPANS) is read and a partial chunk's V tail zeroed once this
      // iteration's products are issued -- they read K_j and V_{j-1} only, so the issue never
      // waits for the chunk's fields -- but before the turn passes, which orders the other
      // warpgroups' products after the zeros. A task's first chunk does both first: its P V
      // (P = 0) reads its own V.
      const bool prepare_first = PREPARE_FIRST || jt == 0;
      const auto prepare = [&] {
        if constexpr (STAGED_SPANS) walk.read(r.chunk_info + 16 * (j % STAGES));
        zero_v_tail<W>(ks + K_BYTES, walk.key_end() - walk.key0(), wg, ring);
      };
      if (prepare_first) prepare();
      if (guard_prev) kept.keep(o);

      wait_issue_turn(wg);
      if constexpr (INT8) {
        issue_int8<W>(si, pv, o, pa, q_desc, ks, jt > 0 ? vs_prev : ks + K_BYTES);
      } else {
        wgmma_hold<D / 2>(&o[0][0]);
        wgmma_fence();
        const SmemDesc k_desc = k_major_desc(ks), vd = v_desc(jt > 0 ? vs_prev : ks + K_BYTES);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          Wgmma<W>::ss(&s[0][0], q_desc.at(k_major_step<BM>(kk)),
                       k_desc.at(k_major_step<KV_ROWS>(kk)), kk > 0);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) Wgmma<D>::rs(&o[0][0], pa[kk], vd.at(v_step(kk)), 1);
        wgmma_commit();
      }
      if (!prepare_first) prepare();
      pass_issue_turn(wg);
      // Rows this span applies to, clipped to the tile's real rows.
      const int lo = max(walk.row_lo(spans), q_start);
      const int hi = min(walk.row_hi(spans), q_end);
      const int valid = walk.key_end() - walk.key0();
      // (checked while the tensor cores work; `lo`, `hi` are uniform, so is the branch)
      int guard = 0;
      if (GUARD && (lo > q_start || hi < q_end) &&
          stage_v_non_finite<W>(ks + K_BYTES, valid, GUARD_BAR + ring * WGS + wg))
        guard = excluded_rows(t0, lo, hi);

      wgmma_wait<overlap_pv<W>() ? 1 : 0>();
      if constexpr (INT8) wgmma_hold<W / 2>(&si[0][0]);
      else wgmma_hold<W / 2>(&s[0][0]);
      // Mask: keys past the span end, rows outside the span's restriction or the tile. A warp
      // with no row in the chunk runs it too, every score masked (P = 0, m and l unchanged):
      // a branch around the softmax had every iteration zero S's registers in advance (32
      // CS2R at head dim 64), for warps that are rare (padding rows, restricted spans).
      float al[2], f[2];
      if constexpr (INT8) {
        int8_scores(si, s, r.k_steps + (u32)((j % STAGES) * K_STEP_BYTES), qsl, quad);
        if constexpr (INT8_PV)
          softmax_chunk8(s, m, l, al, f, walk.chunk_start(), walk.key0(), walk.key_end(),
                         t0 >= lo && t0 < hi, t0 + 8 >= lo && t0 + 8 < hi, quad);
        else  // (scores in log2 units already)
          softmax_chunk(s, m, l, al, walk.key0(), walk.key_end(), t0 >= lo && t0 < hi,
                        t0 + 8 >= lo && t0 + 8 < hi, quad, 1.f);
      } else {
        softmax_chunk(s, m, l, al, walk.key0(), walk.key_end(), t0 >= lo && t0 < hi,
                      t0 + 8 >= lo && t0 + 8 < hi, quad, a.scale_log2);
      }
      // (The 8-bit form anchors the wait too: without it ptxas issues every exponential after
      // it, with it all of them before -- its scores' conversion already fills the time before.)
      if constexpr ((PV_WAIT_ANCHOR || INT8) && overlap_pv<W>())
        order_wait_after(r.q_base, (s[0][0] + s[0][2]) * a.scale_log2);
      wgmma_wait<0>();
      wgmma_hold<D / 2>(&o[0][0]);
      wgmma_hold<W / 2>(&s[0][0]);  // P is rewritten only after the P V that read it is done
      if constexpr (INT8_PV) {
        wgmma_hold<D / 2>(&pv[0][0]);
        fold_pv(o, pv, f_prev);  // (P_{j-1} V_{j-1}, against the max before this chunk's)
        f_prev[0] = f[0];
        f_prev[1] = f[1];
#pragma unroll
        for (int kk = 0; kk < W / PK; ++kk) p8_fragment(pa[kk], s, kk);
      } else {
#pragma unroll
        for (int kk = 0; kk < W / PK; ++kk) p_fragment(pa[kk], s, kk);
      }
      if (WS && jt > 0) mbar_arrive(r.empty_bar + 8 * ((j - 1) % STAGES));  // j-1 is done
      if (guard_prev) kept.restore(o, guard_prev);
      if (jt == 0 && guard) kept.restore_zeros(o, guard);  // (the first chunk's P V: see above)
      guard_prev = guard;
      rescale_o(o, al);
      vs_prev = ks + K_BYTES;
      walk.next(spans, se);
    }
    // Every S of this task has been waited for: the producer may reuse its Q buffer.
    if constexpr (WS) mbar_arrive(r.q_empty_bar + 8 * qb);
    if (jt > 0) {  // the last chunk's P V (uniform: every thread walked the same spans)
      if (guard_prev) kept.keep(o);
      if constexpr (INT8_PV) {
        last_pv_int8<W>(pv, pa, vs_prev);
        fold_pv(o, pv, f_prev);
      } else {
        wgmma_hold<D / 2>(&o[0][0]);
        wgmma_fence();
        const SmemDesc vd = v_desc(vs_prev);
#pragma unroll
        for (int kk = 0; kk < W / 16; ++kk) Wgmma<D>::rs(&o[0][0], pa[kk], vd.at(v_step(kk)), 1);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_hold<D / 2>(&o[0][0]);
      }
      if (guard_prev) kept.restore(o, guard_prev);
      if (WS) mbar_arrive(r.empty_bar + 8 * ((j - 1) % STAGES));  // the task's last chunk is done
    }
  }

  // Every task the scheduler hands this warpgroup (the plain variant: its CTA's one task), each
  // ending in the epilogue.
  __device__ __forceinline__ void run() {
    for (int n = 0;; ++n) {
      int ti = blockIdx.x;
      bool wide = false;  // the task's step: WIDE_BN keys, else BN (the producer's choice)
      bool whole = WHOLE_TASKS;  // a whole-span task (the plan's promise or the producer's choice)
      const int qb = n % Q_BUFS;
      if constexpr (WS) {
        mbar_wait(r.q_full_bar + 8 * qb, (n / Q_BUFS) & 1);  // the task's index, and its Q
        const TaskWord word(r, n);
        ti = word.index;
        wide = word.wide;
        whole = word.whole;
        if (ti >= a.num_tasks()) break;
      } else if (n > 0) {
        break;
      }
      const SmemDesc q_desc = k_major_desc(r.q_base + (u32)(qb * Q_BYTES + wg * 64 * SW));
      const Task task = a.task(ti);
      // This warp's 16 rows are one head and 16 consecutive tokens (tile_rows is a multiple of
      // 16). (Padding rows of the tile, tok_base >= q_end, fall outside every span's clipped
      // restriction, so the softmax needs no separate flag for them.)
      const int tok_base = task.q_start + twarp * 16 % a.tile_rows;

      float o[D / 8][4];
#pragma unroll
      for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
      float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
      const bool idle = idle_rows(wg, a.tile_rows, task.q_end - task.q_start);

      // (one loop where neither choice is set, or where every task is whole-span: whole is
      // constant)
      constexpr bool WHOLE_LOOP = WHOLE_SPANS || WHOLE_TASKS;
      if (wide) {  // (KV_ROWS is BN without the wide step)
        if (whole) run_task<KV_ROWS, WHOLE_LOOP>(task, qb, q_desc, idle, tok_base, o, m, l);
        else run_task<KV_ROWS, false>(task, qb, q_desc, idle, tok_base, o, m, l);
      } else {
        if (whole) run_task<BN, WHOLE_LOOP>(task, qb, q_desc, idle, tok_base, o, m, l);
        else run_task<BN, false>(task, qb, q_desc, idle, tok_base, o, m, l);
      }
      if constexpr (!WS) cp_async_wait<0>();
      if constexpr (INT8_PV) scale_by_v_steps(a, task, o);
      store_task(a, task, o, m, l);
    }
  }
};

// The consumer warpgroups' part of the kernel: the registers the producer gave up, the first
// issue turn, their task loop, and the turn the last warpgroup passed.
__device__ __forceinline__ void consume(const Args& a, const Ring& r, int ring, int wg,
                                        int twarp, int tid) {
  if constexpr (WS) {
    regs_increase<CONSUMER_REGS>();
    if (WGS > 1 && wg == WGS - 1) named_bar_arrive(1, 256);  // warpgroup 0 issues first
  }
  Consumer c{a, r, ring, wg, twarp, tid};
  c.run();
  if constexpr (WS) {
    if (WGS > 1 && wg == 0) named_bar_sync(1, 256);  // the turn the last warpgroup passed
  }
}
}  // namespace
