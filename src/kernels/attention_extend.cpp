// mha_extend_with_kvcache's kernels: the prefill kernels with paged K and V (kPaged: each copied
// key row finds its page), so extend and prefill share one mainloop. attention.extend.wgmma_ws and
// .wgmma_window on Hopper, attention.extend.mma and .mma_window (head packing for causal windows)
// on every NVIDIA GPU from sm_80 (their _fp8 forms read e4m3 caches, from sm_89),
// attention.extend.mfma on AMD (compile-verified only), and the reference.
#include <fmt/format.h>

#include "attention/params.h"
#include "kernels/portable_kernel.hpp"
#include "kernels/prefill_kernel.hpp"
#include "kernels/reference_kernel.hpp"
#include "kernels/signature_checks.hpp"
#include "kiln/registry.hpp"

namespace kiln {

using detail::PrefillInput;

KILN_REGISTER_KERNEL(attention_extend_reference) { return detail::prefill_reference_spec(true); }
KILN_REGISTER_KERNEL(attention_extend_reference_amd) { return detail::amd_registration(detail::prefill_reference_spec(true)); }

namespace {

detail::PrefillKernel extend_wgmma_ws(const char* name) {
  detail::PrefillKernel k = detail::wgmma_ws_kernel(name);
  k.input = PrefillInput::kPagedExtend;
  k.stages = 3;          // at head_dim 128 (PrefillWsShape)
  k.key_rows_d128 = 0;   // 128-key blocks, as at head_dim 64
  k.key_rows_d256 = 64;  // paged blocks are powers of two (PrefillWsShape)
  return k;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_extend_wgmma_ws) { return detail::prefill_kernel(extend_wgmma_ws("attention.extend.wgmma_ws")); }

// Over an e4m3 cache: the producer widens each block's rows to the queries' type through a staging
// area of two blocks (PrefillWsShape), at head_dim 64 and 128, without a soft cap.
KILN_REGISTER_KERNEL(attention_extend_wgmma_ws_fp8) {
  detail::PrefillKernel k = extend_wgmma_ws("attention.extend.wgmma_ws_fp8");
  k.e4m3_cache = true;
  k.stages = 2;  // at head_dim 128: the staging area takes the third stage's room
  k.staging_slots = 2;
  k.key_rows_d256 = 0;
  k.softcap = false;
  return detail::prefill_kernel(k);
}

// The window kernel over paged caches: 16-key boxes (8 for pages of 8), so blocks start on
// multiples of 16 keys; smaller pages stay with attention.extend.mma_window.
KILN_REGISTER_KERNEL(attention_extend_wgmma_window) {
  detail::PrefillKernel k = detail::wgmma_window_kernel("attention.extend.wgmma_window");
  k.input = PrefillInput::kPagedExtend;
  k.page_box_rows = 16;
  k.min_page_size = 8;
  k.key_align = 16;
  return detail::prefill_kernel(k);
}

namespace {

detail::PrefillKernel extend_mma(const char* name) {
  detail::PrefillKernel k = detail::mma_sync_kernel(name, Priority::kPortable);
  k.input = PrefillInput::kPagedExtend;
  return k;
}

detail::PrefillKernel extend_mma_window(const char* name) {
  detail::PrefillKernel k = detail::mma_sync_kernel(name, Priority::kSpecialized);
  k.windows_only = k.packs_heads = true;
  k.key_rows = 48;
  k.stages = 3;
  k.key_rows_d256 = 0;  // head_dim 256 (Gemma's windows of thousands of keys): the general kernel
  k.input = PrefillInput::kPagedExtend;
  return k;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_extend_mma) { return detail::prefill_kernel(extend_mma("attention.extend.mma")); }
KILN_REGISTER_KERNEL(attention_extend_mma_window) { return detail::prefill_kernel(extend_mma_window("attention.extend.mma_window")); }

// An e4m3 cache (chunked prefill over an fp8 KV cache): the mma.sync kernels convert each block's
// rows to f16 in shared memory.
KILN_REGISTER_KERNEL(attention_extend_mma_fp8) {
  return detail::prefill_kernel(detail::mma_sync_e4m3_kernel(extend_mma("attention.extend.mma"), "attention.extend.mma_fp8"));
}
KILN_REGISTER_KERNEL(attention_extend_mma_window_fp8) {
  return detail::prefill_kernel(
      detail::mma_sync_e4m3_kernel(extend_mma_window("attention.extend.mma_window"), "attention.extend.mma_window_fp8"));
}

// Decode with 2 to 16 new tokens per sequence (speculative verification): the paged mma kernel
// packing up to 4 query heads of a KV head over 16 positions, so a GQA group's tokens share their
// K and V tiles. (8 warps holding all 8 GPT-OSS heads of a KV head measured the same: 0.340 ms
// against 0.337 at B64 ctx4096 q_len 16, H100; bench/RESULTS.md.)
namespace {

detail::PrefillKernel decode_prefill_mma(const char* name) {
  detail::PrefillKernel k = detail::mma_sync_kernel(name, Priority::kPortable);
  k.entry = "decode_prefill_mma";
  k.packs_heads = true;
  k.input = PrefillInput::kPagedDecode;
  return k;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_decode_prefill_mma) { return detail::prefill_kernel(decode_prefill_mma("attention.decode.prefill_mma")); }
// With an e4m3 cache: more query rows than attention.decode.mma_split_fp8 takes.
KILN_REGISTER_KERNEL(attention_decode_prefill_mma_fp8) {
  return detail::prefill_kernel(
      detail::mma_sync_e4m3_kernel(decode_prefill_mma("attention.decode.prefill_mma"), "attention.decode.prefill_mma_fp8"));
}

}  // namespace kiln
