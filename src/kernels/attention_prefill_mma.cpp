// Registration of the tensor-core prefill kernels: the portable one on mma.sync, ldmatrix and
// cp.async (kernel-sources/attention/prefill_mma_sm80.cuh, every NVIDIA GPU from sm_80 on), and the
// Hopper one on wgmma (prefill_wgmma_sm90.cuh, sm_90a only: wgmma exists on no other arch).
#include <fmt/format.h>

#include "attention/params.h"
#include "kiln/error.hpp"
#include "kiln/registry.hpp"
#include "kernels/signature_checks.hpp"

namespace kiln {
namespace {

// What differs between the two kernels; the signature checks and the grid rule are shared.
struct PrefillKernel {
  const char* name;
  const char* source;
  const char* entry;  // template name, instantiated with <dtype, head_dim, softcap>
  Priority priority;
  int min_arch;
  std::vector<std::string> features;
  int block_rows_d64;  // query rows per CTA at head_dim 64, and at 128; two threads per row
  int block_rows_d128;
  int key_rows;        // rows of each K and V tile
  int stages;          // K and V tile pairs in shared memory
  uint32_t alignment;  // slack added to shared memory to align the tiles
};

KernelSpec prefill_kernel(const PrefillKernel& k) {
  KernelSpec spec;
  spec.name = k.name;
  spec.family = kFamilyAttention;
  spec.mode = kModePrefill;
  spec.priority = k.priority;
  spec.specificity = 2;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = k.min_arch;
  spec.requirements.features = k.features;
  spec.source = k.source;
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    return detail::check_head_dim_64_or_128(sig);
  };
  const std::string entry = k.entry;
  spec.specialize = [entry](const Signature& sig, const Platform&) {
    return Specialization{
        fmt::format("kiln::{}<kiln::{}, {}, {}>", entry, sig.get("dtype"), sig.get_int("head_dim"), sig.get_int("softcap") != 0), {}};
  };
  spec.launch_shape = [k](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnPrefillParams*>(params);
    const int rows = p.head_dim == 64 ? k.block_rows_d64 : k.block_rows_d128;
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>((p.max_seqlen_q + rows - 1) / rows);
    shape.grid[1] = static_cast<uint32_t>(p.num_heads_q);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = static_cast<uint32_t>(2 * rows);
    // The Q tile plus the stages of K and V tiles, 16-bit elements.
    shape.dynamic_shared_bytes = static_cast<uint32_t>((rows + 2 * k.stages * k.key_rows) * p.head_dim * 2) + k.alignment;
    if (shape.dynamic_shared_bytes > platform.shared_memory_per_block) {
      throw Error(ErrorCode::kUnsupported, fmt::format("{} needs {} bytes of shared memory at head_dim {}; {} allows {}", k.name,
                                                       shape.dynamic_shared_bytes, p.head_dim, platform.arch, platform.shared_memory_per_block));
    }
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_prefill_mma) {
  return prefill_kernel({"attention.prefill.mma", "attention/prefill_mma_sm80.cuh", "prefill_mma_sm80", Priority::kPortable, 80,
                         {"mma:mma_sync", "memory:cp_async"}, 64, 64, 64, 2, 0});
}

KILN_REGISTER_KERNEL(attention_prefill_wgmma) {
  return prefill_kernel({"attention.prefill.wgmma", "attention/prefill_wgmma_sm90.cuh", "prefill_wgmma_sm90", Priority::kPerformant, 90,
                         {"mma:wgmma", "memory:cp_async"}, 192, 128, 128, 3, 1024});
}

}  // namespace kiln
