// mha_extend_with_kvcache's kernels: the prefill kernels with paged K and V (kPaged: each copied
// key row finds its page), so extend and prefill share one mainloop. attention.extend.wgmma on
// Hopper, attention.extend.mma and .mma_window (head packing for causal windows) on every NVIDIA
// GPU from sm_80, attention.extend.mfma on AMD (compile-verified only), and the reference, the
// only one that reads an e4m3 cache.
#include <fmt/format.h>

#include "attention/params.h"
#include "kernels/portable_kernel.hpp"
#include "kernels/prefill_kernel.hpp"
#include "kernels/reference_kernel.hpp"
#include "kernels/signature_checks.hpp"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

using detail::PrefillInput;

KernelSpec extend_reference_spec() {
  KernelSpec spec;
  spec.name = "attention.extend.reference";
  spec.family = kFamilyAttention;
  spec.mode = kModeExtend;
  spec.priority = Priority::kReference;
  spec.requirements = detail::any_nvidia_since_ampere();
  spec.source = "attention/prefill_reference.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    if (auto why = detail::check_same_or_e4m3_cache(sig)) return why;
    return detail::check_reference_head_dim(sig);
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::prefill_reference<{}, {}, {}>", detail::cuda_type(sig.get("dtype")), sig.get_int("head_dim"),
                                      detail::cuda_type(sig.get("kv_dtype"))),
                          {}};
  };
  spec.launch_shape = [](const void* params, const Platform&) {
    const auto& p = *static_cast<const KilnPrefillParams*>(params);
    LaunchShape shape;
    shape.grid[0] = detail::ceil_div(p.max_seqlen_q, 4);
    shape.grid[1] = static_cast<uint32_t>(p.num_heads_q);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = 128;
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_extend_reference) { return extend_reference_spec(); }
KILN_REGISTER_KERNEL(attention_extend_reference_amd) { return detail::amd_registration(extend_reference_spec()); }

KILN_REGISTER_KERNEL(attention_extend_wgmma) {
  detail::PrefillKernel k = detail::wgmma_kernel("attention.extend.wgmma");
  k.input = PrefillInput::kPagedExtend;
  return detail::prefill_kernel(k);
}

KILN_REGISTER_KERNEL(attention_extend_mma) {
  detail::PrefillKernel k = detail::mma_sync_kernel("attention.extend.mma", Priority::kPortable);
  k.input = PrefillInput::kPagedExtend;
  return detail::prefill_kernel(k);
}

KILN_REGISTER_KERNEL(attention_extend_mma_window) {
  detail::PrefillKernel k = detail::mma_sync_kernel("attention.extend.mma_window", Priority::kSpecialized);
  k.windows_only = k.packs_heads = true;
  k.key_rows = 48;
  k.stages = 3;
  k.input = PrefillInput::kPagedExtend;
  return detail::prefill_kernel(k);
}

// Decode with 2 to 16 new tokens per sequence (speculative verification): the paged mma kernel
// packing up to 4 query heads of a KV head over 16 positions, so a GQA group's tokens share their
// K and V tiles. (8 warps holding all 8 GPT-OSS heads of a KV head measured the same: 0.340 ms
// against 0.337 at B64 ctx4096 q_len 16, H100; bench/RESULTS.md.)
KILN_REGISTER_KERNEL(attention_decode_prefill_mma) {
  detail::PrefillKernel k = detail::mma_sync_kernel("attention.decode.prefill_mma", Priority::kPortable);
  k.entry = "decode_prefill_mma";
  k.packs_heads = true;
  k.input = PrefillInput::kPagedDecode;
  return detail::prefill_kernel(k);
}

}  // namespace kiln
