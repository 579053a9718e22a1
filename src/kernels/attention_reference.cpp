// Registration of the reference attention kernels (kernel-sources/attention/*_reference.cuh).
#include <fmt/format.h>

#include "attention/params.h"
#include "kiln/error.hpp"
#include "kiln/registry.hpp"
#include "kernels/signature_checks.hpp"
#include "kernels/portable_kernel.hpp"

namespace kiln {
namespace {

const char* cuda_type(const std::string& dtype) {
  if (dtype == "bf16") return "kiln::bf16";
  if (dtype == "f16") return "kiln::f16";
  if (dtype == "e4m3") return "kiln::e4m3";
  return nullptr;
}

// The reference kernels give each lane of a warp head_dim / 32 columns.
std::optional<std::string> check_head_dim(const Signature& sig) {
  const int64_t d = sig.get_int("head_dim");
  if (d % 32 != 0 || d < 32 || d > 256) {
    return fmt::format("head_dim {} unsupported (supported: multiples of 32 from 32 to 256)", d);
  }
  return std::nullopt;
}

uint32_t ceil_div(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

Requirements any_nvidia_since_ampere() {
  Requirements r;
  r.vendor = Vendor::kNvidia;
  r.min_arch = 80;  // cvt.rn.bf16.f32
  return r;
}

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
    return check_head_dim(sig);
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::prefill_reference<{}, {}>", cuda_type(sig.get("dtype")),
                                      sig.get_int("head_dim")),
                          {}};
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
    const std::string& kv = sig.get("kv_dtype");
    if (kv != sig.get("dtype") && kv != "e4m3") {
      return fmt::format("kv_dtype {} unsupported with dtype {} (supported: the same, or e4m3)", kv, sig.get("dtype"));
    }
    return check_head_dim(sig);
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::decode_reference<{}, {}, {}>", cuda_type(sig.get("dtype")),
                                      cuda_type(sig.get("kv_dtype")), sig.get_int("head_dim")),
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

KILN_REGISTER_KERNEL(attention_prefill_reference) { return prefill_reference_spec(); }
KILN_REGISTER_KERNEL(attention_prefill_reference_amd) { return detail::amd_registration(prefill_reference_spec()); }
KILN_REGISTER_KERNEL(attention_decode_reference) { return decode_reference_spec(); }
KILN_REGISTER_KERNEL(attention_decode_reference_amd) { return detail::amd_registration(decode_reference_spec()); }

}  // namespace kiln
