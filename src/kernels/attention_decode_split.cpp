// Registration of the cluster split-KV decode kernel (kernel-sources/attention/decode_split_sm90.cuh).
#include <algorithm>

#include <fmt/format.h>

#include "attention/params.h"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

constexpr int kMaxRows = 8;     // q_len * group: the query rows one CTA keeps in registers
constexpr int kMaxSplits = 8;   // the portable thread-block-cluster size
constexpr int kMinTokensPerSplit = 256;

}  // namespace

KILN_REGISTER_KERNEL(attention_decode_split_sm90) {
  KernelSpec spec;
  spec.name = "attention.decode.split_cluster";
  spec.family = kFamilyAttention;
  spec.mode = kModeDecode;
  spec.priority = Priority::kPerformant;
  spec.specificity = 3;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = 90;
  spec.requirements.features = {"launch:cluster"};
  spec.source = "attention/decode_split_sm90.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    const std::string& dtype = sig.get("dtype");
    if (dtype != "bf16" && dtype != "f16") return fmt::format("dtype {} unsupported (supported: bf16, f16)", dtype);
    if (sig.get("kv_dtype") != dtype) return fmt::format("kv_dtype {} unsupported (supported: the same as dtype; e4m3 runs on the reference)", sig.get("kv_dtype"));
    const int64_t d = sig.get_int("head_dim");
    if (d != 64 && d != 128) return fmt::format("head_dim {} unsupported (supported: 64, 128)", d);
    const int64_t rows = sig.get_int("q_len") * sig.get_int("group");
    if (rows > kMaxRows) return fmt::format("q_len x group = {} unsupported (at most {})", rows, kMaxRows);
    return std::nullopt;
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::decode_split_sm90<kiln::{}, {}, {}, {}>", sig.get("dtype"), sig.get_int("head_dim"),
                                      sig.get_int("q_len"), sig.get_int("group")),
                          {}};
  };
  // Split the sequence over up to 8 CTAs of a cluster until the grid has about four CTAs per
  // multiprocessor, keeping at least 256 tokens per split: no split when the batch fills the GPU.
  spec.launch_shape = [](const void* params, const Platform& platform) {
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
  };
  return spec;
}

}  // namespace kiln
