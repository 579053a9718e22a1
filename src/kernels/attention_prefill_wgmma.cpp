// attention.prefill.wgmma_ws (kernel-sources/attention/prefill_wgmma_ws.cuh): the general Hopper
// prefill kernel on warpgroup MMAs (sm_90a only: wgmma exists on no other arch), warp-specialized:
// a TMA producer warpgroup feeding consumer warpgroups that overlap softmax with MMAs.
#include "kernels/prefill_kernel.hpp"

namespace kiln {

KILN_REGISTER_KERNEL(attention_prefill_wgmma_ws) { return detail::prefill_kernel(detail::wgmma_ws_kernel("attention.prefill.wgmma_ws")); }

}  // namespace kiln
