// A grid-wide barrier for cooperative launches, and the L2 reads of what other CTAs wrote before
// it (sm_80 and newer, inline PTX).
#pragma once

#include "common/prelude.cuh"
#include "common/vector_memory.cuh"

namespace kiln {

// Workspace values written by other CTAs before the last barrier, read from L2 (not L1, which may
// hold an older copy of the line): weak loads, ordered by the barrier.
__device__ __forceinline__ int load_l2(const int* p) {
  int v;
  asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float load_l2(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void load_l2_4(const float* p, float* v) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(p) : "memory");
}
// 16 bytes (eight bf16) likewise, where load16's read-only path may serve stale lines.
__device__ __forceinline__ Bf16x8 load_l2_16(const void* p) {
  Bf16x8 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p) : "memory");
  return v;
}

// All CTAs of the (cooperative) grid arrive before any leaves. The counter is the barrier word the
// driver keeps for a cooperative launch (the one cooperative_groups' grid sync uses; %envreg1 and
// %envreg2 hold its workspace's address, the word 4 bytes in): CTA 0 adds 2^31 - (CTAs - 1) and
// every other CTA 1, so the top bit flips once all have arrived and the low bits are back at zero.
// Nothing needs clearing between barriers or launches, so a launch that routes locally needs no
// memset before it. In two halves, so that a CTA can issue work that needs no other CTA's writes
// (down's first weight copies) between its arrival and its wait: the arrival's fence then orders
// none of it. arrive returns thread 0's view of the word before its arrival, which wait takes.
__device__ __forceinline__ const unsigned* grid_barrier_word() {
  u32 address_hi, address_lo;
  asm volatile("mov.u32 %0, %%envreg1;" : "=r"(address_hi));
  asm volatile("mov.u32 %0, %%envreg2;" : "=r"(address_lo));
  return reinterpret_cast<const unsigned*>(((static_cast<unsigned long long>(address_hi) << 32) | address_lo) + 4);
}
__device__ __forceinline__ unsigned grid_barrier_arrive() {
  __syncthreads();
  unsigned before = 0u;
  if (threadIdx.x == 0) {
    const unsigned arrival = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;" : "=r"(before) : "l"(grid_barrier_word()), "r"(arrival) : "memory");
  }
  return before;
}
__device__ __forceinline__ void grid_barrier_wait(unsigned before) {
  if (threadIdx.x == 0) {
    const unsigned* word = grid_barrier_word();
    unsigned seen;
    do {
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(word) : "memory");
    } while (((before ^ seen) & 0x80000000u) == 0u);
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  }
  __syncthreads();
}
__device__ __forceinline__ void grid_barrier() { grid_barrier_wait(grid_barrier_arrive()); }

// Two bf16 in a word to floats.
__device__ __forceinline__ void bf16x2_to_float(u32 w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
// 4 bf16 of the workspace (see load_l2) to floats.
__device__ __forceinline__ void load_l2_bf16x4(const bf16* p, float* v) {
  unsigned w[2];
  asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p) : "memory");
  bf16x2_to_float(w[0], v[0], v[1]);
  bf16x2_to_float(w[1], v[2], v[3]);
}

}  // namespace kiln
