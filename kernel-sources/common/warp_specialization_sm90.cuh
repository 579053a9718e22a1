// Warp specialization on Hopper (sm_90a): moving registers between warpgroups (setmaxnreg) and
// the named barriers (bar.sync / bar.arrive) that order warpgroups without stopping the CTA.
#pragma once

#include "common/prelude.cuh"

namespace kiln {

// Every thread of a warpgroup runs these together. The CTA's registers are a pool of the kernel's
// count at entry times its threads (fixed by __launch_bounds__(threads, 1)); a warpgroup that asks
// for more than the others gave up waits for them forever, so the counts must add up.
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void warpgroup_registers_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// Hardware barrier `id` (1 to 15; 0 is __syncthreads) completes once `threads` threads reached
// it, whether they wait (sync) or go on (arrive).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace kiln
