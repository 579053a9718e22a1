// Registration of the reference MoE kernel (kernel-sources/moe/moe_reference.cuh).
#include <fmt/format.h>

#include "kiln/error.hpp"
#include "kiln/registry.hpp"
#include "kernels/portable_kernel.hpp"
#include "moe/params.h"

namespace kiln {
namespace {

constexpr int kMaxTopK = 32;  // kMoeMaxTopK in moe_reference.cuh

int bias_kind(const std::string& bias) { return bias == "none" ? 0 : bias == "f32" ? 1 : 2; }

KernelSpec moe_reference_spec() {
  KernelSpec spec;
  spec.name = "moe.apply.reference";
  spec.family = kFamilyMoe;
  spec.mode = kModeApply;
  spec.priority = Priority::kReference;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = 80;
  spec.source = "moe/moe_reference.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (sig.get("dtype") != "bf16") return fmt::format("dtype {} unsupported (supported: bf16)", sig.get("dtype"));
    const std::string& w = sig.get("weights");
    if (w != "bf16" && w != "mxfp4") return fmt::format("weights {} unsupported (supported: bf16, mxfp4)", w);
    if (sig.get_int("top_k") > kMaxTopK) return fmt::format("top_k {} unsupported (at most {})", sig.get_int("top_k"), kMaxTopK);
    return std::nullopt;
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    const std::string& routing = sig.get("routing");
    const int routing_kind = routing == "topk_softmax" ? 0 : routing == "softmax_topk" ? 1 : 2;
    const bool logits_bf16 = sig.has("logits") && sig.get("logits") == "bf16";
    return Specialization{
        fmt::format("kiln::moe_reference<{}, {}, {}, {}, {}, {}, {}>", sig.get("weights") == "mxfp4" ? 1 : 0,
                    sig.get("activation") == "swiglu_clamped" ? 1 : 0, sig.get("layout") == "interleaved" ? 1 : 0,
                    routing_kind, logits_bf16 ? "true" : "false", bias_kind(sig.get("w13_bias")),
                    bias_kind(sig.get("w2_bias"))),
        {}};
  };
  spec.launch_shape = [](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnMoeParams*>(params);
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>(p.num_tokens);
    shape.block[0] = 256;
    const size_t bytes = (2 * static_cast<size_t>(p.hidden) + static_cast<size_t>(p.intermediate)) * sizeof(float) +
                         2 * kMaxTopK * sizeof(float);
    if (bytes > platform.shared_memory_per_block) {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("the reference MoE kernel needs {} bytes of shared memory for H = {}, I = {}; {} allows {}",
                              bytes, p.hidden, p.intermediate, platform.arch, platform.shared_memory_per_block));
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
