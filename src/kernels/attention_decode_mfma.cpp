// Registration of the AMD matrix-core decode kernel (kernel-sources/attention/decode_mfma.cuh),
// split over workgroups when the batch leaves CUs idle. Compile-verified for gfx90a (hipRTC),
// gfx942 and gfx950 (clang); no AMD GPU has run it.
#include <algorithm>

#include <fmt/format.h>

#include "attention/decode_workspace.h"
#include "attention/params.h"
#include "kernels/signature_checks.hpp"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

constexpr int64_t kMinKeysPerRange = 256;

// Ranges per (sequence, KV head) pair: 1 when the pairs fill the CUs; otherwise enough for two
// workgroups a CU, each at least kMinKeysPerRange keys of the longest context the page table
// holds. Not tuned: no AMD GPU has run it.
int64_t decode_splits(const KilnDecodeParams& p, const Platform& platform) {
  const int64_t pairs = std::max<int64_t>(static_cast<int64_t>(p.batch) * p.num_heads_kv, 1);
  const int64_t cus = std::max(platform.multiprocessor_count, 1);
  if (pairs >= cus) return 1;
  const int64_t max_context = static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  return std::max<int64_t>(1, std::min((2 * cus + pairs - 1) / pairs, max_context / kMinKeysPerRange));
}

}  // namespace

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
  // A cache of q's 16-bit type or of e4m3, head_dim 64 or 128, at most 16 query rows (q_len x
  // group) per KV head: they are the columns of a 32-wide product. Any page size.
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::check_16bit_dtype(sig)) return why;
    if (sig.get("kv_dtype") != sig.get("dtype") && sig.get("kv_dtype") != "e4m3") {
      return fmt::format("kv_dtype {} unsupported (supported: the same as dtype, or e4m3)", sig.get("kv_dtype"));
    }
    if (auto why = detail::check_head_dim_64_or_128(sig)) return why;
    const int64_t rows = sig.get_int("q_len") * sig.get_int("group");
    if (rows > 16) return fmt::format("q_len x group = {} unsupported (at most 16)", rows);
    return std::nullopt;
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::decode_mfma<kiln::{}, kiln::{}, {}, {}, {}>", sig.get("dtype"), sig.get("kv_dtype"),
                                      sig.get_int("head_dim"), sig.get_int("q_len"), sig.get_int("group")),
                          {}};
  };
  spec.launch_shape = [](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnDecodeParams*>(params);
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>(decode_splits(p, platform));
    shape.grid[1] = static_cast<uint32_t>(p.num_heads_kv);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = 256;  // 4 wavefronts
    return shape;
  };
  // Split: the tickets (zeroed) and one softmax state per range (attention/decode_workspace.h).
  spec.workspace_bytes = [](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnDecodeParams*>(params);
    const int64_t splits = decode_splits(p, platform);
    if (splits == 1) return size_t{0};
    const int64_t rows = static_cast<int64_t>(p.q_len) * (p.num_heads_q / std::max(p.num_heads_kv, 1));
    return static_cast<size_t>(kiln_decode_workspace_bytes(p.batch, p.num_heads_kv, splits * p.batch, rows, p.head_dim));
  };
  spec.workspace_zeroed_bytes = [](const void* params, const Platform&) {
    const auto& p = *static_cast<const KilnDecodeParams*>(params);
    return static_cast<size_t>(kiln_decode_states_offset(static_cast<int64_t>(p.batch) * p.num_heads_kv));
  };
  return spec;
}

}  // namespace kiln
