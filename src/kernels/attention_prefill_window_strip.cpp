// attention.prefill.window_strip and attention.extend.window_strip
// (kernel-sources/attention/prefill_window_strip.cuh, sm_90a): GPT-OSS's sliding layers (head_dim
// 64, group 8, causal windows of at most 129 keys), over contiguous K and V and over paged caches
// of the queries' type (pages TMA copies whole by TMA, others gathered by cp.async) or of e4m3
// (gathered through registers and widened exactly). A CTA walks a strip of positions of one KV
// head, 8 positions x 8 heads a step (its two warpgroups in turn), reading each K and V row once
// and each band in one pass; outranks the head-packing window kernels where it applies.
#include <fmt/format.h>

#include <algorithm>

#include "attention/params.h"
#include "attention/window_strip.h"
#include "kernels/prefill_kernel.hpp"
#include "kernels/signature_checks.hpp"
#include "kiln/error.hpp"

namespace kiln {
namespace {

// Strips per sequence and KV head: as many CTAs as two an SM hold (their shared memory and
// registers allow two) and no more, each at least 8 steps long so that a strip's first band,
// copied whole, stays a small part of it.
uint32_t strips_of(const KilnPrefillParams& p, const Platform& platform) {
  const int64_t steps = (p.max_seqlen_q + kWindowStripPositions - 1) / kWindowStripPositions;
  const int64_t units = std::max<int64_t>(1, int64_t{p.batch} * p.num_heads_kv);
  const int64_t wanted = 2 * std::max(platform.multiprocessor_count, 1) / units;  // no second partial wave
  return static_cast<uint32_t>(std::max<int64_t>(1, std::min(wanted, steps / 8)));
}

// paged: mha_extend_with_kvcache's form.
KernelSpec window_strip_spec(const char* name, bool paged) {
  KernelSpec spec;
  spec.name = name;
  spec.family = kFamilyAttention;
  spec.mode = paged ? kModeExtend : kModePrefill;
  spec.priority = Priority::kSpecialized;
  spec.specificity = 5;  // narrower than the head-packing window kernels (4)
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = 90;
  spec.requirements.features = {"mma:wgmma", "memory:tma"};
  spec.source = "attention/prefill_window_strip.cuh";
  spec.accepts = [paged](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    if (paged && sig.get("kv_dtype") != sig.get("dtype") && sig.get("kv_dtype") != "e4m3") {
      return fmt::format("kv_dtype {} unsupported (supported: the same as dtype, or e4m3)", sig.get("kv_dtype"));
    }
    if (sig.get_int("head_dim") != 64) return fmt::format("head_dim {} unsupported (supported: 64)", sig.get_int("head_dim"));
    if (sig.get_int("group") != kWindowStripHeads) {
      return fmt::format("group {} unsupported (supported: {})", sig.get_int("group"), int{kWindowStripHeads});
    }
    if (!sig.get_flag("causal") || !sig.has("short_window") || !sig.get_flag("short_window")) {
      return fmt::format("only for causal windows of at most {} keys behind a row (causal=1, short_window=1)", int{kWindowStripMaxWindow});
    }
    if (sig.get_flag("softcap")) return std::string("softcap unsupported");
    return std::nullopt;
  };
  spec.specialize = [paged](const Signature& sig, const Platform&) {
    const bool e4m3_cache = paged && sig.get("kv_dtype") == "e4m3";
    return Specialization{
        fmt::format("kiln::prefill_window_strip<kiln::{}{}{}>", sig.get("dtype"), paged ? ", true" : "", e4m3_cache ? ", kiln::e4m3" : ""),
        {}};
  };
  spec.launch_shape = [name](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnPrefillParams*>(params);
    LaunchShape shape;
    shape.grid[0] = strips_of(p, platform);
    shape.grid[1] = static_cast<uint32_t>(p.num_heads_kv);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = kWindowStripThreads;
    shape.dynamic_shared_bytes = kWindowStripSharedBytes;
    if (shape.dynamic_shared_bytes > platform.shared_memory_per_block) {
      throw Error(ErrorCode::kUnsupported, fmt::format("{} needs {} bytes of shared memory; {} allows {}", name, shape.dynamic_shared_bytes,
                                                       platform.arch, platform.shared_memory_per_block));
    }
    return shape;
  };
  spec.tensor_maps = [](const void* params, const Platform&) {
    return detail::prefill_tensor_maps(*static_cast<const KilnPrefillParams*>(params), kWindowStripPositions, 8, kWindowStripHeads);
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_prefill_window_strip) { return window_strip_spec("attention.prefill.window_strip", false); }
KILN_REGISTER_KERNEL(attention_extend_window_strip) { return window_strip_spec("attention.extend.window_strip", true); }

}  // namespace kiln
