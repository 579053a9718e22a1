// Tensor-core and copy helpers for sm_80 and newer in inline PTX: mma.sync m16n8k16, ldmatrix,
// cp.async, 16-byte global and shared loads, MUFU approximations. Shared by the attention and
// MoE kernels.
#pragma once

#include "common/shared_address.cuh"
#include "common/prelude.cuh"

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
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
               "@q ld.global.nc.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %6;\n\t}"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p), "r"(static_cast<int>(valid)), "l"(policy));
  return v;
}

// 2^x with subnormal results flushed to zero: one MUFU.EX2 (exp2f adds a range fix-up around it).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 1 / x, subnormals flushed to zero: one MUFU.RCP (__fdividef adds a range test and two multiplies).
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void mma_16816<bf16>(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<f16>(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats to a packed pair (low half first) of the element type.
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi);
template <>
__device__ __forceinline__ unsigned pack2<bf16>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ unsigned pack2<f16>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 4 bytes (4-byte aligned) from global to shared memory (a shared-window address), or 4 zero bytes
// when `valid` is false; with `policy`, under an L2 cache policy (createpolicy).
__device__ __forceinline__ void copy4_async_or_zero(unsigned smem, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem), "l"(global), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void copy4_async_or_zero(unsigned smem, const void* global, bool valid, unsigned long long policy) {
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;" ::"r"(smem), "l"(global), "r"(valid ? 4 : 0), "l"(policy) : "memory");
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
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(smem), "l"(global), "r"(valid ? 16 : 0), "l"(policy) : "memory");
}
__device__ __forceinline__ void copy16_async_or_zero_l2_256(unsigned smem, const void* global, bool valid, unsigned long long policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;" ::"r"(smem), "l"(global), "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
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

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `kPending` of this thread's most recent commit groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory"); }

__device__ __forceinline__ Bf16x8 load16_shared(unsigned p) {
  Bf16x8 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "r"(p));
  return v;
}
__device__ __forceinline__ Bf16x8 load16_shared(const void* p) { return load16_shared(shared_address(p)); }

__device__ __forceinline__ void store4_shared(unsigned p, unsigned v) { asm volatile("st.shared.b32 [%0], %1;" ::"r"(p), "r"(v) : "memory"); }
__device__ __forceinline__ void store16_shared(void* p, const Bf16x8& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(shared_address(p)), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) { ldmatrix_x4_trans(r, shared_address(smem)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) { ldmatrix_x4(r, shared_address(smem)); }

}  // namespace kiln
