// Registration of the AMD matrix-core MoE kernel (kernel-sources/moe/apply_mfma.cuh): one
// cooperative launch with grid-wide barriers over moe_apply_stream's workspace layout. Compile-verified
// for gfx942 and gfx950 (clang); no AMD GPU has run it.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <fmt/format.h>

#include "kernels/moe_signature.hpp"
#include "kiln/registry.hpp"
#include "moe/params.h"
#include "moe/stream_workspace.h"

namespace kiln {
namespace {

constexpr int kMaxExperts = 256;  // kMoeMfmaMaxExperts in apply_mfma.cuh: one wavefront prefixes 4 a lane

KilnMoeStreamWorkspace workspace_layout(const void* params) {
  const auto& p = *static_cast<const KilnMoeParams*>(params);
  return kiln_moe_stream_workspace(p.num_tokens, p.top_k, p.num_experts, p.hidden, p.intermediate);
}

}  // namespace

KILN_REGISTER_KERNEL(moe_apply_mfma) {
  KernelSpec spec;
  spec.name = "moe.apply.mfma";
  spec.family = kFamilyMoe;
  spec.mode = kModeApply;
  spec.backend = Backend::kHip;
  spec.priority = Priority::kPerformant;
  spec.specificity = 1;
  spec.requirements.vendor = Vendor::kAmd;
  spec.requirements.min_arch = 910;  // gfx90a: 32x32x8 bf16_1k MFMA
  spec.requirements.features = {"mma:mfma"};
  spec.source = "moe/apply_mfma.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::moe_accepts(sig)) return why;
    if (sig.get("weights") == "mxfp4_prepared")
      return std::string("prepared MXFP4 weights unsupported (NVIDIA's layout; pass the standard one)");
    if (sig.get_int("experts") > kMaxExperts)
      return fmt::format("experts {} unsupported (at most {})", sig.get_int("experts"), kMaxExperts);
    return std::nullopt;
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{detail::moe_template_instance("kiln::moe_apply_mfma", sig), {}};
  };
  // One workgroup of 8 wavefronts per CU, all resident (the cooperative launch fails rather than
  // deadlock when they are not): the grid-wide barriers wait for every workgroup.
  spec.launch_shape = [](const void*, const Platform& platform) {
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>(std::max(platform.multiprocessor_count, 1));
    shape.block[0] = 512;
    shape.cooperative = true;
    return shape;
  };
  spec.workspace_bytes = [](const void* params, const Platform&) { return static_cast<size_t>(workspace_layout(params).total); };
  // The barrier's arrival count (in gemm_counters), counts and fill start at zero; the kernel
  // writes every later region before reading it.
  spec.workspace_zeroed_bytes = [](const void* params, const Platform&) { return static_cast<size_t>(workspace_layout(params).ids); };
  return spec;
}

}  // namespace kiln
