// kiln's portability prelude for run-time-compiled kernels. Self-contained: no toolkit headers,
// so a deployment needs only the run-time compiler and the driver. Number formats are stored as
// raw bits and converted explicitly, which keeps the conversions visible and identical across
// compilers.
//
// One source, three compilers; the JIT defines which one reads it:
//   KILN_NVRTC      NVRTC (NVIDIA). CUDA's keywords and built-ins are predefined.
//   KILN_HIPRTC     hipRTC (AMD). HIP's keywords and built-ins are predefined.
//   KILN_HIP_CLANG  clang -x hip -nogpuinc (AMD, offline). Nothing is predefined: the keywords,
//                   threadIdx/blockIdx/blockDim/gridDim, __syncthreads and the math used by kiln's
//                   kernels are defined below from clang's AMDGPU built-ins.
// Warps: kiln's portable kernels are written for a warp of 32 lanes (kWarp). On AMD, where a
// wavefront has 64, such a warp is half a wavefront: shuffles stay inside their 32-lane half, and
// a block of 32 threads runs in a half-filled wavefront.
#pragma once

#if defined(KILN_HIPRTC) || defined(KILN_HIP_CLANG)
#define KILN_AMD 1
#endif

#if defined(KILN_HIP_CLANG)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(threads) __attribute__((amdgpu_flat_work_group_size(1, threads)))

namespace kiln::amd {
struct Dim3 {
  unsigned x, y, z;
};
__device__ __forceinline__ Dim3 thread_index() {
  return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), __builtin_amdgcn_workitem_id_z()};
}
__device__ __forceinline__ Dim3 block_index() {
  return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workgroup_id_z()};
}
__device__ __forceinline__ Dim3 block_size() {
  return {__builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(), __builtin_amdgcn_workgroup_size_z()};
}
// Blocks per grid: the dispatch packet counts work-items.
__device__ __forceinline__ Dim3 grid_blocks() {
  return {__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
          __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
          __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z()};
}
}  // namespace kiln::amd
#define threadIdx (::kiln::amd::thread_index())
#define blockIdx (::kiln::amd::block_index())
#define blockDim (::kiln::amd::block_size())
#define gridDim (::kiln::amd::grid_blocks())

// A workgroup barrier that also orders shared (LDS) and global memory, as __syncthreads does.
__device__ __forceinline__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
__device__ __forceinline__ float __int_as_float(int v) { return __builtin_bit_cast(float, v); }
__device__ __forceinline__ float __uint_as_float(unsigned v) { return __builtin_bit_cast(float, v); }
__device__ __forceinline__ int __float_as_int(float v) { return __builtin_bit_cast(int, v); }
__device__ __forceinline__ unsigned __float_as_uint(float v) { return __builtin_bit_cast(unsigned, v); }
__device__ __forceinline__ float expf(float v) { return __builtin_expf(v); }
__device__ __forceinline__ float __expf(float v) { return __builtin_expf(v); }
__device__ __forceinline__ float exp2f(float v) { return __builtin_exp2f(v); }
__device__ __forceinline__ float logf(float v) { return __builtin_logf(v); }
__device__ __forceinline__ float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
__device__ __forceinline__ float fminf(float a, float b) { return __builtin_fminf(a, b); }
__device__ __forceinline__ float tanhf(float v) {
  // tanh(v) = 1 - 2 / (exp(2v) + 1): exact at 0, saturates to +-1 without overflow trouble.
  return 1.0f - 2.0f / (__builtin_expf(2.0f * v) + 1.0f);
}
__device__ __forceinline__ int max(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ int min(int a, int b) { return a < b ? a : b; }
#endif  // KILN_HIP_CLANG

namespace kiln {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

// Storage types: distinct structs so templates can tell bf16 from f16.
struct bf16 {
  u16 bits;
};
struct f16 {
  u16 bits;
};
struct e4m3 {
  u8 bits;
};

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(static_cast<u32>(v.bits) << 16); }
__device__ __forceinline__ float to_float(f16 v) {
#if defined(KILN_AMD)
  return static_cast<float>(__builtin_bit_cast(_Float16, v.bits));
#else
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(v.bits));
  return out;
#endif
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

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  bf16 out;
#if defined(KILN_AMD) && __clang_major__ >= 19
  out.bits = __builtin_bit_cast(u16, static_cast<__bf16>(v));  // one instruction on gfx950
#elif defined(KILN_AMD)
  // Round to nearest even in software (hipRTC of ROCm 5 has no __bf16 conversion).
  const u32 bits = __float_as_uint(v);
  out.bits = (v != v) ? u16(0x7fc0) : static_cast<u16>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
#else
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out.bits) : "f"(v));
#endif
  return out;
}
template <>
__device__ __forceinline__ f16 from_float<f16>(float v) {
  f16 out;
#if defined(KILN_AMD)
  out.bits = __builtin_bit_cast(u16, static_cast<_Float16>(v));
#else
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out.bits) : "f"(v));
#endif
  return out;
}

// Lanes per warp in kiln's portable kernels (half an AMD wavefront; see the top of this file).
enum { kWarp = 32 };

// v from the lane whose index differs from this one's in the bits of `mask`, within a warp.
__device__ __forceinline__ float shuffle_xor(float v, int mask) {
#if defined(KILN_AMD)
  const int lane = static_cast<int>(__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)));
  return __int_as_float(__builtin_amdgcn_ds_bpermute((lane ^ mask) << 2, __float_as_int(v)));
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += shuffle_xor(v, offset);
  return v;
}

__device__ __forceinline__ float softcap_score(float s, float softcap) { return softcap > 0.0f ? softcap * tanhf(s / softcap) : s; }

}  // namespace kiln
