// The shared-window address of a generic pointer into shared memory, for inline PTX that takes
// one (cp.async, ldmatrix, ld/st.shared, mbarrier).
#pragma once

namespace kiln {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

}  // namespace kiln
