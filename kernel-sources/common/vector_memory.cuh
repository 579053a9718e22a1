// 16-byte loads and stores of global and shared memory (sm_80 and newer, inline PTX), and the L2
// cache policies the streaming loads take.
#pragma once

#include "common/prelude.cuh"
#include "common/shared_address.cuh"

namespace kiln {

// Eight 16-bit values (four packed pairs, lowest first): one 16-byte load.
struct Bf16x8 {
  unsigned w[4];
};

__device__ __forceinline__ Bf16x8 load16(const void* p) {
  Bf16x8 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
  return v;
}
// 16 bytes to global memory in one store (a Bf16x8 is 4-byte aligned, so assigning one through a
// pointer is compiled as four 4-byte stores).
__device__ __forceinline__ void store16(void* p, const Bf16x8& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
}
// An L2 cache policy under which the lines a load or copy brings in are evicted first: for data
// read once per launch (the MoE weights), so that it does not push out what is read again (the
// kernel's own code, its workspace).
__device__ __forceinline__ unsigned long long l2_evict_first_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// 16 read-only bytes, or zeros when `valid` is false (the load is then not issued), asking L2 to
// fetch the whole aligned 256-byte block: for rows read 16 bytes per lane a few steps apart.
// `policy`: an L2 cache policy (createpolicy).
__device__ __forceinline__ Bf16x8 load16_l2_256(const void* p, bool valid, unsigned long long policy) {
  Bf16x8 v;
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@q ld.global.nc.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %6;\n\t}"
      : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
      : "l"(p), "r"(static_cast<int>(valid)), "l"(policy));
  return v;
}

__device__ __forceinline__ Bf16x8 load16_shared(unsigned p) {
  Bf16x8 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "r"(p));
  return v;
}
__device__ __forceinline__ Bf16x8 load16_shared(const void* p) { return load16_shared(shared_address(p)); }

__device__ __forceinline__ void store4_shared(unsigned p, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void store16_shared(unsigned p, const Bf16x8& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
}
__device__ __forceinline__ void store16_shared(void* p, const Bf16x8& v) { store16_shared(shared_address(p), v); }

}  // namespace kiln
