// Registration of the cluster split-KV decode kernel (sm_90+, kernel-sources/attention/
// decode_mma_sm90.cuh): tensor cores over the GQA group, the sequence split over the CTAs of a
// thread-block cluster that merges in distributed shared memory.
#include <algorithm>

#include <fmt/format.h>

#include "attention/params.h"
#include "kiln/registry.hpp"
#include "kernels/signature_checks.hpp"

namespace kiln {
namespace {

// Clusters of up to 16 CTAs (8 is the portable size; Hopper allows 16 to a kernel that opts in,
// which the launcher does for any cluster above 8).
constexpr int kMaxSplits = 16;
constexpr int kMinTokensPerSplit = 256;

// decode_mma_sm90's copy ring per warp: decode_mma_stages() in the kernel source.
constexpr int kCopyStages = 2;

// q in a 16-bit type and the cache in the same type (e4m3 for the fp8 registration), head_dim 64
// or 128, and at most `max_rows` query rows (q_len x group) per KV head; at head_dim 128 at most 8
// (static shared memory: 48 KB).
std::optional<std::string> check(const Signature& sig, int64_t max_rows, bool fp8_cache) {
  if (auto why = detail::check_16bit_dtype(sig)) return why;
  const std::string& dtype = sig.get("dtype");
  const std::string wanted_cache = fp8_cache ? "e4m3" : dtype;
  if (sig.get("kv_dtype") != wanted_cache) {
    return fmt::format("kv_dtype {} unsupported (supported: {})", sig.get("kv_dtype"),
                       fp8_cache ? "e4m3; a 16-bit cache runs on attention.decode.mma_cluster"
                                 : "the same as dtype; an e4m3 cache runs on attention.decode.mma_cluster_fp8");
  }
  if (auto why = detail::check_head_dim_64_or_128(sig)) return why;
  const int64_t d = sig.get_int("head_dim");
  const int64_t page = sig.get_int("page_size");
  if (page < 16 || page > 128 || (page & (page - 1)) != 0) {
    return fmt::format("page_size {} unsupported (supported: 16, 32, 64, 128: a 16-token tile must lie in one page)", page);
  }
  const int64_t rows = sig.get_int("q_len") * sig.get_int("group");
  const int64_t limit = d == 128 ? std::min<int64_t>(max_rows, 8) : max_rows;
  if (rows > limit) return fmt::format("q_len x group = {} unsupported at head_dim {} (at most {})", rows, d, limit);
  return std::nullopt;
}

// Dynamic shared memory of decode_mma_sm90: four warps of DecodeTileLayout::kWarpBytes (kCopyStages
// stages of a 16-token K tile and V tile with padded rows; for an e4m3 cache an f16 V tile too).
// Must match the kernel's layout.
uint32_t mma_shared_bytes(int head_dim, bool fp8_cache) {
  const int k_row = fp8_cache ? head_dim + 32 : 2 * (head_dim + (head_dim == 64 ? 32 : 8));
  const int v_row = fp8_cache ? head_dim + 16 : 2 * (head_dim + 8);
  const int staging = fp8_cache ? 16 * 2 * (head_dim + 8) : 0;
  return static_cast<uint32_t>(4 * (kCopyStages * 16 * (k_row + v_row) + staging));
}

// Split the sequence over up to 16 CTAs of a cluster until every SM has at least one CTA, keeping
// at least 256 tokens per split: no split when the batch alone gives every SM a CTA. Measured on
// an H200 (B8 ctx32768 head_dim 128, 64 (batch, KV head) pairs): 3 splits 0.285 ms, 6 (one full
// wave of 3 CTAs per SM) 0.306-0.319 ms, 16 0.305-0.308 ms; more CTAs per SM than the batch needs
// only add cluster merges.
LaunchShape cluster_launch(const void* params, const Platform& platform) {
  const auto& p = *static_cast<const KilnDecodeParams*>(params);
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t max_context = static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  const int64_t sms = std::max(platform.multiprocessor_count, 1);
  int64_t splits = std::clamp<int64_t>((sms + pairs - 1) / std::max<int64_t>(pairs, 1), 1, kMaxSplits);
  while (splits > 1 && max_context / splits < kMinTokensPerSplit) --splits;
  LaunchShape shape;
  shape.grid[0] = static_cast<uint32_t>(splits);
  shape.grid[1] = static_cast<uint32_t>(p.num_heads_kv);
  shape.grid[2] = static_cast<uint32_t>(p.batch);
  shape.block[0] = 128;
  if (splits > 1) shape.cluster[0] = static_cast<uint32_t>(splits);
  return shape;
}

// One registration per cache kind; the same kernel template serves both (decode_mma_sm90.cuh).
KernelSpec mma_cluster_kernel(const char* name, bool fp8_cache) {
  KernelSpec spec;
  spec.name = name;
  spec.family = kFamilyAttention;
  spec.mode = kModeDecode;
  spec.priority = Priority::kSpecialized;
  spec.specificity = 3;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = 90;
  spec.requirements.features = {"launch:cluster"};
  spec.source = "attention/decode_mma_sm90.cuh";
  spec.accepts = [fp8_cache](const Signature& sig) { return check(sig, 16, fp8_cache); };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::decode_mma_sm90<kiln::{}, kiln::{}, {}, {}, {}>", sig.get("dtype"), sig.get("kv_dtype"),
                                      sig.get_int("head_dim"), sig.get_int("q_len"), sig.get_int("group")),
                          {}};
  };
  spec.launch_shape = [fp8_cache](const void* params, const Platform& platform) {
    LaunchShape shape = cluster_launch(params, platform);
    shape.dynamic_shared_bytes = mma_shared_bytes(static_cast<const KilnDecodeParams*>(params)->head_dim, fp8_cache);
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_decode_mma_cluster) { return mma_cluster_kernel("attention.decode.mma_cluster", false); }
KILN_REGISTER_KERNEL(attention_decode_mma_cluster_fp8) { return mma_cluster_kernel("attention.decode.mma_cluster_fp8", true); }

}  // namespace kiln
