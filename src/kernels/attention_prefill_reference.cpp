// attention.prefill.reference and attention.extend.reference (and .amd of each from the same source):
// kernel-sources/attention/prefill_reference.cuh.
#include <fmt/format.h>

#include "attention/params.h"
#include "kernels/portable_kernel.hpp"
#include "kernels/reference_kernel.hpp"
#include "kernels/signature_checks.hpp"
#include "kiln/registry.hpp"

namespace kiln {
namespace detail {

// attention.prefill.reference and attention.extend.reference: one source and one launch; extend
// reads a paged cache, which may be e4m3.
KernelSpec prefill_reference_spec(bool extend) {
  KernelSpec spec;
  spec.name = extend ? "attention.extend.reference" : "attention.prefill.reference";
  spec.family = kFamilyAttention;
  spec.mode = extend ? kModeExtend : kModePrefill;
  spec.priority = Priority::kReference;
  spec.requirements = any_nvidia_since_ampere();
  spec.source = "attention/prefill_reference.cuh";
  spec.accepts = [extend](const Signature& sig) -> std::optional<std::string> {
    if (auto why = check_16bit_dtype(sig)) return why;
    if (extend) {
      if (auto why = check_same_or_e4m3_cache(sig)) return why;
    }
    return check_reference_head_dim(sig);
  };
  spec.specialize = [extend](const Signature& sig, const Platform&) {
    const std::string kv = extend ? fmt::format(", {}", cuda_type(sig.get("kv_dtype"))) : "";
    return Specialization{fmt::format("kiln::prefill_reference<{}, {}{}>", cuda_type(sig.get("dtype")), sig.get_int("head_dim"), kv), {}};
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

}  // namespace detail

KILN_REGISTER_KERNEL(attention_prefill_reference) { return detail::prefill_reference_spec(false); }
KILN_REGISTER_KERNEL(attention_prefill_reference_amd) { return detail::amd_registration(detail::prefill_reference_spec(false)); }

}  // namespace kiln
