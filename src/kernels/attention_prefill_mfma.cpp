// Registration of the AMD matrix-core prefill kernel (kernel-sources/attention/prefill_mfma.cuh).
// Compile-verified for gfx90a (hipRTC), gfx942 and gfx950 (clang); no AMD GPU has run it.
#include <fmt/format.h>

#include "attention/params.h"
#include "kernels/signature_checks.hpp"
#include "kiln/registry.hpp"

namespace kiln {

namespace {

// paged: mha_extend_with_kvcache's form (kPaged), over a cache of the queries' type or of e4m3
// (widened as it loads). head_dim 64, 128 or 256.
KernelSpec prefill_mfma_spec(const char* name, bool paged) {
  KernelSpec spec;
  spec.name = name;
  spec.family = kFamilyAttention;
  spec.mode = paged ? kModeExtend : kModePrefill;
  spec.backend = Backend::kHip;
  spec.priority = Priority::kPortable;
  spec.specificity = 2;
  spec.requirements.vendor = Vendor::kAmd;
  spec.requirements.min_arch = 910;  // gfx90a: 32x32x8 bf16_1k MFMA
  spec.requirements.features = {"mma:mfma"};
  spec.source = "attention/prefill_mfma.cuh";
  spec.accepts = [paged](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    if (paged && sig.get("kv_dtype") != sig.get("dtype") && sig.get("kv_dtype") != "e4m3") {
      return fmt::format("kv_dtype {} unsupported (supported: the same as dtype, or e4m3)", sig.get("kv_dtype"));
    }
    return detail::check_head_dim_64_or_128(sig, /*also_256=*/true);
  };
  spec.specialize = [paged](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::prefill_mfma<kiln::{}, {}, {}, kiln::{}>", sig.get("dtype"), sig.get_int("head_dim"), paged,
                                      paged ? sig.get("kv_dtype") : sig.get("dtype")),
                          {}};
  };
  spec.launch_shape = [](const void* params, const Platform&) {
    const auto& p = *static_cast<const KilnPrefillParams*>(params);
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>((p.max_seqlen_q + 31) / 32);  // 32 queries per wavefront
    shape.grid[1] = static_cast<uint32_t>(p.num_heads_q);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = 64;
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_prefill_mfma) { return prefill_mfma_spec("attention.prefill.mfma", false); }
KILN_REGISTER_KERNEL(attention_extend_mfma) { return prefill_mfma_spec("attention.extend.mfma", true); }

}  // namespace kiln
