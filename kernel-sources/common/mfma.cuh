// AMD matrix-core (MFMA) helpers shared by the AMD attention and MoE kernels: one 32x32 product in
// 16-bit inputs with f32 accumulation, for CDNA2/3 (32x32x8, gfx90a and gfx942) and CDNA4
// (32x32x16, gfx950), and the exchange between the two halves of a wavefront.
// 32x32 layouts (wave64): operand A[i][k] sits in lane i + 32 * (k / kK2) as item k % kK2 of its
// kK2 values (kK2 = half the k-width, kMfmaHalfK); B[k][j] in lane j + 32 * (k / kK2); accumulator
// D[i][j] in lane j + 32 * ((i / 4) % 2), register 4 * (i / 8) + i % 4.
#pragma once

#include "common/prelude.cuh"

namespace kiln {

#if defined(KILN_AMD)

typedef float mfma_f32x16 __attribute__((ext_vector_type(16)));
#if defined(__gfx950__)
enum { kMfmaK = 16 };  // CDNA4: v_mfma_f32_32x32x16_{bf16,f16}
typedef __bf16 mfma_bf16x8 __attribute__((ext_vector_type(8)));
typedef _Float16 mfma_f16x8 __attribute__((ext_vector_type(8)));
#else
enum { kMfmaK = 8 };  // CDNA2/3: v_mfma_f32_32x32x8{bf16_1k,f16}
typedef short mfma_i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 mfma_f16x4 __attribute__((ext_vector_type(4)));
#endif
enum { kMfmaHalfK = kMfmaK / 2 };  // operand values per lane

// One 32x32xkMfmaK product: `a` and `b` hold this lane's kMfmaHalfK 16-bit values (raw bits).
template <typename T>
__device__ __forceinline__ mfma_f32x16 mfma_32x32(const u16 (&a)[kMfmaHalfK], const u16 (&b)[kMfmaHalfK], mfma_f32x16 c) {
#if defined(__gfx950__)
  if constexpr (__is_same(T, bf16)) {
    mfma_bf16x8 va, vb;
#pragma unroll
    for (int i = 0; i < 8; ++i) va[i] = __builtin_bit_cast(__bf16, a[i]), vb[i] = __builtin_bit_cast(__bf16, b[i]);
    return __builtin_amdgcn_mfma_f32_32x32x16_bf16(va, vb, c, 0, 0, 0);
  } else {
    mfma_f16x8 va, vb;
#pragma unroll
    for (int i = 0; i < 8; ++i) va[i] = __builtin_bit_cast(_Float16, a[i]), vb[i] = __builtin_bit_cast(_Float16, b[i]);
    return __builtin_amdgcn_mfma_f32_32x32x16_f16(va, vb, c, 0, 0, 0);
  }
#else
  if constexpr (__is_same(T, bf16)) {
    mfma_i16x4 va, vb;
#pragma unroll
    for (int i = 0; i < 4; ++i) va[i] = static_cast<short>(a[i]), vb[i] = static_cast<short>(b[i]);
    return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(va, vb, c, 0, 0, 0);
  } else {
    mfma_f16x4 va, vb;
#pragma unroll
    for (int i = 0; i < 4; ++i) va[i] = __builtin_bit_cast(_Float16, a[i]), vb[i] = __builtin_bit_cast(_Float16, b[i]);
    return __builtin_amdgcn_mfma_f32_32x32x8f16(va, vb, c, 0, 0, 0);
  }
#endif
}

// One bf16 32x32xkMfmaK product from packed operands: `a` and `b` hold this lane's kMfmaHalfK
// values as kMfmaHalfK / 2 words, value 2i in the low half of word i (no unpacking).
__device__ __forceinline__ mfma_f32x16 mfma_32x32_bf16_words(const u32* a, const u32* b, mfma_f32x16 c) {
#if defined(__gfx950__)
  typedef u32 words4 __attribute__((ext_vector_type(4)));
  const words4 va = {a[0], a[1], a[2], a[3]}, vb = {b[0], b[1], b[2], b[3]};
  return __builtin_amdgcn_mfma_f32_32x32x16_bf16(__builtin_bit_cast(mfma_bf16x8, va), __builtin_bit_cast(mfma_bf16x8, vb), c, 0, 0, 0);
#else
  typedef u32 words2 __attribute__((ext_vector_type(2)));
  const words2 va = {a[0], a[1]}, vb = {b[0], b[1]};
  return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(mfma_i16x4, va), __builtin_bit_cast(mfma_i16x4, vb), c, 0, 0, 0);
#endif
}

// The value of lane `lane ^ 32`: the other half of the wavefront, same query.
__device__ __forceinline__ float other_half(float v) {
  const int lane = static_cast<int>(__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)));
  return __int_as_float(__builtin_amdgcn_ds_bpermute((lane ^ 32) << 2, __float_as_int(v)));
}

#endif  // KILN_AMD

}  // namespace kiln
