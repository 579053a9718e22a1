// The shared-window address of a generic pointer into shared memory, for inline PTX that takes
// one (cp.async, ldmatrix, ld/st.shared, mbarrier).
#pragma once

namespace kiln {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// `p` moved up to the next multiple of kAlign bytes of the shared window. Dynamic shared memory
// starts right after a kernel's static arrays, only 16-byte aligned; the launch gives kAlign bytes
// of slack.
template <unsigned kAlign>
__device__ __forceinline__ unsigned char* align_shared(unsigned char* p) {
  return p + ((kAlign - (shared_address(p) & (kAlign - 1))) & (kAlign - 1));
}

}  // namespace kiln
