// kiln's portability prelude for run-time-compiled kernels. Self-contained: no toolkit headers,
// so a deployment needs only the run-time compiler and the driver. Number formats are stored as
// raw bits and converted explicitly, which keeps the conversions visible and identical across
// compilers.
#pragma once

namespace kiln {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

// Storage types: distinct structs so templates can tell bf16 from f16.
struct bf16 { u16 bits; };
struct f16 { u16 bits; };
struct e4m3 { u8 bits; };

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(static_cast<u32>(v.bits) << 16); }
__device__ __forceinline__ float to_float(f16 v) {
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(v.bits));
  return out;
}
__device__ __forceinline__ float to_float(float v) { return v; }

// OCP FP8 E4M3 (bias 7, no infinities, S.1111.111 is NaN), decoded in software so it runs on
// every architecture.
__device__ __forceinline__ float to_float(e4m3 v) {
  const u32 sign = (v.bits >> 7) & 1u, exponent = (v.bits >> 3) & 0xFu, mantissa = v.bits & 7u;
  float magnitude;
  if (exponent == 0xFu && mantissa == 7u) {
    magnitude = quiet_nan();
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0.001953125f;  // m/8 * 2^-6
  } else {
    magnitude = __uint_as_float(((exponent + 120u) << 23) | (mantissa << 20));  // rebias 7 -> 127
  }
  return sign ? -magnitude : magnitude;
}

// OCP MX E2M1 (one nibble): values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
__device__ __forceinline__ float e2m1_to_float(u32 nibble) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = magnitudes[nibble & 7u];
  return (nibble & 8u) ? -m : m;
}

// OCP MX E8M0 scale: 2^(bits - 127); 0xFF is NaN.
__device__ __forceinline__ float e8m0_to_float(u8 bits) {
  if (bits == 0xFFu) return quiet_nan();
  if (bits == 0) return __uint_as_float(0x00400000u);  // 2^-127, a float32 subnormal
  return __uint_as_float(static_cast<u32>(bits) << 23);
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) {
  bf16 out;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out.bits) : "f"(v));
  return out;
}
template <> __device__ __forceinline__ f16 from_float<f16>(float v) {
  f16 out;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out.bits) : "f"(v));
  return out;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float softcap_score(float s, float softcap) {
  return softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
}

}  // namespace kiln
