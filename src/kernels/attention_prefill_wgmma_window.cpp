// attention.prefill.wgmma_window (kernel-sources/attention/prefill_wgmma_window.cuh, sm_90a): the
// head packing of mma_window on one warpgroup (4 heads x 16 positions for GPT-OSS), its 48-key
// blocks as wgmma chains, Q, K and V brought by TMA; outranks the mma.sync window kernel on sm_90a.
#include "kernels/prefill_kernel.hpp"

namespace kiln {

KILN_REGISTER_KERNEL(attention_prefill_wgmma_window) {
  return detail::prefill_kernel(detail::wgmma_window_kernel("attention.prefill.wgmma_window"));
}

}  // namespace kiln
