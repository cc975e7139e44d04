// The persistent scheduler of the producer variants: which task a ring runs next, and how the
// producer tells its consumers.
//
// CTA blockIdx.x's ring r starts with task blockIdx.x x RINGS + r and then takes the next
// untaken task of the queue from a global counter (RINGS x gridDim.x + the count), so tasks
// start longest first, in queue order, on whichever ring is free -- the hardware's own order for
// one-task CTAs, which keeps the K/V being read by concurrent tasks together in L2. The
// producer takes the next task as soon as it has issued the current one's copies, and the K/V
// stage ring runs on across tasks: the next task's first chunks load while the current one is
// computed. Its Q follows once the consumers have finished the current task's S, and goes to
// them with the task's index through shared memory; an index past the queue ends the CTA. The
// plain variant runs one task a CTA: task blockIdx.x.
#pragma once

#include "sm90/args.cuh"
#include "sm90/smem.cuh"
#include "sm90/sync.cuh"

namespace {
// Whether this CTA has no task at all (a grid sized by a bound: sync-free plan).
__device__ __forceinline__ bool cta_idle(const Args& a) {
  return (int)blockIdx.x * RINGS >= a.num_tasks();
}

// A ring's first task.
__device__ __forceinline__ int first_task(int ring) { return (int)blockIdx.x * RINGS + ring; }

// Task n's word, published with its Q (two words used alternately by successive tasks): its
// index and the producer's two choices for it, the wide step (WIDE_BN) and the whole-span walk.
__device__ __forceinline__ void publish_task(const Ring& r, int n, int ti, bool whole,
                                             bool wide) {
  r.task_slot[n & 1] = 4 * ti + 2 * (int)whole + (int)wide;
}
struct TaskWord {
  int index;
  bool wide, whole;
  __device__ __forceinline__ TaskWord(const Ring& r, int n) {
    const int word = r.task_slot[n & 1];
    index = word >> 2;
    wide = WIDE && (word & 1);
    whole = WHOLE_TASKS || (WHOLE_SPANS && (word & 2));
  }
};

// The producer's next task after task n, taken now so that its chunks load while task n is
// computed (one thread; the others read it after the producer's barrier). Every task run takes
// one ticket, so the launch takes num_tasks in all: the CTA holding the last one knows no other
// will touch the counter again and zeroes it for the next run (the host never resets it: a run
// is one launch, which a CUDA graph replays as is).
__device__ __forceinline__ void take_next_task(const Args& a, const Ring& r, int n) {
  const int ticket = atomicAdd(a.task_counter, 1);
  if (ticket == a.num_tasks() - 1) *a.task_counter = 0;
  r.next_slot[(n + 1) & 1] = ticket + (int)gridDim.x * RINGS;
}
}  // namespace
