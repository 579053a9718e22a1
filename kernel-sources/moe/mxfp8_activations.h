// W4A8's activations: MXFP8 (OCP MX, e4m3 elements), the one definition that kiln's host
// reference and every kernel share, bit for bit. Plain C, included verbatim by both.
//
// moe_apply with activation_dtype e4m3 quantizes each GEMM's activation operand -- a token's x row
// for the up projection, its bf16 act row for the down projection -- in blocks of 32 consecutive
// values along the reduction dimension, starting at 0:
//   s = the smallest integer with amax <= 448 * 2^s (amax: the block's largest magnitude; 448 is
//       e4m3's largest value), kept in [-126, 127], so no value saturates; the block's e8m0 scale
//       is s + 127;
//   q = x * 2^-s rounded to the nearest e4m3 value, ties to even (subnormals below 2^-6, in steps
//       of 2^-9);
//   the value used is q * 2^s.
// Every step is exact in f32 apart from the rounding to e4m3, which integer code does here, so
// the host reference and the kernels agree bit for bit (NVIDIA kernels may use the hardware's
// conversion, which rounds the same way). q * 2^s is also a bf16 value (e4m3 has 3 fraction
// bits), so kernels without fp8 MMAs may feed it to bf16 ones unchanged. Activations must be
// finite: a block holding an infinity or a NaN gives unspecified values. A block whose amax is
// below 2^-117 may lose values on GPUs that flush f32 subnormals.
#pragma once

#include "common/host_device.h"

typedef union {
  float f;
  unsigned u;
} KilnFloatBits;

KILN_HOST_DEVICE static inline unsigned kiln_float_bits(float f) {
  KilnFloatBits b;
  b.f = f;
  return b.u;
}
KILN_HOST_DEVICE static inline float kiln_bits_float(unsigned u) {
  KilnFloatBits b;
  b.u = u;
  return b.f;
}

// The block exponent s of a block whose largest magnitude is `amax` (>= 0).
KILN_HOST_DEVICE static inline int kiln_mxfp8_exponent(float amax) {
  const unsigned bits = kiln_float_bits(amax) & 0x7FFFFFFFu;
  const int field = (int)(bits >> 23);
  if (field == 0) return -126;  // zero or subnormal
  // amax = m 2^e with 1 <= m < 2, and 448 = 1.75 * 2^8: s = e - 8, or e - 7 where m > 1.75.
  int s = field - 127 - 8 + ((bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
  if (s < -126) s = -126;
  if (s > 127) s = 127;
  return s;
}

// 2^e as a float, for e in [-126, 127].
KILN_HOST_DEVICE static inline float kiln_pow2(int e) { return kiln_bits_float((unsigned)(e + 127) << 23); }

// v (|v| <= 448, or not finite) rounded to the nearest e4m3 value, ties to even.
KILN_HOST_DEVICE static inline float kiln_round_to_e4m3(float v) {
  const unsigned bits = kiln_float_bits(v), sign = bits & 0x80000000u, magnitude = bits & 0x7FFFFFFFu;
  const int field = (int)(magnitude >> 23);
  if (field == 0xFF) return v;
  if (field >= 127 - 6) {  // e4m3 normal range: keep 3 fraction bits
    const unsigned lsb = (magnitude >> 20) & 1u;
    return kiln_bits_float(sign | ((magnitude + 0x7FFFFu + lsb) & 0xFFF00000u));
  }
  if (field == 0) return kiln_bits_float(sign);  // below 2^-126: rounds to zero
  // Subnormal: a multiple of 2^-9, |v| 2^9 = M 2^(field - 150 + 9) with M the 24-bit significand.
  const unsigned significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const int shift = 150 - 9 - field;  // >= 21
  if (shift >= 32) return kiln_bits_float(sign);
  unsigned steps = significand >> shift;
  const unsigned rest = significand & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (steps & 1u))) ++steps;
  return kiln_bits_float(sign | kiln_float_bits((float)steps * (1.0f / 512.0f)));
}

// One value of a block with exponent s, as used: q * 2^s.
KILN_HOST_DEVICE static inline float kiln_mxfp8_value(float x, int s) { return kiln_round_to_e4m3(x * kiln_pow2(-s)) * kiln_pow2(s); }

// bf16 activations as two MXFP8 terms, for matrix units that take only 8-bit (or narrower)
// operands (gfx950's scaled MFMAs): x = 2^s (q + 2^-4 r), q = kiln_round_to_e4m3(x 2^-s) and
// r = kiln_mxfp8_residual(x, s, q). Exact for every bf16 x with |x| 2^-s >= 2^-6 -- all but the
// values below about 2^-15 of the block's largest -- since x - 2^s q is then a multiple of x's
// own bf16 step and at most 8 such steps; below, within 2^(s - 14), under 2^-21 of the block's
// largest magnitude (tests/test_number_formats.cpp checks both over every bf16 value).
KILN_HOST_DEVICE static inline float kiln_mxfp8_residual(float x, int s, float q) {
  return kiln_round_to_e4m3((x * kiln_pow2(-s) - q) * 16.0f);
}

// The e4m3 code (OCP E4M3FN: bias 7, no infinities) of a value kiln_round_to_e4m3 returned.
KILN_HOST_DEVICE static inline unsigned kiln_e4m3_code(float q) {
  const unsigned bits = kiln_float_bits(q), sign = (bits >> 24) & 0x80u, magnitude = bits & 0x7FFFFFFFu;
  const int field = (int)(magnitude >> 23);
  if (field == 0xFF) return sign | 0x7Fu;  // NaN (e4m3 has no infinity)
  if (field >= 127 - 6) return sign | ((unsigned)(field - 127 + 7) << 3) | ((magnitude >> 20) & 7u);
  return sign | (unsigned)(kiln_bits_float(magnitude) * 512.0f);  // subnormal: steps of 2^-9
}
