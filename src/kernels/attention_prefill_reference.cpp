// attention.prefill.reference (and .amd from the same source): kernel-sources/attention/prefill_reference.cuh.
#include <fmt/format.h>

#include "attention/params.h"
#include "kernels/portable_kernel.hpp"
#include "kernels/reference_kernel.hpp"
#include "kernels/signature_checks.hpp"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

using detail::any_nvidia_since_ampere;
using detail::ceil_div;
using detail::cuda_type;

KernelSpec prefill_reference_spec() {
  KernelSpec spec;
  spec.name = "attention.prefill.reference";
  spec.family = kFamilyAttention;
  spec.mode = kModePrefill;
  spec.priority = Priority::kReference;
  spec.requirements = any_nvidia_since_ampere();
  spec.source = "attention/prefill_reference.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    return detail::check_reference_head_dim(sig);
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::prefill_reference<{}, {}>", cuda_type(sig.get("dtype")), sig.get_int("head_dim")), {}};
  };
  spec.launch_shape = [](const void* params, const Platform&) {
    const auto& p = *static_cast<const KilnPrefillParams*>(params);
    LaunchShape shape;
    shape.grid[0] = ceil_div(p.max_seqlen_q, 4);
    shape.grid[1] = static_cast<uint32_t>(p.num_heads_q);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = 128;
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_prefill_reference) { return prefill_reference_spec(); }
KILN_REGISTER_KERNEL(attention_prefill_reference_amd) { return detail::amd_registration(prefill_reference_spec()); }

}  // namespace kiln
