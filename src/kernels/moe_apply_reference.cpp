// Registration of the reference MoE kernel (kernel-sources/moe/apply_reference.cuh).
#include <fmt/format.h>

#include "kernels/moe_signature.hpp"
#include "kernels/portable_kernel.hpp"
#include "kiln/error.hpp"
#include "kiln/registry.hpp"
#include "moe/params.h"

namespace kiln {
namespace {

KernelSpec moe_reference_spec() {
  KernelSpec spec;
  spec.name = "moe.apply.reference";
  spec.family = kFamilyMoe;
  spec.mode = kModeApply;
  spec.priority = Priority::kReference;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = 80;
  spec.source = "moe/apply_reference.cuh";
  spec.accepts = detail::moe_accepts;
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{detail::moe_template_instance("kiln::moe_apply_reference", sig), {}};
  };
  spec.launch_shape = [](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnMoeParams*>(params);
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>(p.num_tokens);
    shape.block[0] = 256;
    const size_t bytes =
        (2 * static_cast<size_t>(p.hidden) + static_cast<size_t>(p.intermediate)) * sizeof(float) + 2 * detail::kMoeMaxTopK * sizeof(float);
    if (bytes > platform.shared_memory_per_block) {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("the reference MoE kernel needs {} bytes of shared memory for H = {}, I = {}; {} allows {}", bytes, p.hidden,
                              p.intermediate, platform.arch, platform.shared_memory_per_block));
    }
    shape.dynamic_shared_bytes = static_cast<uint32_t>(bytes);
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(moe_apply_reference) { return moe_reference_spec(); }
KILN_REGISTER_KERNEL(moe_apply_reference_amd) { return detail::amd_registration(moe_reference_spec()); }

}  // namespace kiln
