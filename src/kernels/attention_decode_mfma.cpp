// Registration of the AMD matrix-core decode kernel (kernel-sources/attention/decode_mfma.cuh).
// Compile-verified for gfx90a (hipRTC), gfx942 and gfx950 (clang); no AMD GPU has run it.
#include <fmt/format.h>

#include "attention/params.h"
#include "kiln/registry.hpp"
#include "kernels/signature_checks.hpp"

namespace kiln {

KILN_REGISTER_KERNEL(attention_decode_mfma) {
  KernelSpec spec;
  spec.name = "attention.decode.mfma";
  spec.family = kFamilyAttention;
  spec.mode = kModeDecode;
  spec.backend = Backend::kHip;
  spec.priority = Priority::kPortable;
  spec.specificity = 3;
  spec.requirements.vendor = Vendor::kAmd;
  spec.requirements.min_arch = 910;  // gfx90a: 32x32x8 bf16_1k MFMA
  spec.requirements.features = {"mma:mfma"};
  spec.source = "attention/decode_mfma.cuh";
  // A 16-bit cache of q's type, head_dim 64 or 128, at most 16 query rows (q_len x group) per KV
  // head: they are the columns of a 32-wide product. Any page size.
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    if (sig.get("kv_dtype") != sig.get("dtype")) {
      return fmt::format("kv_dtype {} unsupported (supported: the same as dtype; an e4m3 cache runs on the reference)", sig.get("kv_dtype"));
    }
    if (auto why = detail::check_head_dim_64_or_128(sig)) return why;
    const int64_t rows = sig.get_int("q_len") * sig.get_int("group");
    if (rows > 16) return fmt::format("q_len x group = {} unsupported (at most 16)", rows);
    return std::nullopt;
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::decode_mfma<kiln::{}, {}, {}, {}>", sig.get("dtype"), sig.get_int("head_dim"),
                                      sig.get_int("q_len"), sig.get_int("group")),
                          {}};
  };
  spec.launch_shape = [](const void* params, const Platform&) {
    const auto& p = *static_cast<const KilnDecodeParams*>(params);
    LaunchShape shape;
    shape.grid[1] = static_cast<uint32_t>(p.num_heads_kv);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = 256;  // 4 wavefronts
    return shape;
  };
  return spec;
}

}  // namespace kiln
