// Registration of the weight-streaming MoE kernel (kernel-sources/moe/apply_stream.cuh): one
// cooperative launch with grid-wide barriers and a stream-ordered workspace, on NVIDIA sm_80+; on
// sm_90a its up and down phases become grouped GEMMs on wgmma from a token count on, with MXFP4
// weights converted to bf16 in shared memory (moe/apply_stream_gemm_sm90.cuh).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "kernels/moe_signature.hpp"
#include "kiln/registry.hpp"
#include "moe/params.h"
#include "moe/stream_workspace.h"

namespace kiln {
namespace {

constexpr int kMaxExperts = 256;  // kMoeStreamMaxExperts in apply_stream.cuh: routing keeps 8 logits per lane
// Routed (token, slot) pairs from which the grouped-GEMM phases replace the weight-streaming ones
// on sm_90a with bf16 weights. Chosen on an H200 (bench/RESULTS.md) against the streaming phases
// of the time (a warp per weight row, before they moved to mma.sync), GPT-OSS-120B's layer: 4
// pairs (T = 1) 0.095 ms streaming against 0.099 on the GEMMs; 32 pairs (T = 8) 0.490 against
// 0.445. Not measured again since, nor between the two.
constexpr long long kGemmMinPairs = 16;

// Whether the call runs the large-batch build (stream_workspace.h): MXFP4 weights only, as the
// signature's large_batch.
int large_batch(const KilnMoeParams& p) { return p.w13_scale != nullptr && kiln_moe_large_batch(p.num_tokens, p.top_k, p.num_experts); }

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// The grouped GEMMs need wgmma (sm_90a) and H and I in whole 64-deep K slices
// (apply_stream_gemm_sm90.cuh). Their weights and x go through TMA copies and 16-byte loads: 16-byte
// aligned, with row and expert strides in whole 16 bytes (strides count stored elements: bf16, or
// bytes of two e2m1 values). With MXFP4 weights they take over where kiln_moe_mxfp4_gemm_pays,
// which the kernel checks too.
bool use_grouped_gemm(const KilnMoeParams& p, const Platform& platform) {
  const bool mxfp4 = p.w13_scale != nullptr;
  const long long per16 = mxfp4 ? 16 : 8;  // stored elements in 16 bytes
  const bool aligned = aligned16(p.x) && aligned16(p.w13) && aligned16(p.w2) && p.x_row_stride % 8 == 0 && p.w13_row_stride % per16 == 0 &&
                       p.w13_expert_stride % per16 == 0 && p.w2_row_stride % per16 == 0 && p.w2_expert_stride % per16 == 0;
  // W4A8 (MXFP8 activations) takes them as MXFP4 does: they quantize x and act before their copies.
  const bool enough =
      mxfp4 ? kiln_moe_mxfp4_gemm_pays(p.num_tokens, p.top_k) : static_cast<long long>(p.num_tokens) * p.top_k >= kGemmMinPairs;
  return platform.has_feature("mma:wgmma") && aligned && p.hidden % 64 == 0 && p.intermediate % 64 == 0 && enough;
}

// The grouped GEMMs' operands as TMA tensor maps (apply_stream_gemm_sm90.cuh): boxes of 64 K by 64 rows
// of x_grouped (in y's region, after bf16 y) and act, both in grouped order (by 48 rows in the
// large-batch build, whose MXFP4 tiles hold 144 pairs: stream_workspace.h); weight boxes of 64 K
// by 256 rows of one expert, and by 32 rows of W13 for concatenated gate and up.
std::vector<TensorMapRequest> gemm_tensor_maps(const KilnMoeParams& p, const Platform& platform) {
  if (!use_grouped_gemm(p, platform)) return {};
  const KilnMoeStreamWorkspace layout = kiln_moe_stream_workspace(p.num_tokens, p.top_k, p.num_experts, p.hidden, p.intermediate);
  const auto* ws = static_cast<const unsigned char*>(p.workspace);
  const uint64_t pairs = static_cast<uint64_t>(p.num_tokens) * p.top_k, hidden = p.hidden, inter = p.intermediate;
  auto slot_offset = [](size_t slot) { return offsetof(KilnMoeParams, tensor_maps) + slot * sizeof(KilnTensorMap); };
  auto rows = [&](size_t slot, const void* base, uint64_t columns, uint64_t count, uint32_t box_rows) {
    return TensorMapRequest::of(slot_offset(slot), base, {columns, count}, {columns * 2}, {64, box_rows});
  };
  auto weights = [&](size_t slot, const void* base, uint64_t columns, uint64_t count, long long row_stride, long long expert_stride,
                     uint32_t box_rows) {
    return TensorMapRequest::of(slot_offset(slot), base, {columns, count, static_cast<uint64_t>(p.num_experts)},
                                {static_cast<uint64_t>(row_stride) * 2, static_cast<uint64_t>(expert_stride) * 2}, {64, box_rows, 1});
  };
  if (p.w13_scale != nullptr) {  // MXFP4: the copiers load the weights; only x and act go through TMA
    const auto box = static_cast<uint32_t>(kiln_moe_mxfp4_box_rows(large_batch(p)));
    return {rows(kMoeMapXGrouped, ws + layout.x_grouped, hidden, pairs, box), rows(kMoeMapAct, ws + layout.act, inter, pairs, box)};
  }
  return {rows(kMoeMapXGrouped, ws + layout.x_grouped, hidden, pairs, 64),
          weights(kMoeMapW13, p.w13, hidden, 2 * inter, p.w13_row_stride, p.w13_expert_stride, 256),
          weights(kMoeMapW13By32, p.w13, hidden, 2 * inter, p.w13_row_stride, p.w13_expert_stride, 32),
          rows(kMoeMapAct, ws + layout.act, inter, pairs, 64),
          weights(kMoeMapW2, p.w2, inter, hidden, p.w2_row_stride, p.w2_expert_stride, 256)};
}

// The MXFP4 rings (and split-tile sums), and after them x for local routing where the GPU's shared
// memory holds it beside the kernel's static arrays (about 30 KB, or 14 KB in the large-batch
// build; kStaticSharedSlack leaves room to spare).
uint32_t mxfp4_streaming_shared_bytes(const KilnMoeParams& p, const Platform& platform) {
  constexpr long long kStaticSharedSlack = 32 * 1024;
  const long long rings = kiln_moe_ring_bytes(large_batch(p)), with_x = rings + kiln_moe_local_x_bytes(p.num_tokens, p.hidden);
  const bool fits = with_x + kStaticSharedSlack <= static_cast<long long>(platform.shared_memory_per_block);
  return static_cast<uint32_t>(fits ? with_x : rings);
}

// The launch's dynamic shared memory: the grouped-GEMM stages where those phases run (its size
// selects them in the kernel), the MXFP4 rings (and x) otherwise, none for bf16 streaming.
uint32_t dynamic_shared_bytes(const KilnMoeParams& p, const Platform& platform) {
  if (use_grouped_gemm(p, platform))
    return p.w13_scale != nullptr ? kiln_moe_gemm_mxfp4_shared_bytes(large_batch(p)) : KILN_MOE_GEMM_SHARED_BYTES;
  return p.w13_scale != nullptr ? mxfp4_streaming_shared_bytes(p, platform) : 0;
}

KernelSpec moe_stream_spec() {
  KernelSpec spec;
  spec.name = "moe.apply.stream";
  spec.family = kFamilyMoe;
  spec.mode = kModeApply;
  spec.priority = Priority::kPerformant;
  spec.specificity = 1;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = 80;
  spec.source = "moe/apply_stream.cuh";
  spec.accepts = [](const Signature& sig) -> std::optional<std::string> {
    if (auto why = detail::moe_accepts(sig)) return why;
    if (sig.get_int("experts") > kMaxExperts)
      return fmt::format("experts {} unsupported (at most {})", sig.get_int("experts"), kMaxExperts);
    return std::nullopt;
  };
  spec.specialize = [](const Signature& sig, const Platform&) {
    std::vector<std::string> options;
    if (sig.has("large_batch") && sig.get_int("large_batch") != 0) options.emplace_back("-DKILN_MOE_LARGE_BATCH=1");
    return Specialization{detail::moe_template_instance("kiln::moe_apply_stream", sig), options};
  };
  // One CTA per SM, all resident (the cooperative launch fails rather than deadlock when they are
  // not): 512 threads with MXFP4 weights (at most 128 registers each, about 30 KB of static shared
  // memory, 14 KB in the large-batch build), 384 with bf16 (168 registers each, about 25 KB;
  // stream_workspace.h says why). The dynamic shared memory holds the grouped-GEMM stages where
  // those phases run (its size selects them) and the MXFP4 weight rings of the streaming phases
  // (60 KB; 76 KB with the split-tile sums in the large-batch build), then x for up to 16 tokens
  // routed locally; none otherwise.
  spec.launch_shape = [](const void* params, const Platform& platform) {
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>(std::max(platform.multiprocessor_count, 1));
    const auto& p = *static_cast<const KilnMoeParams*>(params);
    shape.block[0] = static_cast<uint32_t>(32 * kiln_moe_stream_warps(p.w13_scale != nullptr));
    shape.cooperative = true;
    shape.dynamic_shared_bytes = dynamic_shared_bytes(p, platform);
    return shape;
  };
  spec.workspace_bytes = [](const void* params, const Platform&) {
    const auto& p = *static_cast<const KilnMoeParams*>(params);
    return static_cast<size_t>(kiln_moe_stream_workspace(p.num_tokens, p.top_k, p.num_experts, p.hidden, p.intermediate).total);
  };
  // Routed in the grid, the GEMM tile counters and the per-expert counts and cursors start at
  // zero; routed locally, nothing does, and the launch goes without a memset before it (on an
  // H200 as CUDA graphs, GPT-OSS at T = 1: MXFP4 0.0427 ms against 0.0436, bf16 0.0716 against
  // 0.0726). Every other region is written before it is read (stream_workspace.h).
  spec.tensor_maps = [](const void* params, const Platform& platform) {
    return gemm_tensor_maps(*static_cast<const KilnMoeParams*>(params), platform);
  };
  spec.workspace_zeroed_bytes = [](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnMoeParams*>(params);
    if (kiln_moe_routes_locally(p.num_tokens, p.hidden, p.w13_scale != nullptr, use_grouped_gemm(p, platform), large_batch(p),
                                dynamic_shared_bytes(p, platform))) {
      return size_t{0};
    }
    return static_cast<size_t>(kiln_moe_stream_workspace(p.num_tokens, p.top_k, p.num_experts, p.hidden, p.intermediate).ids);
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(moe_apply_stream) { return moe_stream_spec(); }

}  // namespace kiln
