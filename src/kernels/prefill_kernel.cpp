#include "kernels/prefill_kernel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>

#include "attention/params.h"
#include "kernels/signature_checks.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

// Query heads per CTA of the packing kernel: the largest power of two up to `warps` dividing the
// group, so a CTA's heads read one KV head and its warps split evenly between them.
int packed_heads(int64_t group, int warps) {
  int heads = warps;
  while (group % heads != 0) heads /= 2;
  return heads;
}

// The prefill kernels' view of a call, whatever operator it came through: the query rows, heads
// and sequences the grid covers.
struct GridInputs {
  int max_rows, heads_q, heads_kv, head_dim, batch;
};

GridInputs grid_inputs(const void* params, PrefillInput input) {
  if (input == PrefillInput::kPagedDecode) {
    const auto& d = *static_cast<const KilnDecodeParams*>(params);
    return {d.q_len, d.num_heads_q, d.num_heads_kv, d.head_dim, d.batch};
  }
  const auto& p = *static_cast<const KilnPrefillParams*>(params);
  return {p.max_seqlen_q, p.num_heads_q, p.num_heads_kv, p.head_dim, p.batch};
}

// The paged forms read a cache of the queries' type, or the e4m3 forms an e4m3 cache.
std::optional<std::string> check_paged(const Signature& sig, bool e4m3_cache) {
  if (e4m3_cache && sig.get("kv_dtype") != "e4m3") {
    return fmt::format("kv_dtype {} unsupported (supported: e4m3; a 16-bit cache runs on the other paged kernels)", sig.get("kv_dtype"));
  }
  if (!e4m3_cache && sig.get("kv_dtype") != sig.get("dtype")) {
    return fmt::format("kv_dtype {} unsupported (supported: the same as dtype; an e4m3 cache runs on the _fp8 kernels from sm_89)",
                       sig.get("kv_dtype"));
  }
  return std::nullopt;
}

int key_rows_of(const PrefillKernel& k, int64_t head_dim) {
  if (head_dim == 256) return k.key_rows_d256;
  return head_dim == 128 && k.key_rows_d128 > 0 ? k.key_rows_d128 : k.key_rows;
}

int stages_of(const PrefillKernel& k, int64_t head_dim) {
  if (head_dim == 64 && k.stages_d64 > 0) return k.stages_d64;
  return head_dim == 256 && k.stages_d256 > 0 ? k.stages_d256 : k.stages;
}

const char* mode_of(PrefillInput input) {
  switch (input) {
    case PrefillInput::kPagedExtend: return kModeExtend;
    case PrefillInput::kPagedDecode: return kModeDecode;
    default: return kModePrefill;
  }
}

}  // namespace

std::vector<TensorMapRequest> prefill_tensor_maps(const KilnPrefillParams& p, int q_rows, int key_rows, int q_heads) {
  auto map = [&](int slot, const void* base, int heads, int rows, long long row_stride, long long head_stride, int box_heads,
                 int box_rows) {
    return TensorMapRequest::of(offsetof(KilnPrefillParams, tensor_maps) + slot * sizeof(KilnTensorMap), base,
                                {static_cast<uint64_t>(p.head_dim), static_cast<uint64_t>(heads), static_cast<uint64_t>(rows)},
                                {static_cast<uint64_t>(head_stride) * 2, static_cast<uint64_t>(row_stride) * 2},
                                {64, static_cast<uint32_t>(box_heads), static_cast<uint32_t>(box_rows)});
  };
  std::vector<TensorMapRequest> maps;
  maps.push_back(map(kPrefillMapQ, p.q, p.num_heads_q, p.total_q, p.q_row_stride, p.q_head_stride, q_heads, q_rows));
  if (p.total_k > 0 && p.kv_element_bytes == 1) {
    // An e4m3 cache: rows of head_dim bytes as 16-bit pairs, one box a row, unswizzled (the
    // kernel widens them itself).
    auto bytes_map = [&](int slot, const void* base, long long row_stride, long long head_stride) {
      TensorMapRequest m = TensorMapRequest::of(
          offsetof(KilnPrefillParams, tensor_maps) + slot * sizeof(KilnTensorMap), base,
          {static_cast<uint64_t>(p.head_dim / 2), static_cast<uint64_t>(p.num_heads_kv), static_cast<uint64_t>(p.total_k)},
          {static_cast<uint64_t>(head_stride), static_cast<uint64_t>(row_stride)},
          {static_cast<uint32_t>(std::min(p.head_dim / 2, 64)), 1, static_cast<uint32_t>(key_rows)});
      m.swizzle_128b = false;
      return m;
    };
    maps.push_back(bytes_map(kPrefillMapK, p.k, p.k_row_stride, p.k_head_stride));
    maps.push_back(bytes_map(kPrefillMapV, p.v, p.v_row_stride, p.v_head_stride));
  } else if (p.total_k > 0) {
    maps.push_back(map(kPrefillMapK, p.k, p.num_heads_kv, p.total_k, p.k_row_stride, p.k_head_stride, 1, key_rows));
    maps.push_back(map(kPrefillMapV, p.v, p.num_heads_kv, p.total_k, p.v_row_stride, p.v_head_stride, 1, key_rows));
  } else {
    maps.push_back(map(kPrefillMapK, p.q, 1, 1, p.q_row_stride, p.q_head_stride, 1, key_rows));
    maps.push_back(map(kPrefillMapV, p.q, 1, 1, p.q_row_stride, p.q_head_stride, 1, key_rows));
  }
  return maps;
}

KernelSpec prefill_kernel(const PrefillKernel& k) {
  KernelSpec spec;
  spec.name = k.name;
  spec.family = kFamilyAttention;
  spec.mode = mode_of(k.input);
  spec.priority = k.priority;
  // Windows-only kernels are narrower than general ones, and a Hopper-only one narrower still.
  spec.specificity = k.windows_only ? (k.min_arch >= 90 ? 4 : 3) : 2;
  spec.requirements.vendor = Vendor::kNvidia;
  spec.requirements.min_arch = k.min_arch;
  spec.requirements.features = k.features;
  spec.source = k.source;
  const bool windows_only = k.windows_only;
  const PrefillInput input = k.input;
  const int min_page_size = k.min_page_size;
  const bool head_dim_256 = k.key_rows_d256 > 0, e4m3_cache = k.e4m3_cache, softcap = k.softcap;
  spec.accepts = [windows_only, input, min_page_size, head_dim_256, e4m3_cache,
                  softcap](const Signature& sig) -> std::optional<std::string> {
    if (auto why = check_16bit_dtype(sig)) return why;
    if (!softcap && sig.get_int("softcap") != 0) return std::string("softcap unsupported (supported: 0)");
    if (input == PrefillInput::kPagedDecode) {
      // One new token per sequence is the split decode kernels' work.
      if (sig.get_int("q_len") < 2) return std::string("q_len 1 unsupported (supported: 2 to 16)");
    } else if (windows_only && !(sig.get_flag("window") && sig.get_flag("causal"))) {
      // Their band is the window behind each row: a window without causal masking reaches the end.
      return std::string("only for causal sliding windows (window=1, causal=1)");
    }
    if (input != PrefillInput::kContiguous) {
      if (auto why = check_paged(sig, e4m3_cache)) return why;
      if (min_page_size > 0 && sig.get_int("page_size") < min_page_size) {
        return fmt::format("page_size {} unsupported (supported: {} and up)", sig.get_int("page_size"), min_page_size);
      }
    }
    return check_head_dim_64_or_128(sig, head_dim_256);
  };
  spec.specialize = [k](const Signature& sig, const Platform&) {
    std::string expression =
        fmt::format("kiln::{}<kiln::{}, {}, {}", k.entry, sig.get("dtype"), sig.get_int("head_dim"), sig.get_int("softcap") != 0);
    if (k.warps > 0) {
      const int64_t d = sig.get_int("head_dim");
      expression += fmt::format(", {}, {}, {}, {}", k.warps, k.packs_heads ? packed_heads(sig.get_int("group"), k.warps) : 1,
                                key_rows_of(k, d), stages_of(k, d));
    }
    if (k.input == PrefillInput::kPagedExtend) expression += ", true";  // kPaged
    if (k.e4m3_cache) expression += ", kiln::e4m3";                     // Cache
    return Specialization{expression + ">", {}};
  };
  spec.launch_shape = [k](const void* params, const Platform& platform) {
    const GridInputs p = grid_inputs(params, k.input);
    const int heads = k.packs_heads ? packed_heads(p.heads_q / p.heads_kv, k.warps) : 1;
    const int rows = k.warps > 0 ? 16 * k.warps : p.head_dim == 64 ? k.block_rows_d64 : k.block_rows_d128;
    const int positions = rows / heads;
    LaunchShape shape;
    shape.grid[0] = static_cast<uint32_t>((p.max_rows + k.key_align - 1 + positions - 1) / positions);
    shape.grid[1] = static_cast<uint32_t>(p.heads_q / heads);
    shape.grid[2] = static_cast<uint32_t>(p.batch);
    shape.block[0] = static_cast<uint32_t>(2 * rows + (k.producer_warpgroup ? 128 : 0));
    // The Q rows plus the stages of K and V tiles, 16-bit elements, and the mbarriers: with a
    // producer Q's, a partial V block's and four per stage, else one per stage.
    const int stages = stages_of(k, p.head_dim);
    shape.dynamic_shared_bytes = static_cast<uint32_t>((rows + 2 * stages * key_rows_of(k, p.head_dim)) * p.head_dim * 2) + k.alignment;
    if (k.producer_warpgroup) {
      // e4m3 staging slots (a K and a V tile's bytes) and their full barriers.
      shape.dynamic_shared_bytes +=
          static_cast<uint32_t>(8 * (2 + 4 * stages) + k.staging_slots * (2 * key_rows_of(k, p.head_dim) * p.head_dim + 8));
    } else if (k.tma) {
      shape.dynamic_shared_bytes += static_cast<uint32_t>(8 * stages);
    }
    if (shape.dynamic_shared_bytes > platform.shared_memory_per_block) {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("{} needs {} bytes of shared memory at head_dim {}; {} allows {}", k.name, shape.dynamic_shared_bytes,
                              p.head_dim, platform.arch, platform.shared_memory_per_block));
    }
    return shape;
  };
  if (k.tma) {
    spec.tensor_maps = [k](const void* params, const Platform&) {
      const auto& p = *static_cast<const KilnPrefillParams*>(params);
      // Paged keys come a page (or a part of a larger page) per box.
      const int key_rows = key_rows_of(k, p.head_dim);
      const int page_box_rows = std::min(p.page_size, k.page_box_rows > 0 ? k.page_box_rows : key_rows);
      return prefill_tensor_maps(p, k.q_box_rows, k.input == PrefillInput::kPagedExtend ? page_box_rows : key_rows);
    };
  }
  return spec;
}

PrefillKernel mma_sync_kernel(const char* name, Priority priority) {
  return {.name = name,
          .source = "attention/prefill_mma.cuh",
          .entry = "prefill_mma",
          .priority = priority,
          .warps = 4,
          .min_arch = 80,
          .features = {"mma:mma_sync", "memory:cp_async"},
          .key_rows = 64,
          .stages = 2,
          // head_dim 256: 32-key tiles, so that Q and two stages (96 KB) fit the 99 KB of sm_86,
          // sm_89 and sm_120, and S (16 registers) beside Q's fragments (64) and O (128).
          .key_rows_d256 = 32};
}

PrefillKernel mma_sync_e4m3_kernel(PrefillKernel k, const char* name) {
  k.name = name;
  k.e4m3_cache = true;
  k.min_arch = 89;
  return k;
}

PrefillKernel wgmma_window_kernel(const char* name) {
  return {.name = name,
          .source = "attention/prefill_wgmma_window.cuh",
          .entry = "prefill_wgmma_window",
          .priority = Priority::kSpecialized,
          .windows_only = true,
          .warps = 4,
          .packs_heads = true,
          .min_arch = 90,
          .features = {"mma:wgmma", "memory:tma"},
          .key_rows = 48,
          .stages = 2,
          .alignment = 1024,
          .tma = true};
}

PrefillKernel wgmma_ws_kernel(const char* name) {
  return {.name = name,
          .source = "attention/prefill_wgmma_ws.cuh",
          .entry = "prefill_wgmma_ws",
          .priority = Priority::kPerformant,
          .min_arch = 90,
          .features = {"mma:wgmma", "memory:tma"},
          .block_rows_d64 = 192,
          .block_rows_d128 = 128,
          .key_rows = 128,
          .stages = 2,
          .alignment = 1024,
          .tma = true,
          .q_box_rows = 64,
          .producer_warpgroup = true,
          .stages_d64 = 4,
          .key_rows_d128 = 176,  // contiguous keys (PrefillWsShape); the paged form keeps 128
          .key_rows_d256 = 80,
          .stages_d256 = 2};
}

}  // namespace kiln::detail
