// Asynchronous copies from global to shared memory (cp.async, sm_80 and newer): zero-filling,
// with L2 prefetch and cache-policy variants, and their commit groups.
#pragma once

#include "common/prelude.cuh"
#include "common/shared_address.cuh"

namespace kiln {

// 4 bytes (4-byte aligned) from global to shared memory (a shared-window address), or 4 zero bytes
// when `valid` is false; with `policy`, under an L2 cache policy (createpolicy).
__device__ __forceinline__ void copy4_async_or_zero(unsigned smem, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem), "l"(global), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void copy4_async_or_zero(unsigned smem, const void* global, bool valid, unsigned long long policy) {
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;" ::"r"(smem), "l"(global), "r"(valid ? 4 : 0), "l"(policy)
               : "memory");
}
// 8 bytes (8-byte aligned), the same way.
__device__ __forceinline__ void copy8_async_or_zero(unsigned smem, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(smem), "l"(global), "r"(valid ? 8 : 0) : "memory");
}
// 16 bytes from global to shared memory, or 16 zero bytes when `valid` is false. The overloads
// taking an unsigned take a shared-window address (shared_address), which a loop can keep instead
// of converting a generic pointer on every call.
__device__ __forceinline__ void copy16_async_or_zero(unsigned smem, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(global), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copy16_async_or_zero(void* smem, const void* global, bool valid) {
  copy16_async_or_zero(shared_address(smem), global, valid);
}
// The same, asking L2 to fetch the whole aligned 256-byte block from DRAM as one request: the
// decode kernels read 128- and 256-byte K and V rows 16 bytes per lane (on an H200 2% faster at
// B64 ctx4096 head_dim 64, neutral elsewhere; an L2 evict-first policy added nothing).
__device__ __forceinline__ void copy16_async_or_zero_l2_256(unsigned smem, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(smem), "l"(global), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copy16_async_or_zero_l2_256(void* smem, const void* global, bool valid) {
  copy16_async_or_zero_l2_256(shared_address(smem), global, valid);
}
// copy16_async_or_zero and copy16_async_or_zero_l2_256 under an L2 cache policy (createpolicy).
__device__ __forceinline__ void copy16_async_or_zero(unsigned smem, const void* global, bool valid, unsigned long long policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(smem), "l"(global), "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void copy16_async_or_zero_l2_256(unsigned smem, const void* global, bool valid, unsigned long long policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;" ::"r"(smem), "l"(global), "r"(valid ? 16 : 0),
               "l"(policy)
               : "memory");
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `kPending` of this thread's most recent commit groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Arrives on the shared-memory mbarrier at `barrier` (a shared-window address) once this thread's
// copies so far have landed, counting as one of the arrivals the barrier was initialized with.
__device__ __forceinline__ void copies_arrive_on(unsigned barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(barrier) : "memory");
}

}  // namespace kiln
