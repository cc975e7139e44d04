// The producer warpgroup of the warp-specialized variants (PRODUCER): per task its Q (once the
// consumers are done with the previous task's), then every chunk c into stage c % STAGES once
// the consumers have released chunk c - STAGES. Its copies arrive on the Q / stage full
// barriers; with TMA one thread of a warp a ring issues them all.
#pragma once

#include "sm90/loads.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/walks.cuh"

namespace {
struct Producer {
  const Args& a;
  const Ring& r;
  int ring, ptid;
  int ti = 0;          // the task's index in the queue
  int c = 0;           // chunks loaded, over all of this ring's tasks
  int n = 0;           // the task's place in the ring's sequence
  bool wide = false;   // the task's step: WIDE_BN keys, else BN
  bool whole = false;  // a whole-span task (whole_span_task)
  int c0 = 0;          // the task's first chunk
  bool q_sent = false;

  // Task n's Q, into buffer n % Q_BUFS once the consumers are done with the task that used it
  // last (n - Q_BUFS), published with its index.
  __device__ __forceinline__ void hand_over_q(bool real) {
    const int qb = n % Q_BUFS;
    const u32 full = r.q_full_bar + 8 * qb;
    if (n >= Q_BUFS) mbar_wait(r.q_empty_bar + 8 * qb, (n / Q_BUFS - 1) & 1);
    if (ptid == 0) {
      publish_task(r, n, ti, whole, wide);
      mbar_arrive(full);  // releases the index to the consumers
    }
    if (!real) {
      // no Q to copy: the consumers find the end of the queue
      if (!TMA || ptid == 0) mbar_arrive(full);
      return;
    }
    const Task task = a.task(ti);
    const u32 qs = r.q_base + (u32)(qb * Q_BYTES);
    if constexpr (TMA) {
      if (ptid == 0) tma_load_q(qs, a.maps, task.q_start, task.h0, task.b, full);
    } else {
      load_q<LOADERS>(qs, task, a.q, a.tile_rows, ptid);
      mbar_arrive_on_copies(full);
    }
  }

  // The task's chunks at step width W. With one Q buffer its Q can only follow the previous
  // task's last S, so the chunks are issued first, up to the point where the producer would
  // wait for a stage holding one of this task's own chunks -- the consumers release those only
  // once they have this Q.
  template <int W>
  __device__ __forceinline__ void load_task(const Task& task) {
    WalkOf<W> w;
    for (w.open(a.spans, task.span_begin, task.span_end); w.si < task.span_end; ++c) {
      const int st = c % STAGES;
      if (!q_sent && c - STAGES >= c0) {
        hand_over_q(true);
        q_sent = true;
      }
      if (c >= STAGES) mbar_wait(r.empty_bar + 8 * st, (c / STAGES - 1) & 1);
      if constexpr (TMA) {
        if (ptid == 0) {
          if constexpr (STAGED_SPANS)
            stage_chunk_info(r.chunk_info + 16 * st, w.key0(), w.key_end(), w.row_lo(a.spans),
                             w.row_hi(a.spans), w.last(task.span_end));
          tma_load_kv<W>(r.stage_base + (u32)(st * STAGE_BYTES),
                         r.k_steps + (u32)(st * K_STEP_BYTES), a.maps, w.chunk_start(),
                         task.h0 / a.group, task.b, r.full_bar + 8 * st);
        }
      } else {
        load_kv(r.stage_base + (u32)(st * STAGE_BYTES), task.k_head, a.k_sl, task.v_head,
                a.v_sl, w, a.spans, task.span_end, ptid);
        mbar_arrive_on_copies(r.full_bar + 8 * st);
      }
      w.next(a.spans, task.span_end);
    }
  }

  // Every task of the ring, in the scheduler's order, until the queue ends.
  __device__ __forceinline__ void run() {
    ti = first_task(ring);
    for (n = 0;; ++n) {
      wide = false;
      whole = false;
      if (ti >= a.num_tasks()) {
        hand_over_q(false);
        break;
      }
      // Task n's chunks go into the stages as soon as the previous task's chunks leave them;
      // with two Q buffers the buffer is free (task n-2's) and Q goes first.
      const Task task = a.task(ti);
      // The step width the consumers will compute this task at (published with its index):
      // its chunks are copied at that width.
      wide = wide_task(a.spans, task.span_begin, task.span_end);
      whole = whole_span_task(a.spans, task);
      c0 = c;
      q_sent = false;
      if (Q_BUFS == 2) {
        hand_over_q(true);
        q_sent = true;
      }
      if (wide) load_task<KV_ROWS>(task);  // (KV_ROWS is BN without the wide step)
      else load_task<BN>(task);
      if (!q_sent) hand_over_q(true);
      if (ptid == 0) take_next_task(a, r, n);
      named_bar_sync(PRODUCER_BAR + ring, PRODUCER_THREADS);  // the producer's: index written
      ti = r.next_slot[(n + 1) & 1];
    }
    cp_async_wait<0>();
  }
};

// The producer warpgroup's part of the kernel: its registers given up to the consumers, the
// warps a ring kept (TMA), their task loop.
__device__ __forceinline__ void produce(const Args& a, const Ring& r, int ring, int pwarp,
                                        int tid) {
  regs_decrease<PRODUCER_REGS>();
  if (TMA && pwarp >= RINGS) return;  // a warp a ring
  Producer p{a, r, ring, tid - RINGS * CONSUMERS - (TMA ? 32 * ring : 0)};
  p.run();
}
}  // namespace
