// Shared pieces of every Tessera kernel family: the task-queue contract, 16-bit number handling
// without CUDA headers (NVRTC needs none of the toolkit's include files this way), and the
// warp-level matrix and copy primitives of sm_80 and newer, as inline PTX.
//
// The task-queue layout is defined in tessera/runtime/tasks.py; the constants below mirror it.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

// -inf without <math.h> (NVRTC compiles these sources with no toolkit headers).
#define NEG_INF __int_as_float(0xff800000u)

// ---- task queue (tessera/runtime/tasks.py) ---------------------------------------------------
#define TASK_BATCH 0
#define TASK_Q_HEAD0 1
#define TASK_Q_START 2
#define TASK_Q_END 3
#define TASK_SPAN_BEGIN 4
#define TASK_SPAN_END 5
#define TASK_SLOT 6
#define TASK_FIELDS 8
#define SPAN_FIELDS 4
#define COMBINE_FIELDS 6

// ---- element types ------------------------------------------------------------------------------
// TESSERA_BF16 = 1 selects bfloat16 inputs/outputs, 0 selects float16. Values travel as raw
// 16-bit patterns; only the conversions below and the mma instruction care which one it is.
#ifndef TESSERA_BF16
#define TESSERA_BF16 1
#endif

__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
#if TESSERA_BF16
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

__device__ __forceinline__ float to_float(u16 x) {
#if TESSERA_BF16
  return __uint_as_float(((u32)x) << 16);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
#endif
}

// ---- memory ----------------------------------------------------------------------------------
__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// 16-byte asynchronous global->shared copy (L2 only: the tile is used once per CTA).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// ---- tensor cores: D = A(16x16) * B(16x8) + D, fp32 accumulate ------------------------------------
__device__ __forceinline__ void mma16816(float* d, const u32* a, u32 b0, u32 b1) {
#if TESSERA_BF16
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- strided [B, H, L, D] operand -------------------------------------------------------------
// Strides are in elements and 64-bit, so [B,H,L,D] and [B,L,H,D] views both pass without copies
// and offsets past 2^31 elements are safe. The last dimension is contiguous (checked in Python).
struct Operand {
  const u16* ptr;
  i64 sb, sh, sl;
  __device__ __forceinline__ const u16* row(int b, int h, int l) const {
    return ptr + b * sb + h * sh + l * sl;
  }
};

__device__ __forceinline__ float warp_quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float warp_quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
