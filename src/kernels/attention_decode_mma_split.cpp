// Registration of the split-KV decode kernel (kernel-sources/attention/decode_mma_split.cuh; sm_80
// on, sm_89 on for an e4m3 cache): tensor cores over the GQA group; a small batch is split into
// ranges of about equal tiles, dealt to its sequences by length, and the partial states of a
// (sequence, KV head) pair are merged through the workspace by the last of its CTAs to finish
// (attention/decode_merge.cuh).
#include <algorithm>

#include <fmt/format.h>

#include "attention/decode_workspace.h"
#include "attention/params.h"
#include "kernels/signature_checks.hpp"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

constexpr int64_t kMinTokensPerRange = 256;

// decode_mma_split's copy ring per warp: kDecodeStages in the kernel source. The rings start on a
// 128-byte boundary, up to kDecodeRingAlign bytes into dynamic shared memory.
constexpr int kCopyStages = 2;
constexpr uint32_t kRingAlignSlack = 128;

// Query rows (q_len x group) per KV head, at most: row tiles of 16, each taken by one warp or more
// of a CTA, each warp with its own copy ring (so a KV tile is copied once per row tile). With a
// 16-bit cache two tiles, and one at head_dim 256: beyond them a batch that fills the SMs ran
// slower than on attention.decode.prefill_mma, which takes them (H200, B64 ctx4096: head_dim 256,
// 16/8 heads, q_len 16, 0.975 ms against 0.696; head_dim 64, 64/8 heads, q_len 8, 0.40 ms against
// 0.33 even with the row tiles sharing a ring), though a small batch ran 2-4.4x faster. With an
// e4m3 cache four tiles (two at head_dim 256, where a 99 KB part fits the rings of only three
// warps); attention.decode.prefill_mma_fp8 takes more.
int64_t max_query_rows(int64_t head_dim, bool fp8_cache) {
  if (fp8_cache) return head_dim == 256 ? 32 : 64;
  return head_dim == 256 ? 16 : 32;
}

// Row tiles of 16 query rows: the launch gives each the same number of warps.
int64_t row_tiles(int64_t rows) { return (rows + 15) / 16; }

// q in a 16-bit type and the cache in the same type (e4m3 for the fp8 registration), head_dim 64,
// 128 or 256, and at most max_query_rows query rows per KV head.
std::optional<std::string> check(const Signature& sig, bool fp8_cache) {
  if (auto why = detail::check_16bit_dtype(sig)) return why;
  const std::string& dtype = sig.get("dtype");
  const std::string wanted_cache = fp8_cache ? "e4m3" : dtype;
  if (sig.get("kv_dtype") != wanted_cache) {
    return fmt::format("kv_dtype {} unsupported (supported: {})", sig.get("kv_dtype"),
                       fp8_cache ? "e4m3; a 16-bit cache runs on attention.decode.mma_split"
                                 : "the same as dtype; an e4m3 cache runs on attention.decode.mma_split_fp8");
  }
  if (auto why = detail::check_head_dim_64_or_128(sig, /*also_256=*/true)) return why;
  const int64_t d = sig.get_int("head_dim");
  const int64_t page = sig.get_int("page_size");
  if (page < 1 || page > 256 || (page & (page - 1)) != 0) {
    return fmt::format("page_size {} unsupported (supported: powers of two from 1 to 256)", page);
  }
  const int64_t rows = sig.get_int("q_len") * sig.get_int("group");
  const int64_t limit = max_query_rows(d, fp8_cache);
  if (rows > limit) return fmt::format("q_len x group = {} unsupported at head_dim {} (at most {})", rows, d, limit);
  return std::nullopt;
}

// Dynamic shared memory of one decode_mma_split warp: kCopyStages stages of a 16-token K tile and
// V tile with padded rows, and for an e4m3 cache an f16 V tile. Must match DecodeTileLayout in the
// kernel source.
uint32_t warp_shared_bytes(int head_dim, bool fp8_cache) {
  const int k_row = fp8_cache ? head_dim + 32 : 2 * (head_dim + (head_dim == 64 ? 32 : 8));
  const int v_row = fp8_cache ? head_dim + 16 : 2 * (head_dim + 8);
  const int staging = fp8_cache ? 16 * 2 * (head_dim + 8) : 0;
  return static_cast<uint32_t>(kCopyStages * 16 * (k_row + v_row) + staging);
}

// Query rows per KV head, q_len x group: the rows of one softmax state.
int64_t query_rows(const KilnDecodeParams& p) { return static_cast<int64_t>(p.q_len) * (p.num_heads_q / std::max(p.num_heads_kv, 1)); }

// Warps per CTA: `wanted`, or as many as the GPU's shared memory per block holds rings for (at
// head_dim 256 a 16-bit cache's rings take 33 KB a warp: 6 of them on Hopper's 227 KB), rounded
// down to a multiple of the row tiles.
int64_t warps_that_fit(const KilnDecodeParams& p, const Platform& platform, bool fp8_cache, int64_t wanted) {
  constexpr int64_t kStaticSharedSlack = 4096;  // the kernel's static arrays: at most 1.7 KB
  const int64_t room = static_cast<int64_t>(platform.shared_memory_per_block) - kRingAlignSlack - kStaticSharedSlack;
  const int64_t tiles = row_tiles(query_rows(p));
  const int64_t fit = std::clamp<int64_t>(room / warp_shared_bytes(p.head_dim, fp8_cache), 1, wanted);
  return std::max(tiles, fit / tiles * tiles);
}

// The grid and warps per CTA. A batch whose (sequence, KV head) pairs fill every SM runs unsplit,
// grid (1, Hkv, batch), 4 warps per CTA (up to three or four CTAs per SM; one at head_dim 256,
// where 6 warps measured no faster). A smaller batch gets 8-warp CTAs (at head_dim 256 what fits:
// warps_that_fit), one per SM, grid (G Hkv): G = SMs / Hkv ranges (the Hkv CTAs of a range read the
// same tokens), at least kMinTokensPerRange of the longest context each. An e4m3 cache at head_dim
// 64 gets twice the ranges, two CTAs per SM, both resident (under 128 registers a thread and 64 KB
// of shared memory each; the GPU test SplitDecodeGridIsOneWave asks the driver): its tiles carry
// half a 16-bit cache's bytes, and 8 warps an SM keep too few in flight. On an H200 (Hkv 8) that
// took 11-16% off: B1 ctx131072 p16 0.0562 ms against 0.0632, B2 ctx65536 p16 0.0551 against
// 0.0625, B4 ctx32768 p64 0.0523 against 0.0619. A 16-bit cache at head_dim 64 gained 2-4% at
// page 16 for B1 and B2 but lost 3-7% at larger pages and at B4; at head_dim 128 one CTA fits an
// SM, and more ranges lost 2-5% (bench/RESULTS.md, 2026-11-23, H200). When that leaves no
// more ranges than sequences (short contexts), each pair gets one 8-warp CTA, unsplit.
struct DecodeGrid {
  int64_t ranges;  // 0: unsplit
  int64_t warps;
};

DecodeGrid decode_grid(const KilnDecodeParams& p, const Platform& platform, bool fp8_cache) {
  const int64_t heads_kv = std::max(p.num_heads_kv, 1);
  const int64_t pairs = std::max<int64_t>(static_cast<int64_t>(p.batch) * heads_kv, 1);
  const int64_t max_context = static_cast<int64_t>(p.max_pages_per_seq) * p.page_size;
  const int64_t sms = std::max(platform.multiprocessor_count, 1);
  // The split kernel counts the batch's tiles in 32 bits.
  if (pairs >= sms || p.batch > kiln_decode_split_max_batch || p.batch * max_context >= (int64_t{1} << 31))
    return DecodeGrid{0, warps_that_fit(p, platform, fp8_cache, 4)};
  const int64_t warps = warps_that_fit(p, platform, fp8_cache, 8);
  // The last CTA of a pair keeps two floats per piece and row in its dynamic shared memory
  // (decode_merge.cuh): at most this many pieces.
  const int64_t max_parts = warps * warp_shared_bytes(p.head_dim, fp8_cache) / (8 * std::max<int64_t>(query_rows(p), 1));
  const int64_t ctas_per_sm = fp8_cache && p.head_dim == 64 ? 2 : 1;
  const int64_t ranges = std::min({ctas_per_sm * sms / heads_kv, max_parts, p.batch * max_context / kMinTokensPerRange});
  return DecodeGrid{ranges > p.batch ? ranges : 0, warps};
}

// The workspace of a split launch: tickets and piece states (attention/decode_workspace.h); none
// unsplit.
size_t workspace_bytes(const KilnDecodeParams& p, const Platform& platform, bool fp8_cache) {
  const int64_t ranges = decode_grid(p, platform, fp8_cache).ranges;
  if (ranges == 0) return 0;
  return static_cast<size_t>(kiln_decode_workspace_bytes(p.batch, p.num_heads_kv, ranges, query_rows(p), p.head_dim));
}

// One registration per cache kind; the same kernel template serves both (decode_mma_split.cuh).
KernelSpec mma_split_kernel(const char* name, bool fp8_cache) {
  KernelSpec spec;
  spec.name = name;
  spec.family = kFamilyAttention;
  spec.mode = kModeDecode;
  spec.priority = Priority::kSpecialized;
  spec.specificity = 3;
  spec.requirements.vendor = Vendor::kNvidia;
  // mma.sync, ldmatrix and cp.async: sm_80 on; the e4m3 cache's cvt to f16 pairs from sm_89.
  spec.requirements.min_arch = fp8_cache ? 89 : 80;
  spec.source = "attention/decode_mma_split.cuh";
  spec.accepts = [fp8_cache](const Signature& sig) { return check(sig, fp8_cache); };
  spec.specialize = [](const Signature& sig, const Platform&) {
    return Specialization{fmt::format("kiln::decode_mma_split<kiln::{}, kiln::{}, {}, {}, {}, {}>", sig.get("dtype"), sig.get("kv_dtype"),
                                      sig.get_int("head_dim"), sig.get_int("q_len"), sig.get_int("group"), sig.get_int("page_size") < 16),
                          {}};
  };
  spec.launch_shape = [fp8_cache](const void* params, const Platform& platform) {
    const auto& p = *static_cast<const KilnDecodeParams*>(params);
    const DecodeGrid grid = decode_grid(p, platform, fp8_cache);
    LaunchShape shape;
    shape.grid[0] = grid.ranges > 0 ? static_cast<uint32_t>(grid.ranges * p.num_heads_kv) : 1u;
    shape.grid[1] = grid.ranges > 0 ? 1u : static_cast<uint32_t>(p.num_heads_kv);
    shape.grid[2] = grid.ranges > 0 ? 1u : static_cast<uint32_t>(p.batch);
    shape.block[0] = static_cast<uint32_t>(32 * grid.warps);
    shape.dynamic_shared_bytes = static_cast<uint32_t>(grid.warps) * warp_shared_bytes(p.head_dim, fp8_cache) + kRingAlignSlack;
    return shape;
  };
  spec.workspace_bytes = [fp8_cache](const void* params, const Platform& platform) {
    return workspace_bytes(*static_cast<const KilnDecodeParams*>(params), platform, fp8_cache);
  };
  spec.workspace_zeroed_bytes = [](const void* params, const Platform&) {
    const auto& p = *static_cast<const KilnDecodeParams*>(params);
    return static_cast<size_t>(kiln_decode_ticket_bytes(static_cast<int64_t>(p.batch) * p.num_heads_kv));
  };
  return spec;
}

}  // namespace

KILN_REGISTER_KERNEL(attention_decode_mma_split) { return mma_split_kernel("attention.decode.mma_split", false); }
KILN_REGISTER_KERNEL(attention_decode_mma_split_fp8) { return mma_split_kernel("attention.decode.mma_split_fp8", true); }

}  // namespace kiln
