// MUFU approximations without the range fix-ups of the library functions.
#pragma once

#include "common/prelude.cuh"

namespace kiln {

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

}  // namespace kiln
