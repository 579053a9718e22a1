#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <thread>

#include "attention/decode_workspace.h"
#include "attention/params.h"
#include "kiln/error.hpp"
#include "kiln/registry.hpp"
#include "moe/params.h"
#include "moe/stream_workspace.h"
#include "support/signatures.hpp"

namespace kiln {
namespace {

const OperatorId kPrefill{kFamilyAttention, kModePrefill};

// A kernel that accepts head_dim in `dims` (all when empty).
KernelSpec make_kernel(const std::string& name, Priority priority, std::vector<int64_t> dims = {}, Requirements req = {},
                       int specificity = 0) {
  KernelSpec k;
  k.name = name;
  k.family = kFamilyAttention;
  k.mode = kModePrefill;
  k.priority = priority;
  k.requirements = req;
  k.specificity = specificity;
  k.source = "attention/prefill_reference.cuh";
  k.accepts = [dims](const Signature& sig) -> std::optional<std::string> {
    if (dims.empty()) return std::nullopt;
    for (int64_t d : dims) {
      if (sig.get_int("head_dim") == d) return std::nullopt;
    }
    return "head_dim " + sig.get("head_dim") + " unsupported";
  };
  k.specialize = [](const Signature&, const Platform&) { return Specialization{"f", {}}; };
  k.launch_shape = [](const void*, const Platform&) { return LaunchShape{}; };
  return k;
}

Requirements hopper_only() {
  Requirements r;
  r.min_arch = 90;
  r.max_arch = 90;
  r.features = {"mma:wgmma"};
  return r;
}

Signature sig_with_head_dim(int64_t d) {
  Signature s(kPrefill);
  s.set("dtype", "bf16").set("head_dim", d);
  return s;
}

TEST(Selector, RanksByPriorityThenSpecificityThenName) {
  Registry r;
  r.add(make_kernel("ref", Priority::kReference));
  r.add(make_kernel("portable", Priority::kPortable));
  r.add(make_kernel("fast_b", Priority::kPerformant, {128}, {}, 1));
  r.add(make_kernel("fast_a", Priority::kPerformant, {128}, {}, 2));
  const Platform h = platform_for_target("sm_90a");
  EXPECT_EQ(r.select(sig_with_head_dim(128), h)->name, "fast_a");  // more specific
  EXPECT_EQ(r.select(sig_with_head_dim(64), h)->name, "portable");
}

TEST(Selector, FiltersByPlatformWithReasons) {
  Registry r;
  r.add(make_kernel("ref", Priority::kReference));
  r.add(make_kernel("hopper", Priority::kSpecialized, {}, hopper_only()));
  Requirements amd;
  amd.vendor = Vendor::kAmd;
  r.add(make_kernel("mi", Priority::kSpecialized, {}, amd));
  EXPECT_EQ(r.select(sig_with_head_dim(128), platform_for_target("sm_90a"))->name, "hopper");
  EXPECT_EQ(r.select(sig_with_head_dim(128), platform_for_target("sm_80"))->name, "ref");
  EXPECT_EQ(r.select(sig_with_head_dim(128), platform_for_target("gfx942"))->name, "mi");

  const Explanation on_sm90 = r.explain(sig_with_head_dim(128), platform_for_target("sm_90"));
  ASSERT_EQ(on_sm90.selected, std::optional<std::string>("ref"));
  bool saw_feature_reason = false, saw_vendor_reason = false;
  for (const auto& c : on_sm90.candidates) {
    if (c.kernel == "hopper") saw_feature_reason = c.reason == "platform: needs feature mma:wgmma, which sm_90 lacks";
    if (c.kernel == "mi") saw_vendor_reason = c.reason.find("needs a device of vendor amd") != std::string::npos;
  }
  EXPECT_TRUE(saw_feature_reason) << on_sm90.to_text();
  EXPECT_TRUE(saw_vendor_reason) << on_sm90.to_text();
  const Explanation on_sm100 = r.explain(sig_with_head_dim(128), platform_for_target("sm_100a"));
  EXPECT_NE(on_sm100.to_text().find("needs arch version <= 90; sm_100a is 100"), std::string::npos) << on_sm100.to_text();
}

TEST(Selector, NoKernelErrorCarriesTheExplanation) {
  Registry r;
  r.add(make_kernel("only64", Priority::kPortable, {64}));
  try {
    r.select(sig_with_head_dim(96), platform_for_target("sm_90a"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoKernel);
    EXPECT_NE(std::string(e.what()).find("only64"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("head_dim 96 unsupported"), std::string::npos) << e.what();
  }
  Registry empty;
  EXPECT_NE(empty.explain(sig_with_head_dim(64), platform_for_target("sm_90a")).to_text().find("no kernel of this operator"),
            std::string::npos);
}

TEST(Selector, ExplainJsonHasEveryCandidate) {
  Registry r;
  r.add(make_kernel("a", Priority::kReference));
  r.add(make_kernel("b", Priority::kPortable, {64}));
  const std::string j = r.explain(sig_with_head_dim(128), platform_for_target("sm_90a")).to_json();
  EXPECT_NE(j.find("\"kernel\": \"a\""), std::string::npos);
  EXPECT_NE(j.find("\"kernel\": \"b\""), std::string::npos);
  EXPECT_NE(j.find("head_dim 128 unsupported"), std::string::npos);
}

TEST(Selector, OverrideByApiAndEnvironment) {
  Registry r;
  r.add(make_kernel("ref", Priority::kReference));
  r.add(make_kernel("fast", Priority::kPerformant, {128}));
  const Platform h = platform_for_target("sm_90a");
  EXPECT_EQ(r.select(sig_with_head_dim(128), h)->name, "fast");
  r.set_override(kPrefill, "ref");
  EXPECT_EQ(r.select(sig_with_head_dim(128), h)->name, "ref");
  r.set_override(kPrefill, "fast");
  try {
    r.select(sig_with_head_dim(64), h);  // the override cannot run head_dim 64
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoKernel);
    EXPECT_NE(std::string(e.what()).find("override 'fast' cannot run this call: signature: head_dim 64 unsupported"), std::string::npos)
        << e.what();
  }
  r.set_override(kPrefill, "");
  EXPECT_EQ(r.select(sig_with_head_dim(64), h)->name, "ref");
  // A name that names no kernel of the operator is refused when it is set, listing the kernels.
  try {
    r.set_override(kPrefill, "nonexistent");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("no kernel named 'nonexistent' (registered: ref, fast)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(r.select(sig_with_head_dim(64), h)->name, "ref");

  ::setenv("KILN_OVERRIDE_ATTENTION_PREFILL", "ref", 1);
  EXPECT_EQ(r.select(sig_with_head_dim(128), h)->name, "ref");
  ::setenv("KILN_OVERRIDE_ATTENTION_PREFILL", "nonexistent", 1);
  try {
    r.select(sig_with_head_dim(128), h);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("override 'nonexistent' names no mha_prefill kernel"), std::string::npos) << e.what();
  }
  ::unsetenv("KILN_OVERRIDE_ATTENTION_PREFILL");
  EXPECT_EQ(r.select(sig_with_head_dim(128), h)->name, "fast");
}

TEST(Selector, EqualPriorityConflictIsReported) {
  Registry r;
  r.add(make_kernel("twin_a", Priority::kPerformant));
  r.add(make_kernel("twin_b", Priority::kPerformant));
  const Explanation ex = r.explain(sig_with_head_dim(128), platform_for_target("sm_90a"));
  EXPECT_EQ(ex.selected, std::optional<std::string>("twin_a"));
  ASSERT_EQ(ex.warnings.size(), 1u);
  EXPECT_NE(ex.warnings[0].find("equal-priority conflict: twin_a and twin_b"), std::string::npos);
}

TEST(Selector, DuplicateAndIncompleteRegistrationsAreRefused) {
  Registry r;
  r.add(make_kernel("k", Priority::kReference));
  EXPECT_THROW(r.add(make_kernel("k", Priority::kPortable)), Error);
  KernelSpec no_accepts = make_kernel("n", Priority::kReference);
  no_accepts.accepts = nullptr;
  EXPECT_THROW(r.add(no_accepts), Error);
  KernelSpec no_source = make_kernel("s", Priority::kReference);
  no_source.source.clear();
  EXPECT_THROW(r.add(no_source), Error);
}

TEST(Selector, DecisionCacheIsInvalidatedByRegistration) {
  Registry r;
  r.add(make_kernel("ref", Priority::kReference));
  const Platform h = platform_for_target("sm_90a");
  EXPECT_EQ(r.select(sig_with_head_dim(128), h)->name, "ref");
  r.add(make_kernel("better", Priority::kPortable));
  EXPECT_EQ(r.select(sig_with_head_dim(128), h)->name, "better");
}

TEST(Selector, ConcurrentRegistrationAndSelection) {
  Registry r;
  r.add(make_kernel("ref", Priority::kReference));
  const Platform h = platform_for_target("sm_90a");
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) r.add(make_kernel("k" + std::to_string(t) + "_" + std::to_string(i), Priority::kPortable, {1000 + i}));
    });
  }
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        const auto chosen = r.select(sig_with_head_dim(64 + (i % 3) * 32), h);
        if (chosen->name != "ref") ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(r.kernels().size(), 1u + 4 * 200);
  EXPECT_EQ(r.select(sig_with_head_dim(1199), h)->priority, Priority::kPortable);
}

// The tensor-core decode kernel's grid on an H200-sized part (132 SMs, 227 KB per block): batches
// that fill the SMs run unsplit 4-warp CTAs with no workspace; smaller ones 8-warp CTAs, one per
// SM, grid (SMs / Hkv ranges, Hkv), with a workspace of one ticket per (sequence, KV head) and a
// state per CTA; short contexts that leave no more ranges than sequences run unsplit 8-warp CTAs.
TEST(Selector, DecodeSplitGridFollowsTheBatch) {
  const auto spec = Registry::global().find("attention.decode.mma_split");
  ASSERT_TRUE(spec);
  ASSERT_TRUE(spec->workspace_bytes && spec->workspace_zeroed_bytes);
  Platform h200;
  h200.vendor = Vendor::kNvidia;
  h200.multiprocessor_count = 132;
  h200.shared_memory_per_block = 227 * 1024;
  KilnDecodeParams p{};
  auto shape = [&](int batch, int context, int head_dim, int hkv = 8) {
    p = KilnDecodeParams{};
    p.batch = batch;
    p.q_len = 1;
    p.num_heads_kv = hkv;
    p.num_heads_q = 8 * hkv;
    p.head_dim = head_dim;
    p.page_size = 16;
    p.max_pages_per_seq = context / 16;
    return spec->launch_shape(&p, h200);
  };
  auto grid = [](const LaunchShape& s) { return std::array{s.grid[0], s.grid[1], s.grid[2], s.block[0], s.cluster[0]}; };
  const uint32_t warp_bytes_d128 = 2 * 16 * (2 * 136 + 2 * 136), warp_bytes_d64 = 2 * 16 * (2 * 96 + 2 * 72);
  // A piece state: 8 rows (group 8, q_len 1) of m, l and head_dim accumulators.
  auto states = [](size_t count, int head_dim) { return count * 8 * (head_dim + 2) * sizeof(float); };
  LaunchShape s = shape(8, 32768, 128);  // 8 sequences: 16 ranges x 8 KV heads
  EXPECT_EQ(grid(s), (std::array<uint32_t, 5>{16 * 8, 1, 1, 256, 0}));
  EXPECT_EQ(s.dynamic_shared_bytes, 8 * warp_bytes_d128 + 128);  // + the rings' 128-byte alignment
  EXPECT_EQ(spec->workspace_bytes(&p, h200), 256 + states(16 * 8, 128));
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, h200), 64u * 4);
  s = shape(64, 4096, 64);  // 512 pairs: unsplit, no workspace
  EXPECT_EQ(grid(s), (std::array<uint32_t, 5>{1, 8, 64, 128, 0}));
  EXPECT_EQ(s.dynamic_shared_bytes, 4 * warp_bytes_d64 + 128);
  EXPECT_EQ(spec->workspace_bytes(&p, h200), 0u);
  s = shape(1, 131072, 64);  // 16 ranges
  EXPECT_EQ(grid(s), (std::array<uint32_t, 5>{16 * 8, 1, 1, 256, 0}));
  EXPECT_EQ(spec->workspace_bytes(&p, h200), 256 + states(16 * 8, 64));
  s = shape(1, 131072, 64, 1);  // one KV head: a range per SM
  EXPECT_EQ(grid(s), (std::array<uint32_t, 5>{132, 1, 1, 256, 0}));
  s = shape(2, 384, 128);  // at least 256 tokens of the longest context per range: 3
  EXPECT_EQ(grid(s), (std::array<uint32_t, 5>{3 * 8, 1, 1, 256, 0}));
  EXPECT_EQ(spec->workspace_bytes(&p, h200), 256 + states(3 * 8, 128));
  s = shape(1, 320, 128);  // one range for one sequence: unsplit
  EXPECT_EQ(grid(s), (std::array<uint32_t, 5>{1, 8, 1, 256, 0}));
  EXPECT_EQ(spec->workspace_bytes(&p, h200), 0u);

  // An e4m3 cache at head_dim 64 runs two CTAs per SM: twice the ranges; at head_dim 128 one.
  const auto fp8 = Registry::global().find("attention.decode.mma_split_fp8");
  ASSERT_TRUE(fp8);
  shape(1, 131072, 64);
  EXPECT_EQ(grid(fp8->launch_shape(&p, h200)), (std::array<uint32_t, 5>{33 * 8, 1, 1, 256, 0}));
  EXPECT_EQ(fp8->workspace_bytes(&p, h200), 256 + states(33 * 8, 64));
  shape(8, 32768, 128);
  EXPECT_EQ(grid(fp8->launch_shape(&p, h200)), (std::array<uint32_t, 5>{16 * 8, 1, 1, 256, 0}));

  // head_dim 256 (Gemma): a 16-bit cache's rings take 33 KB a warp, so split CTAs hold 6 warps
  // (8 would need 264 KB) and unsplit ones 4; an e4m3 cache's 26 KB rings leave room for 8. On a
  // 99 KB part (sm_120) the CTAs shrink to what fits.
  const uint32_t warp_bytes_d256 = 2 * 16 * (2 * 264 + 2 * 264);
  s = shape(4, 32768, 256);
  EXPECT_EQ(grid(s), (std::array<uint32_t, 5>{16 * 8, 1, 1, 6 * 32, 0}));
  EXPECT_EQ(s.dynamic_shared_bytes, 6 * warp_bytes_d256 + 128);
  EXPECT_EQ(spec->workspace_bytes(&p, h200), 256 + states(16 * 8, 256));
  EXPECT_EQ(grid(fp8->launch_shape(&p, h200)), (std::array<uint32_t, 5>{16 * 8, 1, 1, 256, 0}));
  s = shape(64, 4096, 256);
  EXPECT_EQ(grid(s), (std::array<uint32_t, 5>{1, 8, 64, 128, 0}));
  EXPECT_EQ(s.dynamic_shared_bytes, 4 * warp_bytes_d256 + 128);
  Platform small = h200;
  small.shared_memory_per_block = 99 * 1024;
  shape(4, 32768, 256);
  EXPECT_EQ(spec->launch_shape(&p, small).block[0], 2u * 32);
  shape(4, 32768, 128);
  EXPECT_EQ(spec->launch_shape(&p, small).block[0], 5u * 32);
  EXPECT_LE(spec->launch_shape(&p, small).dynamic_shared_bytes + 4096, small.shared_memory_per_block);
}

// The split decode kernels need mma.sync, ldmatrix and cp.async (sm_80), and for an e4m3 cache
// the cvt to f16 pairs (sm_89); on a 99 KB part (sm_86) their CTAs hold the warps that fit.
TEST(Selector, DecodeTensorCoresFromSm80) {
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a"}) {
    EXPECT_EQ(Registry::global().select(test::decode_signature("bf16", "bf16", 128, 8), platform_for_target(arch))->name,
              "attention.decode.mma_split")
        << arch;
  }
  const Signature fp8 = test::decode_signature("bf16", "e4m3", 64, 8);
  EXPECT_EQ(Registry::global().select(fp8, platform_for_target("sm_89"))->name, "attention.decode.mma_split_fp8");
  for (const char* arch : {"sm_80", "sm_86"}) {
    const Platform p = platform_for_target(arch);
    EXPECT_EQ(Registry::global().select(fp8, p)->name, "attention.decode.reference") << arch;
    EXPECT_NE(Registry::global().explain(fp8, p).to_text().find("needs arch version >= 89"), std::string::npos) << arch;
  }
  const auto spec = Registry::global().find("attention.decode.mma_split");
  const Platform sm86 = platform_for_target("sm_86");
  KilnDecodeParams p{};
  p.batch = 1, p.q_len = 1, p.num_heads_kv = 8, p.num_heads_q = 64, p.head_dim = 128, p.page_size = 16, p.max_pages_per_seq = 2048;
  const LaunchShape shape = spec->launch_shape(&p, sm86);
  EXPECT_GT(shape.grid[0], 1u) << "split";
  EXPECT_LE(shape.dynamic_shared_bytes, sm86.shared_memory_per_block);
}

// Decode at head_dim 256 runs the tensor-core split kernels on sm_90a, up to 16 query rows a KV
// head with a 16-bit cache (the paged prefill kernel takes more) and 32 with an e4m3 one.
TEST(Selector, DecodeHeadDim256OnTensorCores) {
  const Platform sm90a = platform_for_target("sm_90a");
  EXPECT_EQ(Registry::global().select(test::decode_signature("bf16", "bf16", 256, 2, 16, 8), sm90a)->name, "attention.decode.mma_split");
  EXPECT_EQ(Registry::global().select(test::decode_signature("f16", "e4m3", 256, 8, 16, 4), sm90a)->name, "attention.decode.mma_split_fp8");
  const Signature rows32 = test::decode_signature("bf16", "bf16", 256, 2, 16, 16);
  EXPECT_EQ(Registry::global().select(rows32, sm90a)->name, "attention.decode.prefill_mma");
  EXPECT_NE(Registry::global().explain(rows32, sm90a).to_text().find("q_len x group = 32 unsupported at head_dim 256 (at most 16)"),
            std::string::npos);
}

// Speculative verification over a GQA group stays on the split kernels up to 32 query rows a KV
// head with a 16-bit cache and 64 with an e4m3 one (16 and 32 at head_dim 256); their CTAs then
// have a multiple of the row tiles' count of warps, and rings that fit the shared memory of a
// 99 KB part (sm_89).
TEST(Selector, DecodeSpeculativeRowsOnTensorCores) {
  const Platform sm90a = platform_for_target("sm_90a");
  for (int64_t d : {64, 128}) {
    EXPECT_EQ(Registry::global().select(test::decode_signature("bf16", "bf16", d, 8, 16, 4), sm90a)->name, "attention.decode.mma_split")
        << d;
    const Signature rows40 = test::decode_signature("bf16", "bf16", d, 8, 16, 5);
    EXPECT_EQ(Registry::global().select(rows40, sm90a)->name, "attention.decode.prefill_mma") << d;
    EXPECT_NE(Registry::global().explain(rows40, sm90a).to_text().find("q_len x group = 40 unsupported at head_dim " + std::to_string(d)),
              std::string::npos);
    EXPECT_EQ(Registry::global().select(test::decode_signature("bf16", "e4m3", d, 8, 16, 8), sm90a)->name, "attention.decode.mma_split_fp8")
        << d;
    EXPECT_EQ(Registry::global().select(test::decode_signature("bf16", "e4m3", d, 8, 16, 9), sm90a)->name,
              "attention.decode.prefill_mma_fp8")
        << d;
  }
  for (const bool fp8 : {false, true}) {
    const auto spec = Registry::global().find(fp8 ? "attention.decode.mma_split_fp8" : "attention.decode.mma_split");
    for (const char* arch : {"sm_89", "sm_90a"}) {
      const Platform platform = platform_for_target(arch);
      for (int head_dim : {64, 128, 256}) {
        for (int q_len : {1, 2, 3, 4, 8}) {
          for (int batch : {1, 64}) {
            const int64_t rows = int64_t{q_len} * 8;
            if (rows > (head_dim == 256 ? 16 : 32) * (fp8 ? 2 : 1)) continue;
            KilnDecodeParams p{};
            p.batch = batch, p.q_len = q_len, p.num_heads_kv = 8, p.num_heads_q = 64, p.head_dim = head_dim;
            p.page_size = 16, p.max_pages_per_seq = 512;
            const LaunchShape shape = spec->launch_shape(&p, platform);
            const uint32_t warps = shape.block[0] / 32, row_tiles = static_cast<uint32_t>((rows + 15) / 16);
            const std::string what = spec->name + " " + arch + " d" + std::to_string(head_dim) + " q_len " + std::to_string(q_len) + " B" +
                                     std::to_string(batch);
            EXPECT_GE(warps, row_tiles) << what;
            EXPECT_EQ(warps % row_tiles, 0u) << what;
            EXPECT_LE(shape.dynamic_shared_bytes, platform.shared_memory_per_block) << what;
          }
        }
      }
    }
  }
}

// MoE on sm_90a: the streaming kernel up to 256 experts (its routing keeps 8 logits per lane),
// the reference beyond, with the reason; its workspace grows with T * k * (H + I).
TEST(Selector, MoeStreamUpTo256Experts) {
  const Platform sm90 = platform_for_target("sm_90a");
  EXPECT_EQ(Registry::global()
                .select(test::moe_signature("mxfp4", 2880, 2880, 128, 4, "f32", "swiglu_clamped", "interleaved", "f32"), sm90)
                ->name,
            "moe.apply.stream");
  const Signature many = test::moe_signature("bf16", 256, 128, 300, 4, "f32", "silu_glu", "concat", "none");
  EXPECT_EQ(Registry::global().select(many, sm90)->name, "moe.apply.reference");
  EXPECT_NE(Registry::global().explain(many, sm90).to_text().find("experts 300 unsupported (at most 256)"), std::string::npos);
  const auto spec = Registry::global().find("moe.apply.stream");
  KilnMoeParams p{};
  p.num_tokens = 8192, p.top_k = 4, p.num_experts = 128, p.hidden = 2880, p.intermediate = 2880;
  const size_t bytes = spec->workspace_bytes(&p, sm90);
  EXPECT_GE(bytes, size_t{8192} * 4 * (2880 + 2880) * 4);
  // act and y of every pair, plus x's reordered copy (MXFP4) and the small tables.
  EXPECT_LT(bytes, size_t{8192} * 4 * (2880 + 2880) * 4 + size_t{8192} * 2880 * 2 + (1 << 20));
  // Only the counters are cleared before each launch, not the 755 MB.
  ASSERT_TRUE(spec->workspace_zeroed_bytes);
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, sm90), size_t{256 + 2 * 512});
  // Routed locally (at most 16 tokens, streaming phases), nothing is: no memset before the launch.
  p.num_tokens = 16;
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, platform_for_target("sm_90")), 0u);
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, sm90), size_t{256 + 2 * 512});  // bf16 on the grouped GEMMs
  const unsigned char scale = 127;
  p.w13_scale = &scale;  // MXFP4: x fits beside the rings
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, sm90), 0u);
  p.num_tokens = 17;
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, sm90), size_t{256 + 2 * 512});
}

// Decode on AMD: a batch whose (sequence, KV head) pairs leave CUs idle is split into ranges,
// two workgroups a CU, at least 256 keys of the longest context each; the ranges' states go to
// the workspace, whose tickets alone are cleared. Pairs that fill the CUs run unsplit.
TEST(Selector, AmdDecodeSplitsSmallBatches) {
  const auto spec = Registry::global().find("attention.decode.mfma");
  ASSERT_TRUE(spec && spec->workspace_bytes && spec->workspace_zeroed_bytes);
  Platform mi300x = platform_for_target("gfx942");
  mi300x.multiprocessor_count = 304;
  KilnDecodeParams p{};
  p.batch = 1, p.q_len = 1, p.num_heads_q = 64, p.num_heads_kv = 8, p.head_dim = 64, p.page_size = 16, p.max_pages_per_seq = 8192;
  auto grid = [&]() {
    const LaunchShape s = spec->launch_shape(&p, mi300x);
    return std::array<uint32_t, 4>{s.grid[0], s.grid[1], s.grid[2], s.block[0]};
  };
  EXPECT_EQ(grid(), (std::array<uint32_t, 4>{76, 8, 1, 256}));  // 2 x 304 / 8 pairs
  EXPECT_EQ(spec->workspace_bytes(&p, mi300x), static_cast<size_t>(kiln_decode_workspace_bytes(1, 8, 76, 8, 64)));
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, mi300x), size_t{256});
  p.max_pages_per_seq = 40;  // 640 keys: two ranges of at least 256
  EXPECT_EQ(grid(), (std::array<uint32_t, 4>{2, 8, 1, 256}));
  p.max_pages_per_seq = 8;  // 128 keys: unsplit
  EXPECT_EQ(grid(), (std::array<uint32_t, 4>{1, 8, 1, 256}));
  EXPECT_EQ(spec->workspace_bytes(&p, mi300x), 0u);
  p.batch = 64, p.max_pages_per_seq = 256;  // 512 pairs fill 304 CUs
  EXPECT_EQ(grid(), (std::array<uint32_t, 4>{1, 8, 64, 256}));
  EXPECT_EQ(spec->workspace_bytes(&p, mi300x), 0u);
}

// MoE on AMD: the matrix-core kernel up to 256 experts (one wavefront prefixes the counts, four a
// lane), the reference beyond; one cooperative workgroup of 8 wavefronts per CU over moe_apply_stream's
// workspace, of which only the counters (the barrier's arrivals, counts, fill) are cleared.
// Prepared MXFP4 weights: the stream kernel on NVIDIA (sm_80 up), the reference on AMD, whose
// matrix-core kernel reads the standard layout only.
TEST(Selector, PreparedMxfp4) {
  const Signature sig = test::moe_signature("mxfp4_prepared", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "bf16");
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a"})
    EXPECT_EQ(Registry::global().select(sig, platform_for_target(arch))->name, "moe.apply.stream") << arch;
  const Platform amd = platform_for_target("gfx942");
  EXPECT_EQ(Registry::global().select(sig, amd)->name, "moe.apply.reference.amd");
  EXPECT_NE(Registry::global().explain(sig, amd).to_text().find("prepared MXFP4 weights unsupported"), std::string::npos);
  const Signature unknown = test::moe_signature("mxfp8", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "bf16");
  EXPECT_NE(Registry::global().explain(unknown, platform_for_target("sm_90a")).to_text().find("supported: bf16, mxfp4, mxfp4_prepared"),
            std::string::npos);
}

TEST(Selector, MoeMfmaOnAmdUpTo256Experts) {
  for (const char* arch : {"gfx90a", "gfx942", "gfx950"}) {
    const Platform amd = platform_for_target(arch);
    EXPECT_EQ(Registry::global()
                  .select(test::moe_signature("mxfp4", 2880, 2880, 128, 4, "f32", "swiglu_clamped", "interleaved", "f32"), amd)
                  ->name,
              "moe.apply.mfma")
        << arch;
    const Signature many = test::moe_signature("bf16", 256, 128, 300, 4, "f32", "silu_glu", "concat", "none");
    EXPECT_EQ(Registry::global().select(many, amd)->name, "moe.apply.reference.amd") << arch;
    EXPECT_NE(Registry::global().explain(many, amd).to_text().find("experts 300 unsupported (at most 256)"), std::string::npos);
  }
  EXPECT_EQ(Registry::global().find("moe.apply.mfma")->backend, Backend::kHip);
  const auto spec = Registry::global().find("moe.apply.mfma");
  Platform mi300x = platform_for_target("gfx942");
  mi300x.multiprocessor_count = 304;
  KilnMoeParams p{};
  p.num_tokens = 1, p.top_k = 4, p.num_experts = 128, p.hidden = 2880, p.intermediate = 2880;
  const LaunchShape shape = spec->launch_shape(&p, mi300x);
  EXPECT_EQ((std::array<uint32_t, 4>{shape.grid[0], shape.grid[1], shape.block[0], shape.dynamic_shared_bytes}),
            (std::array<uint32_t, 4>{304, 1, 512, 0}));
  EXPECT_TRUE(shape.cooperative);
  const KilnMoeStreamWorkspace layout = kiln_moe_stream_workspace(1, 4, 128, 2880, 2880);
  EXPECT_EQ(spec->workspace_bytes(&p, mi300x), static_cast<size_t>(layout.total));
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, mi300x), size_t{256 + 2 * 512});
  p.num_tokens = 8192;
  EXPECT_GE(spec->workspace_bytes(&p, mi300x), size_t{8192} * 4 * (2880 + 2880) * 4);
  EXPECT_EQ(spec->workspace_zeroed_bytes(&p, mi300x), size_t{256 + 2 * 512});
}

// Prefill parameters whose q, k and v point at stand-ins for device addresses (only compared).
KilnPrefillParams prefill_params_at_stand_in_addresses() {
  const uintptr_t device = 0x7f0000000000;
  KilnPrefillParams p{};
  p.q = reinterpret_cast<const void*>(device);
  p.k = reinterpret_cast<const void*>(device + 0x100000);
  p.v = reinterpret_cast<const void*>(device + 0x200000);
  return p;
}

// The grouped-GEMM phases read their operands through TMA tensor maps that kiln encodes at launch:
// x_grouped (after bf16 y in y's region) and act in grouped order, the weights per expert. Weights
// or x that a TMA copy or 16-byte load cannot take leave the call on the streaming phases.
// The window prefill kernel's q, k and v maps: (head_dim, heads, rows) with the tensors' strides,
// boxes of 16 query rows and of one 48-key block; with no keys at all, k and v map q's first row.
TEST(Selector, PrefillWindowTensorMaps) {
  const auto spec = Registry::global().find("attention.prefill.wgmma_window");
  ASSERT_TRUE(spec && spec->tensor_maps);
  KilnPrefillParams p = prefill_params_at_stand_in_addresses();
  p.num_heads_q = 64, p.num_heads_kv = 8, p.head_dim = 64, p.total_q = 700, p.total_k = 900;
  p.q_row_stride = 64 * 64, p.q_head_stride = 64;
  p.k_row_stride = 3 * 8 * 64, p.k_head_stride = 64;  // k and v as views of a packed kv tensor
  p.v_row_stride = 3 * 8 * 64, p.v_head_stride = 64;
  auto describe = [](const TensorMapRequest& m) {
    return std::array<uint64_t, 9>{m.rank, m.dims[0], m.dims[1], m.dims[2], m.strides[0], m.strides[1], m.box[0], m.box[1], m.box[2]};
  };
  std::vector<TensorMapRequest> maps = spec->tensor_maps(&p, platform_for_target("sm_90a"));
  ASSERT_EQ(maps.size(), size_t{kPrefillTensorMaps});
  EXPECT_EQ(describe(maps[kPrefillMapQ]), (std::array<uint64_t, 9>{3, 64, 64, 700, 128, 64 * 64 * 2, 64, 1, 16}));
  EXPECT_EQ(describe(maps[kPrefillMapK]), (std::array<uint64_t, 9>{3, 64, 8, 900, 128, 3 * 8 * 64 * 2, 64, 1, 48}));
  EXPECT_EQ(describe(maps[kPrefillMapV]), (std::array<uint64_t, 9>{3, 64, 8, 900, 128, 3 * 8 * 64 * 2, 64, 1, 48}));
  EXPECT_EQ(maps[kPrefillMapK].base, p.k);
  EXPECT_EQ(maps[kPrefillMapV].base, p.v);
  for (size_t i = 0; i < maps.size(); ++i) {
    EXPECT_EQ(maps[i].params_offset, offsetof(KilnPrefillParams, tensor_maps) + i * sizeof(KilnTensorMap));
    EXPECT_EQ(maps[i].params_offset % 64, 0u);
  }
  p.total_k = 0;
  p.k = p.v = nullptr;
  maps = spec->tensor_maps(&p, platform_for_target("sm_90a"));
  ASSERT_EQ(maps.size(), size_t{kPrefillTensorMaps});
  EXPECT_EQ(maps[kPrefillMapK].base, p.q);
  EXPECT_EQ(describe(maps[kPrefillMapV]), (std::array<uint64_t, 9>{3, 64, 1, 1, 128, 64 * 64 * 2, 64, 1, 48}));
}

// The window strip kernel: q boxes of 8 heads x 8 positions, k and v boxes of one 8-key block;
// strips enough for two CTAs an SM, none shorter than 8 steps of 8 positions.
TEST(Selector, PrefillWindowStripMapsAndStrips) {
  const auto spec = Registry::global().find("attention.prefill.window_strip");
  ASSERT_TRUE(spec && spec->tensor_maps);
  Platform sm90a = platform_for_target("sm_90a");
  sm90a.multiprocessor_count = 132;
  KilnPrefillParams p = prefill_params_at_stand_in_addresses();
  p.batch = 1, p.max_seqlen_q = 4096, p.num_heads_q = 64, p.num_heads_kv = 8, p.head_dim = 64, p.total_q = 4096, p.total_k = 4096;
  p.q_row_stride = 64 * 64, p.q_head_stride = 64;
  p.k_row_stride = p.v_row_stride = 8 * 64, p.k_head_stride = p.v_head_stride = 64;
  const std::vector<TensorMapRequest> maps = spec->tensor_maps(&p, sm90a);
  ASSERT_EQ(maps.size(), size_t{kPrefillTensorMaps});
  EXPECT_EQ((std::array<uint32_t, 3>{maps[kPrefillMapQ].box[0], maps[kPrefillMapQ].box[1], maps[kPrefillMapQ].box[2]}),
            (std::array<uint32_t, 3>{64, 8, 8}));
  EXPECT_EQ((std::array<uint32_t, 3>{maps[kPrefillMapK].box[0], maps[kPrefillMapK].box[1], maps[kPrefillMapK].box[2]}),
            (std::array<uint32_t, 3>{64, 1, 8}));
  LaunchShape shape = spec->launch_shape(&p, sm90a);
  EXPECT_EQ((std::array<uint32_t, 3>{shape.grid[0], shape.grid[1], shape.grid[2]}), (std::array<uint32_t, 3>{33, 8, 1}));  // 264 / 8
  EXPECT_EQ(shape.block[0], 256u);
  p.max_seqlen_q = 100;  // 13 steps: one strip
  EXPECT_EQ(spec->launch_shape(&p, sm90a).grid[0], 1u);
  p.batch = 64, p.max_seqlen_q = 4096;  // 512 (sequence, KV head) pairs: a strip each
  EXPECT_EQ(spec->launch_shape(&p, sm90a).grid[0], 1u);
}

// GPT-OSS's sliding layers (group 8, head_dim 64, windows up to 128 keys back) take the window
// strip kernel on sm_90a; other groups, head dims, longer windows and soft caps do not.
TEST(Selector, ShortWindowsAtGroup8TakeTheWindowStripKernel) {
  const Platform sm90a = platform_for_target("sm_90a");
  Signature sig = test::prefill_signature("bf16", 64, 8, true);
  sig.set_flag("window", true).set_flag("sinks", true).set_flag("short_window", true);
  EXPECT_EQ(Registry::global().select(sig, sm90a)->name, "attention.prefill.window_strip");
  EXPECT_EQ(Registry::global().select(sig, platform_for_target("sm_80"))->name, "attention.prefill.mma_window");
  const auto strip = Registry::global().find("attention.prefill.window_strip");
  Signature other = sig;
  other.set("group", int64_t{4});
  EXPECT_TRUE(strip->accepts(other).has_value());
  other = sig;
  other.set("head_dim", int64_t{128});
  EXPECT_TRUE(strip->accepts(other).has_value());
  other = test::prefill_signature("bf16", 64, 8, true);
  other.set_flag("window", true);  // a window longer than 128 keys
  EXPECT_TRUE(strip->accepts(other).has_value());
  EXPECT_EQ(Registry::global().select(other, sm90a)->name, "attention.prefill.wgmma_window");
  other = sig;
  other.set_flag("softcap", true);
  EXPECT_TRUE(strip->accepts(other).has_value());
}

// The same over paged caches of the queries' type, pages of every size (TMA boxes from 8 rows,
// else gathered), and over e4m3 caches (gathered); it instantiates the paged form.
TEST(Selector, ShortExtendWindowsAtGroup8TakeThePagedWindowStripKernel) {
  const Platform sm90a = platform_for_target("sm_90a");
  Signature sig = test::extend_signature("bf16", "bf16", 64, 8, 16);
  sig.set_flag("window", true).set_flag("sinks", true).set_flag("short_window", true);
  EXPECT_EQ(Registry::global().select(sig, sm90a)->name, "attention.extend.window_strip");
  const auto strip = Registry::global().find("attention.extend.window_strip");
  ASSERT_TRUE(strip);
  EXPECT_EQ(strip->specialize(sig, sm90a).name_expression, "kiln::prefill_window_strip<kiln::bf16, true>");
  EXPECT_EQ(Registry::global().find("attention.prefill.window_strip")->specialize(sig, sm90a).name_expression,
            "kiln::prefill_window_strip<kiln::bf16>");
  Signature other = sig;
  other.set("page_size", int64_t{1});
  EXPECT_EQ(Registry::global().select(other, sm90a)->name, "attention.extend.window_strip");
  other = sig;
  other.set("kv_dtype", "e4m3");
  EXPECT_EQ(Registry::global().select(other, sm90a)->name, "attention.extend.window_strip");
  EXPECT_EQ(strip->specialize(other, sm90a).name_expression, "kiln::prefill_window_strip<kiln::bf16, true, kiln::e4m3>");
  other.set("kv_dtype", "f16");
  EXPECT_TRUE(strip->accepts(other).has_value()) << "a 16-bit cache of another type than the queries'";
  other = test::extend_signature("bf16", "bf16", 64, 8, 16);
  other.set_flag("window", true).set_flag("sinks", true);  // a longer window
  EXPECT_TRUE(strip->accepts(other).has_value());
  EXPECT_EQ(Registry::global().select(other, sm90a)->name, "attention.extend.wgmma_window");
}

// The warp-specialized kernel's key blocks: 176 keys at head_dim 128 for contiguous keys (prefill),
// 128 at head_dim 64 and for paged keys (extend); shared memory and the k and v boxes follow.
TEST(Selector, PrefillWarpSpecializedKeyBlocks) {
  const auto prefill = Registry::global().find("attention.prefill.wgmma_ws");
  const auto extend = Registry::global().find("attention.extend.wgmma_ws");
  ASSERT_TRUE(prefill && extend);
  const Platform sm90a = platform_for_target("sm_90a");
  KilnPrefillParams p = prefill_params_at_stand_in_addresses();
  p.batch = 1, p.max_seqlen_q = 4096, p.num_heads_q = 32, p.num_heads_kv = 8, p.head_dim = 128, p.total_q = 4096, p.total_k = 4096;
  p.q_row_stride = 32 * 128, p.q_head_stride = 128;
  p.k_row_stride = p.v_row_stride = 8 * 128, p.k_head_stride = p.v_head_stride = 128;
  const auto barriers = [](int stages) { return 8 * (2 + 4 * stages); };
  // 128 query rows, two stages of 176-key K and V tiles, 1 KB of alignment, the mbarriers.
  EXPECT_EQ(prefill->launch_shape(&p, sm90a).dynamic_shared_bytes, uint32_t((128 + 2 * 2 * 176) * 128 * 2 + 1024 + barriers(2)));
  EXPECT_EQ(prefill->tensor_maps(&p, sm90a)[kPrefillMapK].box[2], 176u);
  EXPECT_EQ(prefill->tensor_maps(&p, sm90a)[kPrefillMapV].box[2], 176u);
  p.head_dim = 64, p.num_heads_q = 64;
  p.q_row_stride = 64 * 64, p.q_head_stride = 64, p.k_row_stride = p.v_row_stride = 8 * 64, p.k_head_stride = p.v_head_stride = 64;
  EXPECT_EQ(prefill->launch_shape(&p, sm90a).dynamic_shared_bytes, uint32_t((192 + 2 * 4 * 128) * 64 * 2 + 1024 + barriers(4)));
  EXPECT_EQ(prefill->tensor_maps(&p, sm90a)[kPrefillMapK].box[2], 128u);
  // Paged keys at head_dim 128: 128-key blocks in three stages, a page per box.
  p.head_dim = 128, p.num_heads_q = 32, p.page_size = 64;
  p.q_row_stride = 32 * 128, p.q_head_stride = 128, p.k_row_stride = p.v_row_stride = 8 * 128, p.k_head_stride = p.v_head_stride = 128;
  EXPECT_EQ(extend->launch_shape(&p, sm90a).dynamic_shared_bytes, uint32_t((128 + 2 * 3 * 128) * 128 * 2 + 1024 + barriers(3)));
  EXPECT_EQ(extend->tensor_maps(&p, sm90a)[kPrefillMapK].box[2], 64u);
}

// The window kernel over paged caches: causal windows on pages of 8 rows and up on sm_90a (smaller
// pages stay with the mma.sync kernel), boxes of 16 rows or one page of 8, and a grid that covers
// 15 rows more, since its blocks move back to start keys on multiples of 16.
TEST(Selector, ExtendWindowsOnWholePageBoxes) {
  Signature windowed({kFamilyAttention, kModeExtend});
  windowed.set("dtype", "bf16").set("kv_dtype", "bf16").set("head_dim", int64_t{64}).set("group", int64_t{8});
  windowed.set_flag("causal", true).set_flag("window", true).set_flag("sinks", true).set_flag("softcap", false).set_flag("lse", false);
  const Platform sm90a = platform_for_target("sm_90a");
  for (int64_t page : {8, 16, 256}) {
    windowed.set("page_size", page);
    EXPECT_EQ(Registry::global().select(windowed, sm90a)->name, "attention.extend.wgmma_window") << page;
  }
  windowed.set("page_size", int64_t{4});
  EXPECT_EQ(Registry::global().select(windowed, sm90a)->name, "attention.extend.mma_window");
  windowed.set("page_size", int64_t{64});
  EXPECT_EQ(Registry::global().select(windowed, platform_for_target("sm_80"))->name, "attention.extend.mma_window");

  const auto spec = Registry::global().find("attention.extend.wgmma_window");
  ASSERT_TRUE(spec && spec->tensor_maps);
  KilnPrefillParams p = prefill_params_at_stand_in_addresses();
  p.batch = 2, p.max_seqlen_q = 100, p.num_heads_q = 64, p.num_heads_kv = 8, p.head_dim = 64, p.total_q = 150, p.total_k = 40 * 64;
  p.q_row_stride = 64 * 64, p.q_head_stride = 64;
  p.k_row_stride = p.v_row_stride = 8 * 64, p.k_head_stride = p.v_head_stride = 64;
  p.page_size = 64;
  const LaunchShape shape = spec->launch_shape(&p, sm90a);
  EXPECT_EQ(shape.grid[0], (100u + 15 + 15) / 16);  // 16 positions of 4 heads a CTA
  EXPECT_EQ(shape.grid[1], 16u);
  EXPECT_EQ(shape.block[0], 128u);
  EXPECT_EQ(spec->tensor_maps(&p, sm90a)[kPrefillMapK].box[2], 16u);
  EXPECT_EQ(spec->tensor_maps(&p, sm90a)[kPrefillMapV].dims[2], 40u * 64);
  p.page_size = 8;
  EXPECT_EQ(spec->tensor_maps(&p, sm90a)[kPrefillMapV].box[2], 8u);
}

TEST(Selector, MoeGroupedGemmTensorMaps) {
  const auto spec = Registry::global().find("moe.apply.stream");
  ASSERT_TRUE(spec && spec->tensor_maps);
  const Platform sm90a = platform_for_target("sm_90a");
  const uintptr_t device = 0x7f0000000000;  // stands in for device addresses: only compared
  auto at = [&](uintptr_t offset) { return reinterpret_cast<void*>(device + offset); };
  KilnMoeParams p{};
  p.num_tokens = 100, p.top_k = 4, p.num_experts = 8, p.hidden = 256, p.intermediate = 192;
  p.x = p.w13 = p.w2 = p.workspace = at(0);
  p.x_row_stride = 256, p.w13_row_stride = 256, p.w13_expert_stride = 384 * 256, p.w2_row_stride = 192, p.w2_expert_stride = 256 * 192;
  const KilnMoeStreamWorkspace layout = kiln_moe_stream_workspace(100, 4, 8, 256, 192);
  const std::vector<TensorMapRequest> maps = spec->tensor_maps(&p, sm90a);
  ASSERT_EQ(maps.size(), size_t{kMoeTensorMaps});
  auto describe = [](const TensorMapRequest& m) {
    return std::array<uint64_t, 9>{m.rank, m.dims[0], m.dims[1], m.dims[2], m.strides[0], m.strides[1], m.box[0], m.box[1], m.box[2]};
  };
  EXPECT_EQ(describe(maps[kMoeMapXGrouped]), (std::array<uint64_t, 9>{2, 256, 400, 1, 512, 0, 64, 64, 1}));
  EXPECT_EQ(describe(maps[kMoeMapW13]), (std::array<uint64_t, 9>{3, 256, 384, 8, 512, 384 * 512, 64, 256, 1}));
  EXPECT_EQ(describe(maps[kMoeMapW13By32]), (std::array<uint64_t, 9>{3, 256, 384, 8, 512, 384 * 512, 64, 32, 1}));
  EXPECT_EQ(describe(maps[kMoeMapAct]), (std::array<uint64_t, 9>{2, 192, 400, 1, 384, 0, 64, 64, 1}));
  EXPECT_EQ(describe(maps[kMoeMapW2]), (std::array<uint64_t, 9>{3, 192, 256, 8, 384, 256 * 384, 64, 256, 1}));
  EXPECT_EQ(maps[kMoeMapXGrouped].base, at(layout.y + 2 * 400 * 256));
  EXPECT_EQ(maps[kMoeMapAct].base, at(layout.act));
  EXPECT_EQ(maps[kMoeMapW13].base, at(0));
  for (size_t i = 0; i < maps.size(); ++i) {
    EXPECT_EQ(maps[i].params_offset, offsetof(KilnMoeParams, tensor_maps) + i * sizeof(KilnTensorMap));
    EXPECT_EQ(maps[i].params_offset % 64, 0u);
    EXPECT_EQ(maps[i].strides[0] % 16, 0u);
  }
  // None on the streaming phases: a GPU without wgmma, a decode-sized call, MXFP4 weights, and
  // strides or addresses a TMA copy cannot take (these also keep the launch off the GEMM stages).
  EXPECT_TRUE(spec->tensor_maps(&p, platform_for_target("sm_90")).empty());
  p.num_tokens = 2;
  EXPECT_TRUE(spec->tensor_maps(&p, sm90a).empty());
  p.num_tokens = 100;
  const unsigned char scale = 127;
  p.w13_scale = &scale;
  EXPECT_TRUE(spec->tensor_maps(&p, sm90a).empty());
  p.w13_scale = nullptr;
  p.w2_row_stride = 196;
  EXPECT_TRUE(spec->tensor_maps(&p, sm90a).empty());
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, 0u);
  p.w2_row_stride = 192;
  p.x = at(2);
  EXPECT_TRUE(spec->tensor_maps(&p, sm90a).empty());
  p.x = at(0);
  EXPECT_EQ(spec->tensor_maps(&p, sm90a).size(), size_t{kMoeTensorMaps});
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, uint32_t{KILN_MOE_GEMM_SHARED_BYTES});
}

// Large-batch MoE signatures (MXFP4) compile the kernel's large-batch build; the others do not.
TEST(Selector, MoeLargeBatchBuild) {
  const auto spec = Registry::global().find("moe.apply.stream");
  Signature sig = test::moe_signature("mxfp4_prepared", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "bf16");
  const Platform sm90a = platform_for_target("sm_90a");
  EXPECT_TRUE(spec->specialize(sig, sm90a).options.empty());
  sig.set("large_batch", "1");
  EXPECT_EQ(spec->specialize(sig, sm90a).options, std::vector<std::string>{"-DKILN_MOE_LARGE_BATCH=1"});
}

// The MoE kernel's launch gives the grouped-GEMM phases their shared memory only where they run:
// sm_90a, bf16 weights, H and I in at least three 64-deep slices, at least 16 routed pairs.
TEST(Selector, MoeGroupedGemmPhasesOnlyWhereTheyRun) {
  const auto spec = Registry::global().find("moe.apply.stream");
  KilnMoeParams p{};
  p.num_tokens = 4, p.top_k = 4, p.num_experts = 128, p.hidden = 2880, p.intermediate = 2880;
  const Platform sm90a = platform_for_target("sm_90a");
  const uint32_t bf16_rings = 0, mxfp4_rings = kiln_moe_ring_bytes(0), mxfp4_gemm = kiln_moe_gemm_mxfp4_shared_bytes(0);
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, uint32_t{KILN_MOE_GEMM_SHARED_BYTES});
  EXPECT_EQ(spec->launch_shape(&p, platform_for_target("sm_90")).dynamic_shared_bytes, bf16_rings);
  EXPECT_EQ(spec->launch_shape(&p, platform_for_target("sm_100a")).dynamic_shared_bytes, bf16_rings);
  p.num_tokens = 3;  // 12 pairs
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, bf16_rings);
  p.num_tokens = 64, p.intermediate = 96;  // not whole 64-deep K slices
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, bf16_rings);
  p.intermediate = 64;  // one slice
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, uint32_t{KILN_MOE_GEMM_SHARED_BYTES});
  p.hidden = 2880 + 32;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, bf16_rings);
  p.hidden = 128;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, uint32_t{KILN_MOE_GEMM_SHARED_BYTES});
  p.hidden = 2880, p.intermediate = 2880;
  const unsigned char scale = 127;
  p.w13_scale = &scale;  // MXFP4 weights
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, mxfp4_rings);
  // Up to 16 tokens, x follows the rings (each CTA routes locally), where the GPU has the room.
  p.num_tokens = 16;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, mxfp4_rings + 16 * 2880 * 2);
  p.num_tokens = 17;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, mxfp4_rings);
  const Platform sm86 = platform_for_target("sm_86");  // 99 KB
  p.num_tokens = 1;
  EXPECT_EQ(spec->launch_shape(&p, sm86).dynamic_shared_bytes, mxfp4_rings + 2880 * 2);
  p.num_tokens = 4;
  EXPECT_EQ(spec->launch_shape(&p, sm86).dynamic_shared_bytes, mxfp4_rings);
  // MXFP4's grouped GEMMs from KILN_MOE_GEMM_MXFP4_MIN_PAIRS routed pairs (512 tokens at top-4),
  // with MXFP8 activations too.
  p.num_tokens = KILN_MOE_GEMM_MXFP4_MIN_PAIRS / 4;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, mxfp4_gemm);
  EXPECT_EQ(spec->launch_shape(&p, sm86).dynamic_shared_bytes, mxfp4_rings);
  p.activations_mxfp8 = 1;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, mxfp4_gemm);
  p.activations_mxfp8 = 0;
  p.num_tokens -= 1;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, mxfp4_rings);
  p.num_tokens += 1, p.top_k = 2;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, mxfp4_rings);
  // Large batches (experts averaging at least 96 routed pairs) run the build with 144-pair tiles,
  // boxes of 48 x rows, and the split-tile sums after the rings.
  p.top_k = 4, p.num_tokens = 96 * 128 / 4 - 1;
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, mxfp4_gemm);
  p.num_tokens += 1;
  const uint32_t large_rings = kiln_moe_ring_bytes(1), large_gemm = kiln_moe_gemm_mxfp4_shared_bytes(1);
  EXPECT_EQ(spec->launch_shape(&p, sm90a).dynamic_shared_bytes, large_gemm);
  EXPECT_EQ(spec->launch_shape(&p, sm86).dynamic_shared_bytes, large_rings);
  // The MXFP4 rings are smaller than the GEMMs' stages (the kernel tells them apart by size), and
  // the kernel's static shared memory fits beside either: 26 KB with bf16 weights (the expert
  // tables, the local routing lists and the mma.sync phases' partial sums), 30 KB with MXFP4, 14
  // KB in the large-batch build (whose partial sums follow the rings), the rings also in the 99 KB
  // of sm_86, sm_89 and sm_120.
  EXPECT_LT(mxfp4_rings, mxfp4_gemm);
  EXPECT_LT(large_rings, large_gemm);
  EXPECT_LE(uint32_t{KILN_MOE_GEMM_SHARED_BYTES} + 26 * 1024, sm90a.shared_memory_per_block);
  EXPECT_LE(mxfp4_gemm + 30 * 1024, sm90a.shared_memory_per_block);
  EXPECT_LE(large_gemm + 14 * 1024, sm90a.shared_memory_per_block);
  EXPECT_LE(mxfp4_rings + 30 * 1024, uint32_t{99 * 1024});
  EXPECT_LE(large_rings + 14 * 1024, uint32_t{99 * 1024});
}

// wgmma exists on sm_90a only: Hopper prefill and extend run the warp-specialized wgmma kernel
// (head_dim 256 too), every other NVIDIA arch the portable mma.sync one (head_dim 256 the
// reference).
TEST(Selector, PrefillWgmmaOnlyOnSm90a) {
  const Signature d128 = test::prefill_signature("bf16", 128, 8, true);
  EXPECT_EQ(Registry::global().select(d128, platform_for_target("sm_90a"))->name, "attention.prefill.wgmma_ws");
  for (const char* arch : {"sm_80", "sm_90", "sm_100a", "sm_120a"}) {
    const Platform p = platform_for_target(arch);
    EXPECT_EQ(Registry::global().select(d128, p)->name, "attention.prefill.mma") << arch;
    const std::string why = p.arch_version < 90 ? "needs arch version >= 90" : "mma:wgmma";
    EXPECT_NE(Registry::global().explain(d128, p).to_text().find(why), std::string::npos) << arch;
  }
  const Signature d256 = test::prefill_signature("f16", 256, 8, true);
  EXPECT_EQ(Registry::global().select(d256, platform_for_target("sm_90a"))->name, "attention.prefill.wgmma_ws");
  for (const char* arch : {"sm_80", "sm_86", "sm_100a", "sm_120a"}) {
    const Platform p = platform_for_target(arch);
    EXPECT_EQ(Registry::global().select(d256, p)->name, "attention.prefill.mma") << arch;
    EXPECT_EQ(Registry::global().select(test::extend_signature("bf16", "bf16", 256, 8), p)->name, "attention.extend.mma") << arch;
  }
  EXPECT_EQ(Registry::global().select(test::extend_signature("bf16", "bf16", 256, 8), platform_for_target("sm_90a"))->name,
            "attention.extend.wgmma_ws");
}

// Chunked prefill over an e4m3 cache runs the mma.sync kernels' e4m3 forms from sm_89 (their cvt
// to f16 pairs), windows the head-packing one (GPT-OSS's on Hopper the window strip kernel), and
// on Hopper at head_dim 64 and 128 the warp-specialized kernel's e4m3 form; before sm_89 the
// reference. Decode beyond the split kernel's 64 rows (32 at head_dim 256) takes
// the paged prefill kernel's e4m3 form.
TEST(Selector, E4m3CachesOnTensorCoresBeyondTheSplitDecode) {
  for (const char* arch : {"sm_89", "sm_90a", "sm_100a", "sm_120a"}) {
    const Platform p = platform_for_target(arch);
    for (int64_t d : {64, 128, 256}) {
      EXPECT_EQ(Registry::global().select(test::extend_signature("bf16", "e4m3", d, 8, 16), p)->name,
                std::string(arch) == "sm_90a" && d < 256 ? "attention.extend.wgmma_ws_fp8" : "attention.extend.mma_fp8")
          << arch << " " << d;
    }
    Signature windowed = test::extend_signature("f16", "e4m3", 64, 8, 16);
    windowed.set_flag("window", true).set_flag("sinks", true);
    EXPECT_EQ(Registry::global().select(windowed, p)->name, "attention.extend.mma_window_fp8") << arch;
    windowed.set_flag("short_window", true);  // GPT-OSS's window at group 8: the strip kernel on Hopper
    EXPECT_EQ(Registry::global().select(windowed, p)->name,
              std::string(arch) == "sm_90a" ? "attention.extend.window_strip" : "attention.extend.mma_window_fp8")
        << arch;
    EXPECT_EQ(Registry::global().select(test::decode_signature("bf16", "e4m3", 256, 8, 16, 5), p)->name, "attention.decode.prefill_mma_fp8")
        << arch;
  }
  for (const char* arch : {"sm_80", "sm_86"}) {
    const Platform p = platform_for_target(arch);
    const Signature sig = test::extend_signature("bf16", "e4m3", 128, 8);
    EXPECT_EQ(Registry::global().select(sig, p)->name, "attention.extend.reference") << arch;
    EXPECT_NE(Registry::global().explain(sig, p).to_text().find("needs arch version >= 89"), std::string::npos) << arch;
  }
  // The 16-bit forms turn an e4m3 cache away, and the e4m3 forms a 16-bit one, saying where it goes.
  const Platform sm90a = platform_for_target("sm_90a");
  const std::string why = Registry::global().explain(test::extend_signature("bf16", "e4m3", 128, 8), sm90a).to_text();
  EXPECT_NE(why.find("e4m3 cache runs on the _fp8 kernels"), std::string::npos) << why;
  EXPECT_EQ(Registry::global().select(test::extend_signature("bf16", "bf16", 128, 8), sm90a)->name, "attention.extend.wgmma_ws");
  EXPECT_TRUE(Registry::global().find("attention.extend.mma_fp8")->accepts(test::extend_signature("bf16", "bf16", 128, 8)).has_value());
}

// Sliding windows: the head-packing wgmma kernel on sm_90a, the head-packing mma.sync one on every
// other NVIDIA arch (the Hopper-only kernel is the more specific of the two).
TEST(Selector, PrefillWindowsPickTheHeadPackingKernels) {
  Signature windowed = test::prefill_signature("bf16", 64, 8, true);
  windowed.set_flag("window", true).set_flag("sinks", true);
  EXPECT_EQ(Registry::global().select(windowed, platform_for_target("sm_90a"))->name, "attention.prefill.wgmma_window");
  for (const char* arch : {"sm_80", "sm_90", "sm_100a"}) {
    EXPECT_EQ(Registry::global().select(windowed, platform_for_target(arch))->name, "attention.prefill.mma_window") << arch;
  }
  EXPECT_EQ(Registry::global().select(test::prefill_signature("bf16", 64, 8, true), platform_for_target("sm_90a"))->name,
            "attention.prefill.wgmma_ws");
}

}  // namespace
}  // namespace kiln
