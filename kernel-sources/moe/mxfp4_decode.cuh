// MXFP4 (e2m1 values, e8m0 scales) to bf16 on NVIDIA GPUs, exactly, in a few integer operations
// and one bf16 multiply per pair: shared by the streaming phases (moe/apply_stream.cuh) and the
// grouped GEMMs' math threads (moe/apply_stream_gemm_sm90.cuh).
#pragma once

#include "common/prelude.cuh"
#include "moe/moe_common.cuh"

namespace kiln {

// An e8m0 scale as a pair of bf16, both 2^(bits - 127): exactly representable (2^-127 as a bf16
// subnormal), 0xFF NaN.
__device__ __forceinline__ u32 e8m0_to_bf16x2(u32 bits) {
  const u32 h = bits == 0xFFu ? 0x7FC0u : bits == 0u ? 0x0040u : bits << 7;
  return h | (h << 16);
}
// a * b for packed bf16 pairs (an fma with -0, which keeps the sign of zero products; sm_80+).
__device__ __forceinline__ u32 bf16x2_mul(u32 a, u32 b) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
  return r;
}

// Eight e2m1 values (a word, low nibble first) to four bf16 pairs, each value times 2^-126, exactly:
// pair i holds values i and i + 4, which sit 16 bits apart in the word, so one shift and two masks
// place both. An e2m1 value's three magnitude bits (e1 e0 m) land on the bf16's two lowest exponent
// bits and its first mantissa bit: 2^(e - 127) (1 + m/2) for e > 0, and the subnormal 2^-126 m/2 for
// e = 0, which is the e2m1 value 2^(e - 1) (1 + m/2), or m/2, times 2^-126.
__device__ __forceinline__ void e2m1x8_to_tiny_bf16x2(u32 w, u32 (&pairs)[4]) {
  constexpr u32 kMagnitudes = 0x01C001C0u, kSigns = 0x80008000u;
  pairs[0] = ((w << 6) & kMagnitudes) | ((w << 12) & kSigns);
  pairs[1] = ((w << 2) & kMagnitudes) | ((w << 8) & kSigns);
  pairs[2] = ((w >> 2) & kMagnitudes) | ((w << 4) & kSigns);
  pairs[3] = ((w >> 6) & kMagnitudes) | (w & kSigns);
}
// The same four pairs from a word in kiln's prepared order (moe/mxfp4_prepared.h), in 9
// instructions instead of 15: the layout puts every bit a pair needs (a value's mantissa and
// exponent at bf16 bits 6-8, its sign at 15; the pair's second value 16 bits up) where the word, or
// the word rotated right by 6 or by 12, holds it, and pair 1's bits where the word rotated by 2 or
// by 10 does. The rotations and masks are the layout's definition.
__device__ __forceinline__ void e2m1x8_prepared_to_tiny_bf16x2(u32 w, u32 (&pairs)[4]) {
  constexpr u32 kBits = 0x81C081C0u;
  pairs[0] = w & kBits;
  pairs[1] = (__funnelshift_r(w, w, 2) & 0x81808180u) | (__funnelshift_r(w, w, 10) & 0x00400040u);
  pairs[2] = __funnelshift_r(w, w, 6) & kBits;
  pairs[3] = __funnelshift_r(w, w, 12) & kBits;
}
// The factor that takes e2m1x8_to_tiny_bf16x2's values to value times the e8m0 scale `bits`:
// 2^(bits - 1) as a bf16 pair, a normal number for bits <= 128 (scales up to 2).
__device__ __forceinline__ u32 tiny_scale_bf16x2(u32 bits) { return bits * 0x00800080u + 0x3F003F00u; }

// The scale factor mxfp4_word_to_bf16x2 takes. kLargeScales: some lane of the warp has a scale
// above 2 (none in released checkpoints), so every lane takes e8m0_to_bf16x2 and a second multiply
// by 2^126; the callers branch for the whole warp.
template <bool kLargeScales>
__device__ __forceinline__ u32 mxfp4_scale_bf16x2(u32 bits) {
  return kLargeScales ? e8m0_to_bf16x2(bits) : tiny_scale_bf16x2(bits);
}
// A word of eight e2m1 values (standard or prepared, kFormat) times its scale, exactly, as four
// bf16 pairs: pair i holds values i and i + 4.
template <int kFormat, bool kLargeScales>
__device__ __forceinline__ void mxfp4_word_to_bf16x2(u32 word, u32 scale, u32 (&pairs)[4]) {
  if (kFormat == kWeightsMxfp4Prepared)
    e2m1x8_prepared_to_tiny_bf16x2(word, pairs);
  else
    e2m1x8_to_tiny_bf16x2(word, pairs);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (kLargeScales) pairs[i] = bf16x2_mul(pairs[i], 0x7E807E80u);  // 2^126
    pairs[i] = bf16x2_mul(pairs[i], scale);
  }
}

}  // namespace kiln
