// attention.decode.reference (and .amd from the same source): kernel-sources/attention/decode_reference.cuh.
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

KernelSpec decode_reference_spec() {
  KernelSpec spec;
  spec.name = "attention.decode.reference";
  spec.family = kFamilyAttention;
  spec.mode = kModeDecode;
  spec.priority = Priority::kReference;
  spec.requirements = any_nvidia_since_ampere();
  spec.source = "attention/decode_reference.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    if (auto why = detail::check_same_or_e4m3_cache(sig)) return why;
    return detail::check_reference_head_dim(sig);
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::decode_reference<{}, {}, {}>", cuda_type(sig.get("dtype")), cuda_type(sig.get("kv_dtype")),
                                      sig.get_int("head_dim")),
                          {}};
  };
  spec.launch_shape = [](const void* params, const Platform&) {
    const auto& p = *static_cast<const KilnDecodeParams*>(params);
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>(p.num_heads_q);
    shape.grid[1] = static_cast<uint32_t>(p.batch * p.q_len);
    shape.block[0] = 32;
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_decode_reference) { return decode_reference_spec(); }
KILN_REGISTER_KERNEL(attention_decode_reference_amd) { return detail::amd_registration(decode_reference_spec()); }

}  // namespace kiln
