// Registration of the tensor-core prefill kernel (kernel-sources/attention/prefill_mma_sm80.cuh):
// mma.sync, ldmatrix and cp.async, so every NVIDIA GPU from sm_80 on runs it.
#include <fmt/format.h>

#include "attention/params.h"
#include "kiln/error.hpp"
#include "kiln/registry.hpp"
#include "kernels/signature_checks.hpp"

namespace kiln {
namespace {

constexpr int kBlockQ = 64;  // query rows per CTA

// Q tile plus two stages of K and V tiles, 64 rows each: the layout of prefill_mma_sm80.cuh.
uint32_t shared_bytes(int head_dim) { return static_cast<uint32_t>((64 + 2 * 2 * 64) * head_dim * 2); }

}  // namespace

KILN_REGISTER_KERNEL(attention_prefill_mma) {
  KernelSpec spec;
  spec.name = "attention.prefill.mma";
  spec.family = kFamilyAttention;
  spec.mode = kModePrefill;
  spec.priority = Priority::kPortable;
  spec.specificity = 2;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = 80;
  spec.requirements.features = {"mma:mma_sync", "memory:cp_async"};
  spec.source = "attention/prefill_mma_sm80.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    return detail::check_head_dim_64_or_128(sig);
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::prefill_mma_sm80<kiln::{}, {}>", sig.get("dtype"), sig.get_int("head_dim")), {}};
  };
  spec.launch_shape = [](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnPrefillParams*>(params);
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>((p.max_seqlen_q + kBlockQ - 1) / kBlockQ);
    shape.grid[1] = static_cast<uint32_t>(p.num_heads_q);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = 128;
    shape.dynamic_shared_bytes = shared_bytes(p.head_dim);
    if (shape.dynamic_shared_bytes > platform.shared_memory_per_block) {
      throw Error(ErrorCode::kUnsupported, fmt::format("attention.prefill.mma needs {} bytes of shared memory at head_dim {}; {} allows {}",
                                                       shape.dynamic_shared_bytes, p.head_dim, platform.arch, platform.shared_memory_per_block));
    }
    return shape;
  };
  return spec;
}

}  // namespace kiln
