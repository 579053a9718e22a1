// attention.kv_append (and .amd from the same source): kernel-sources/attention/kv_append.cuh,
// portable C++ that writes tokens into a paged cache at the memory's rate.
#include <algorithm>

#include <fmt/format.h>

#include "attention/params.h"
#include "kernels/portable_kernel.hpp"
#include "kernels/reference_kernel.hpp"
#include "kernels/signature_checks.hpp"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

KernelSpec kv_append_spec() {
  KernelSpec spec;
  spec.name = "attention.kv_append";
  spec.family = kFamilyAttention;
  spec.mode = kModeKvAppend;
  spec.priority = Priority::kPortable;
  spec.requirements = detail::any_nvidia_since_ampere();
  spec.source = "attention/kv_append.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    if (auto why = detail::check_same_or_e4m3_cache(sig)) return why;
    return std::nullopt;
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{
        fmt::format("kiln::kv_append<{}, {}>", detail::cuda_type(sig.get("dtype")), detail::cuda_type(sig.get("kv_dtype"))), {}};
  };
  spec.launch_shape = [](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnKvAppendParams*>(params);
    const int64_t chunks = static_cast<int64_t>(p.tokens) * p.num_heads_kv * (p.head_dim / 8);
    // Enough blocks to fill every SM several times over; the grid-stride loop takes the rest.
    const int64_t blocks = std::clamp<int64_t>((chunks + 255) / 256, 1, 16 * std::max(platform.multiprocessor_count, 1));
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>(blocks);
    shape.block[0] = 256;
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_kv_append) { return kv_append_spec(); }
KILN_REGISTER_KERNEL(attention_kv_append_amd) { return detail::amd_registration(kv_append_spec()); }

}  // namespace kiln
