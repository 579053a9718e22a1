// attention.prefill.mma: the portable tensor-core prefill kernel on mma.sync, ldmatrix and cp.async
// (kernel-sources/attention/prefill_mma.cuh), every NVIDIA GPU from sm_80 on.
#include "kernels/prefill_kernel.hpp"

namespace kiln {

KILN_REGISTER_KERNEL(attention_prefill_mma) {
  return detail::prefill_kernel(detail::mma_sync_kernel("attention.prefill.mma", Priority::kPortable));
}

}  // namespace kiln
