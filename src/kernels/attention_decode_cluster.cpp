// Registration of the cluster split-KV decode kernel (sm_90+, kernel-sources/attention/
// decode_mma_sm90.cuh): tensor cores over the GQA group, the sequence split over the CTAs of a
// thread-block cluster that merges in distributed shared memory.
#include <algorithm>

#include <fmt/format.h>

#include "attention/params.h"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

// Clusters of up to 16 CTAs (8 is the portable size; Hopper allows 16 to a kernel that opts in,
// which the launcher does for any cluster above 8).
constexpr int kMaxSplits = 16;
constexpr int kMinTokensPerSplit = 256;

// q and the cache in one 16-bit type, head_dim 64 or 128, and at most `max_rows`
// query rows (q_len x group) per KV head; at head_dim 128 at most 8 (static shared memory: 48 KB).
std::optional<std::string> check(const Signature& sig, int64_t max_rows) {
  const std::string& dtype = sig.get("dtype");
  if (dtype != "bf16" && dtype != "f16") return fmt::format("dtype {} unsupported (supported: bf16, f16)", dtype);
  if (sig.get("kv_dtype") != dtype) {
    return fmt::format("kv_dtype {} unsupported (supported: the same as dtype; e4m3 runs on the reference)", sig.get("kv_dtype"));
  }
  const int64_t d = sig.get_int("head_dim");
  if (d != 64 && d != 128) return fmt::format("head_dim {} unsupported (supported: 64, 128)", d);
  const int64_t rows = sig.get_int("q_len") * sig.get_int("group");
  const int64_t limit = d == 128 ? std::min<int64_t>(max_rows, 8) : max_rows;
  if (rows > limit) return fmt::format("q_len x group = {} unsupported at head_dim {} (at most {})", rows, d, limit);
  return std::nullopt;
}

// Split the sequence over up to 16 CTAs of a cluster until the grid has about four CTAs per
// multiprocessor, keeping at least 256 tokens per split: no split when the batch fills the GPU.
// Dynamic shared memory of decode_mma_sm90: per warp two stages of a 16-token K tile and V tile,
// rows padded as the kernel pads them (kKStride, kVStride). Must match the kernel's layout.
uint32_t mma_shared_bytes(int head_dim) {
  const int k_stride = head_dim + (head_dim == 64 ? 32 : 8), v_stride = head_dim + 8;
  return static_cast<uint32_t>(4 * 2 * 16 * (k_stride + v_stride) * 2);
}

LaunchShape cluster_launch(const void* params, const Platform& platform) {
  const auto& p = *static_cast<const KilnDecodeParams*>(params);
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t max_context = static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  uint32_t splits = 1;
  while (splits < kMaxSplits && pairs * splits < 4LL * platform.multiprocessor_count &&
         max_context / (2 * splits) >= kMinTokensPerSplit) {
    splits *= 2;
  }
  LaunchShape shape;
  shape.grid[0] = splits;
  shape.grid[1] = static_cast<uint32_t>(p.num_heads_kv);
  shape.grid[2] = static_cast<uint32_t>(p.batch);
  shape.block[0] = 128;
  if (splits > 1) shape.cluster[0] = splits;
  return shape;
}

KernelSpec cluster_kernel(const char* name, const char* source, const char* entry, Priority priority, int64_t max_rows) {
  KernelSpec spec;
  spec.name = name;
  spec.family = kFamilyAttention;
  spec.mode = kModeDecode;
  spec.priority = priority;
  spec.specificity = 3;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = 90;
  spec.requirements.features = {"launch:cluster"};
  spec.source = source;
  spec.accepts = [max_rows](const Signature& sig) { return check(sig, max_rows); };
  const std::string kernel_template = entry;
  spec.specialize = [kernel_template](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::{}<kiln::{}, {}, {}, {}>", kernel_template, sig.get("dtype"), sig.get_int("head_dim"),
                                      sig.get_int("q_len"), sig.get_int("group")),
                          {}};
  };
  spec.launch_shape = [](const void* params, const Platform& platform) {
    LaunchShape shape = cluster_launch(params, platform);
    shape.dynamic_shared_bytes = mma_shared_bytes(static_cast<const KilnDecodeParams*>(params)->head_dim);
    return shape;
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_decode_mma_cluster) {
  return cluster_kernel("attention.decode.mma_cluster", "attention/decode_mma_sm90.cuh", "decode_mma_sm90", Priority::kSpecialized, 16);
}

}  // namespace kiln
