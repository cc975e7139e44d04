// Hopper block-sparse attention forward (sm_90a): warpgroup MMA (wgmma) with Q and K/V read by
// the tensor cores straight from swizzled shared memory, P kept in registers, a cp.async K/V
// pipeline, and the same online softmax, masking and epilogue as the portable family
// (common/). Same task queue and kernel arguments as the portable family (sm80/bsa.cu).
//
// A CTA runs one task at a time (the plain variant one task; the producer variant is persistent,
// taking tasks from a counter, scheduler.cuh; with rings, Config::RINGS, one task a ring):
// BM = 64 x WGS physical rows, warpgroup w owning rows 64w .. 64w+63 (warp i of the task's
// warpgroups owns rows 16i .. 16i+15, as in the portable family),
// walking the task's key spans BN keys at a time: S = Q K^T (wgmma, both operands K-major in
// shared memory), softmax on the S accumulators, O += P V (wgmma, P from registers, V N-major in
// shared memory). The softmax of one chunk starts while the tensor cores multiply the previous
// chunk's P by its V (how much of it runs beside that product: order_wait_after).
//
// Roles, one file each (the variant's parameters and what derives from them: traits.cuh):
//   loads.cuh      Q tiles and K/V chunks by cp.async or TMA
//   producer.cuh   the producer warpgroup's loop: Q hand-over, the stage ring
//   scheduler.cuh  the persistent task order and the task words producer and consumers share
//   mainloop.cuh   the consumers' pipelined QK^T / softmax / PV loop
//   softmax.cuh    the softmax's place against the P V wait, O's rescale (the step itself:
//                  common/softmax.cuh)
//   epilogue.cuh   the non-finite guard and the store of a task's rows
//   smem.cuh, sync.cuh, walks.cuh, wgmma.cuh   layout and descriptors, barriers, span walks,
//                  the wgmma instructions
#include "variant.cuh"
#include "sm90/mainloop.cuh"
#include "sm90/producer.cuh"

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
bsa_fwd_sm90(TESSERA_BSA_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const Args a{tasks, spans, Operand{q_ptr, q_sb, q_sh, q_sl}, k_ptr, k_sb, k_sh, k_sl,
               v_ptr, v_sb, v_sh, v_sl,
               Output{o_ptr, o_sb, o_sh, o_sl, lse_ptr, lse_sb, lse_sh, part_o, part_lse},
               tile_rows, group, scale_log2, max_tasks, task_count, task_counter, tma_maps,
               q_step, v_step};
  if (cta_idle(a)) return;
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
  const Ring r(smem_raw, ring);

  if constexpr (WS) {
    if (tid % (4 * 32 * WGS) == 0 && !producer) {  // the first thread of each ring's task
      for (int st = 0; st < STAGES; ++st) {
        mbar_init(r.full_bar + 8 * st, TMA ? 1 : LOADERS);  // TMA: one expecting arrive
        mbar_init(r.empty_bar + 8 * st, CONSUMERS);
      }
      for (int b = 0; b < Q_BUFS; ++b) {
        // + the arrive publishing the task index (TMA: that and the one expecting Q's bytes)
        mbar_init(r.q_full_bar + 8 * b, TMA ? 2 : LOADERS + 1);
        mbar_init(r.q_empty_bar + 8 * b, CONSUMERS);
      }
    }
    __syncthreads();
    if (producer) {
      produce(a, r, ring, pwarp, tid);
      return;
    }
  }
  consume(a, r, ring, wg, twarp, tid);
}
