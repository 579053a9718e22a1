#include "tools/number_formats.hpp"

#include <cmath>
#include <cstring>

namespace kiln::tools {

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE binary16, round to nearest even, in software: not every host compiler has _Float16.
uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const int exponent = static_cast<int>((x >> 23) & 0xFFu);
  uint32_t mantissa = x & 0x7FFFFFu;
  if (exponent == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mantissa ? 0x200u : 0u));  // inf, NaN
  const int e = exponent - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow to infinity
  uint32_t half, rest, halfway;
  if (e <= 0) {  // subnormal result (or zero)
    if (e < -10) return sign;
    mantissa |= 0x800000u;
    const int shift = 14 - e;
    half = mantissa >> shift;
    rest = mantissa & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1);
  } else {
    half = (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
    rest = mantissa & 0x1FFFu;
    halfway = 0x1000u;
  }
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;  // a carry may round up to inf: correct
  return static_cast<uint16_t>(sign | half);
}
float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | (static_cast<uint32_t>(exponent - 15 + 127) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}
float e4m3_to_float(uint8_t v) {
  const int sign = v >> 7, exponent = (v >> 3) & 0xF, mantissa = v & 7;
  if (exponent == 0xF && mantissa == 7) return NAN;
  const float m = static_cast<float>(mantissa) / 8.0f;
  const float magnitude = exponent == 0 ? std::ldexp(m, -6) : std::ldexp(1.0f + m, exponent - 7);
  return sign ? -magnitude : magnitude;
}
uint8_t float_to_e4m3_saturated(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7F;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7E;
  // The nearest of the finite magnitudes by search, ties to the even code: an encoder written
  // independently of the kernels' bit arithmetic.
  uint8_t best = 0;
  for (uint8_t code = 1; code <= 0x7E; ++code) {
    const float error = std::fabs(e4m3_to_float(code) - a), best_error = std::fabs(e4m3_to_float(best) - a);
    if (error < best_error || (error == best_error && (code & 1) == 0)) best = code;
  }
  return sign | best;
}
float e2m1_to_float(uint8_t nibble) {
  static const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return (nibble & 8) ? -magnitudes[nibble & 7] : magnitudes[nibble & 7];
}
float e8m0_to_float(uint8_t v) { return v == 0xFF ? NAN : std::ldexp(1.0f, v - 127); }

}  // namespace kiln::tools
