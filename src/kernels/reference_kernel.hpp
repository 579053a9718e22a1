// What the reference attention kernels share: their element type names, head_dim rule and
// platform (kernel-sources/attention/*_reference.cuh).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "kiln/registry.hpp"

namespace kiln::detail {

inline const char* cuda_type(const std::string& dtype) {
  if (dtype == "bf16") return "kiln::bf16";
  if (dtype == "f16") return "kiln::f16";
  if (dtype == "e4m3") return "kiln::e4m3";
  return nullptr;
}

// The reference kernels give each lane of a warp head_dim / 32 columns.
inline std::optional<std::string> check_reference_head_dim(const Signature& sig) {
  const int64_t d = sig.get_int("head_dim");
  if (d % 32 != 0 || d < 32 || d > 256) {
    return fmt::format("head_dim {} unsupported (supported: multiples of 32 from 32 to 256)", d);
  }
  return std::nullopt;
}

inline uint32_t ceil_div(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

inline Requirements any_nvidia_since_ampere() {
  Requirements r;
  r.vendor = Vendor::kNvidia;
  r.min_arch = 80;  // cvt.rn.bf16.f32
  return r;
}

// attention.prefill.reference, or with `extend` attention.extend.reference (paged, e4m3 cache).
KernelSpec prefill_reference_spec(bool extend);

}  // namespace kiln::detail
