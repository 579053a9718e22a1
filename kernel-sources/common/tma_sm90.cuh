// Hopper tensor-memory-accelerator copies (cp.async.bulk.tensor, sm_90+) and the shared-memory
// mbarriers that track them, in inline PTX. A tensor map (CUtensorMap, 128 bytes) describes a
// global tensor and the box one copy moves; kiln encodes maps on the host at launch into the
// parameter block (KernelSpec::tensor_maps), and a kernel passes the generic address of its
// __grid_constant__ parameter's map. Barrier arguments are shared-window addresses.
#pragma once

#include "common/prelude.cuh"

namespace kiln {

__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(barrier), "r"(arrivals) : "memory");
}
// Makes barriers just initialized visible to the async proxy (the TMA unit); a CTA barrier follows.
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(barrier) : "memory");
}
// Arrives and announces `bytes` of copies that complete on this barrier's current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes) : "memory");
}
// Returns once the phase of parity `parity` has completed (the barrier's current phase is the
// other parity). Waiting on a phase two completions old would not return: callers track phases.
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "retry:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra retry;\n"
      "}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

// The box at coordinates (innermost first) of `map` into shared memory at `destination`, its bytes
// completing on `barrier`. Elements past the tensor's extent arrive as zeros and count as bytes.
__device__ __forceinline__ void tma_load_2d(unsigned destination, const void* map, unsigned barrier, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(destination),
      "l"(map), "r"(barrier), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(unsigned destination, const void* map, unsigned barrier, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(destination),
      "l"(map), "r"(barrier), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const void* map) { asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory"); }

// Global memory written through the generic proxy (st.global) and later read by TMA copies: each
// writing thread fences after its writes, before the barrier that orders them with the copies.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace kiln
