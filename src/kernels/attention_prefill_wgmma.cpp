// attention.prefill.wgmma (kernel-sources/attention/prefill_wgmma.cuh): the general Hopper prefill
// kernel on warpgroup MMAs (sm_90a only: wgmma exists on no other arch).
#include "kernels/prefill_kernel.hpp"

namespace kiln {

KILN_REGISTER_KERNEL(attention_prefill_wgmma) {
  return detail::prefill_kernel({.name = "attention.prefill.wgmma",
                                 .source = "attention/prefill_wgmma.cuh",
                                 .entry = "prefill_wgmma",
                                 .priority = Priority::kPerformant,
                                 .min_arch = 90,
                                 .features = {"mma:wgmma", "memory:cp_async"},
                                 .block_rows_d64 = 192,
                                 .block_rows_d128 = 128,
                                 .key_rows = 128,
                                 .stages = 3,
                                 .alignment = 1024});
}

}  // namespace kiln
