#include "ops/paged_attention.hpp"

#include <cmath>

#include <fmt/format.h>

#include "ops/validate.hpp"

namespace kiln::detail {

bool supported_page_size(int64_t page_size) { return page_size >= 1 && page_size <= 256 && (page_size & (page_size - 1)) == 0; }

void check_paged_attention(const PagedAttentionArgs& a) {
  const std::initializer_list<DType> half_types = {DType::kBF16, DType::kF16};
  check_tensor(*a.q, {"q", 3, half_types});
  check_tensor(*a.out, {"out", 3, half_types});
  check_tensor(*a.k_cache, {"k_cache", 4, {DType::kBF16, DType::kF16, DType::kF8E4M3}});
  check_tensor(*a.v_cache, {"v_cache", 4, {DType::kBF16, DType::kF16, DType::kF8E4M3}});
  check_tensor(*a.page_table, {"page_table", 2, {DType::kI32}, 4});
  check_tensor(*a.cache_seqlens, {"cache_seqlens", 1, {DType::kI32}, 4});
  check_optional_tensor(*a.lse, {"lse", 2, {DType::kF32}, 4});
  check_optional_tensor(*a.sinks, {"sinks", 1, {DType::kF32}, 4});
  if (a.q->device == kHostDevice) invalid_argument("q: must be in device memory, got host memory");
  for (auto [t, name] : {std::pair{a.k_cache, "k_cache"}, {a.v_cache, "v_cache"}, {a.out, "out"}, {a.lse, "lse"}}) {
    if (t->defined() && t->device == kHostDevice) {
      invalid_argument(fmt::format("{}: must be in device memory, got host memory", name));
    }
    check_same_device(*t, name, *a.q, "q");
  }
  check_same_device(*a.page_table, "page_table", *a.q, "q");
  check_same_device(*a.cache_seqlens, "cache_seqlens", *a.q, "q");
  check_same_device(*a.sinks, "sinks", *a.q, "q");

  if (a.out->dtype != a.q->dtype) {
    invalid_argument(fmt::format("out: dtype {} must match q's dtype {}", dtype_name(a.out->dtype), dtype_name(a.q->dtype)));
  }
  if (a.k_cache->dtype != a.v_cache->dtype) {
    invalid_argument(
        fmt::format("v_cache: dtype {} must match k_cache's dtype {}", dtype_name(a.v_cache->dtype), dtype_name(a.k_cache->dtype)));
  }
  if (a.k_cache->dtype != a.q->dtype && a.k_cache->dtype != DType::kF8E4M3) {
    invalid_argument(
        fmt::format("k_cache: dtype must be q's dtype {} or e4m3, got {}", dtype_name(a.q->dtype), dtype_name(a.k_cache->dtype)));
  }
  const int64_t rows = a.q->size(0), hq = a.q->size(1), d = a.q->size(2);
  const int64_t num_pages = a.k_cache->size(0), page_size = a.k_cache->size(1), hkv = a.k_cache->size(2);
  if (d <= 0 || d % 8 != 0) invalid_argument(fmt::format("q: head_dim (dimension 2) must be a positive multiple of 8, got {}", d));
  if (hq <= 0) invalid_argument("q: number of heads (dimension 1) must be positive");
  if (hkv <= 0) invalid_argument("k_cache: number of heads (dimension 2) must be positive");
  if (!supported_page_size(page_size)) {
    invalid_argument(fmt::format("k_cache: page_size (dimension 1) must be a power of two from 1 to 256, got {}", page_size));
  }
  check_dim(*a.k_cache, "k_cache", 3, d, "q's head_dim");
  for (int i = 0; i < 4; ++i) check_dim(*a.v_cache, "v_cache", i, a.k_cache->size(i), "k_cache's size");
  if (hq % hkv != 0) invalid_argument(fmt::format("q/k_cache: Hq = {} must be a multiple of Hkv = {}", hq, hkv));
  for (int i = 0; i < 3; ++i) check_dim(*a.out, "out", i, a.q->size(i), "q's size");
  check_dim(*a.page_table, "page_table", 0, a.batch, a.batch_what);
  check_dim(*a.cache_seqlens, "cache_seqlens", 0, a.batch, a.batch_what);
  const int64_t max_pages = a.page_table->size(1);
  if (a.lse->defined()) {
    check_dim(*a.lse, "lse", 0, rows, "q rows");
    check_dim(*a.lse, "lse", 1, hq, "Hq");
  }
  if (a.sinks->defined()) check_dim(*a.sinks, "sinks", 0, hq, "Hq");
  if (!std::isfinite(a.softmax_scale)) invalid_argument("softmax_scale: must be finite");
  if (!std::isfinite(a.softcap) || a.softcap < 0) invalid_argument(fmt::format("softcap: must be >= 0 (0 = none), got {}", a.softcap));
  if (a.window_left < -1) invalid_argument(fmt::format("window_left: must be -1 (none) or >= 0, got {}", a.window_left));
  if (a.k_cache->dtype == DType::kF8E4M3) {
    if (!(std::isfinite(a.k_scale) && a.k_scale > 0))
      invalid_argument(fmt::format("k_scale: must be finite and > 0 for an e4m3 cache, got {}", a.k_scale));
    if (!(std::isfinite(a.v_scale) && a.v_scale > 0))
      invalid_argument(fmt::format("v_scale: must be finite and > 0 for an e4m3 cache, got {}", a.v_scale));
  }
  // Host-resident metadata can be checked element by element.
  if (a.cache_seqlens->device == kHostDevice && a.batch > 0) {
    const int* len = static_cast<const int*>(a.cache_seqlens->data);
    for (int64_t b = 0; b < a.batch; ++b) {
      const int64_t l = len[b * a.cache_seqlens->stride(0)];
      if (l < 0 || l > max_pages * page_size) {
        invalid_argument(
            fmt::format("cache_seqlens[{}] = {} is outside [0, max_pages_per_seq * page_size = {}]", b, l, max_pages * page_size));
      }
      const int64_t least = a.min_len(a.min_len_ctx, b);
      if (l < least && !(l == 0 && a.empty_allowed)) {
        invalid_argument(
            fmt::format("cache_seqlens[{}] = {} is smaller than {} = {} (the new tokens are in the cache)", b, l, a.min_len_why, least));
      }
    }
  }
  if (a.page_table->device == kHostDevice && a.batch > 0) {
    const int* pt = static_cast<const int*>(a.page_table->data);
    const int* len = a.cache_seqlens->device == kHostDevice ? static_cast<const int*>(a.cache_seqlens->data) : nullptr;
    for (int64_t b = 0; b < a.batch; ++b) {
      const int64_t used = len ? (len[b * a.cache_seqlens->stride(0)] + page_size - 1) / page_size : max_pages;
      for (int64_t p = 0; p < used; ++p) {
        const int idx = pt[b * a.page_table->stride(0) + p];
        if (idx < 0 || idx >= num_pages) {
          invalid_argument(fmt::format("page_table[{}][{}] = {} is outside [0, num_pages = {})", b, p, idx, num_pages));
        }
      }
    }
  }
  check_disjoint(*a.out, "out", {{a.q, "q"}, {a.k_cache, "k_cache"}, {a.v_cache, "v_cache"}, {a.lse, "lse"}});
  check_disjoint(*a.lse, "lse", {{a.q, "q"}, {a.k_cache, "k_cache"}, {a.v_cache, "v_cache"}});
}

}  // namespace kiln::detail
