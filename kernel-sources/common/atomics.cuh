// Integer atomics of global and shared memory in inline PTX.
#pragma once

#include "common/prelude.cuh"

namespace kiln {

// Returns the value before the add (the MoE kernel's routing counts and GEMM tile claims).
__device__ __forceinline__ int atomic_add_global(int* p, int v) {
  int old;
  asm volatile("atom.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// Adds `v` at a shared-window address, returning nothing (red): the MoE kernel's per-CTA routing counts.
__device__ __forceinline__ void atomic_add_shared(unsigned p, int v) {
  asm volatile("red.shared.add.s32 [%0], %1;" ::"r"(p), "r"(v) : "memory");
}

}  // namespace kiln
