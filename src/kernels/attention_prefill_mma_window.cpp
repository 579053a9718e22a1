// attention.prefill.mma_window: prefill_mma.cuh packing up to 4 query heads of a KV head and few
// positions into 4 warps, so a CTA's key band is the window plus 16 positions (GPT-OSS: 144 keys,
// three 48-key blocks). It wins every windowed signature on NVIDIA GPUs before Hopper, since the
// signature does not carry the window's width; a window of thousands of keys would run faster on
// the general kernels.
#include "kernels/prefill_kernel.hpp"

namespace kiln {

KILN_REGISTER_KERNEL(attention_prefill_mma_window) {
  detail::PrefillKernel k = detail::mma_sync_kernel("attention.prefill.mma_window", Priority::kSpecialized);
  k.windows_only = k.packs_heads = true;
  k.key_rows = 48;
  k.stages = 3;
  k.key_rows_d256 = 0;  // head_dim 256 (Gemma's windows of thousands of keys): the general kernel
  return detail::prefill_kernel(k);
}

}  // namespace kiln
