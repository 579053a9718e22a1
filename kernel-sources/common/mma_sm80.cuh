// Tensor-core helpers for sm_80 and newer in inline PTX: mma.sync m16n8k16, packing floats into
// its operands, ldmatrix.
#pragma once

#include "common/prelude.cuh"
#include "common/shared_address.cuh"
#include "common/vector_memory.cuh"

namespace kiln {

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

// Two e4m3 values (low byte first) to a packed f16 pair, exactly (sm_89 and newer).
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short pair) {
  unsigned r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(pair));
  return r;
}

// A packed pair of the 16-bit type T, each times `scale`, as a packed f16 pair.
template <typename T>
__device__ __forceinline__ unsigned scaled_pair_to_f16x2(unsigned pair, float scale) {
  const float lo = to_float(T{static_cast<u16>(pair & 0xffffu)}), hi = to_float(T{static_cast<u16>(pair >> 16)});
  return pack2<f16>(lo * scale, hi * scale);
}

template <typename A, typename B>
struct SameType {
  enum { value = 0 };
};
template <typename A>
struct SameType<A, A> {
  enum { value = 1 };
};

// Two e4m3 values (low byte first) as a packed pair of the 16-bit type T, exactly (sm_89 and newer):
// f16 holds every e4m3 value, and bf16 too, reached through f32.
template <typename T>
__device__ __forceinline__ unsigned e4m3x2_to_pair(unsigned short pair) {
  const unsigned h = e4m3x2_to_f16x2(pair);
  if (SameType<T, f16>::value) return h;
  return pack2<T>(to_float(f16{static_cast<u16>(h & 0xffffu)}), to_float(f16{static_cast<u16>(h >> 16)}));
}

// Eight e4m3 values (two words, low byte first) as four packed pairs of T, exactly.
template <typename T>
__device__ __forceinline__ Bf16x8 e4m3x8_to_pairs(unsigned lo, unsigned hi) {
  return Bf16x8{{e4m3x2_to_pair<T>(static_cast<unsigned short>(lo & 0xffffu)), e4m3x2_to_pair<T>(static_cast<unsigned short>(lo >> 16)),
                 e4m3x2_to_pair<T>(static_cast<unsigned short>(hi & 0xffffu)), e4m3x2_to_pair<T>(static_cast<unsigned short>(hi >> 16))}};
}

// The type the tensor cores multiply in: the cache's own 16-bit type, or f16 for an e4m3 cache
// (whose values f16 holds exactly; bf16 queries are converted).
template <typename T, typename Cache>
struct MmaType {
  typedef T type;
};
template <typename T>
struct MmaType<T, e4m3> {
  typedef f16 type;
};

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
