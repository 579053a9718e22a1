// kv_cache_append: argument validation and the parameter block.
#include <fmt/format.h>

#include <cmath>

#include "attention/params.h"
#include "jit/operator_call.hpp"
#include "kiln/author.hpp"
#include "kiln/error.hpp"
#include "ops/paged_attention.hpp"
#include "ops/signature_table.hpp"
#include "ops/validate.hpp"

namespace kiln {

using detail::check_dim;
using detail::check_tensor;
using detail::invalid_argument;

void validate(const KvAppendArgs& a) {
  const std::initializer_list<DType> half_types = {DType::kBF16, DType::kF16};
  check_tensor(a.k, {"k", 3, half_types});
  check_tensor(a.v, {"v", 3, half_types});
  check_tensor(a.slot_mapping, {"slot_mapping", 1, {DType::kI64}, 8});
  // e4m3 rows are stored 8 bytes at a time.
  check_tensor(a.k_cache, {"k_cache", 4, {DType::kBF16, DType::kF16, DType::kF8E4M3}, 8});
  check_tensor(a.v_cache, {"v_cache", 4, {DType::kBF16, DType::kF16, DType::kF8E4M3}, 8});
  if (a.k.device == kHostDevice) invalid_argument("k: must be in device memory, got host memory");
  for (auto [t, name] : {std::pair{&a.v, "v"}, {&a.slot_mapping, "slot_mapping"}, {&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"}}) {
    if (t->device == kHostDevice) invalid_argument(fmt::format("{}: must be in device memory, got host memory", name));
    detail::check_same_device(*t, name, a.k, "k");
  }
  if (a.v.dtype != a.k.dtype) {
    invalid_argument(fmt::format("v: dtype {} must match k's dtype {}", dtype_name(a.v.dtype), dtype_name(a.k.dtype)));
  }
  if (a.v_cache.dtype != a.k_cache.dtype) {
    invalid_argument(
        fmt::format("v_cache: dtype {} must match k_cache's dtype {}", dtype_name(a.v_cache.dtype), dtype_name(a.k_cache.dtype)));
  }
  if (a.k_cache.dtype != a.k.dtype && a.k_cache.dtype != DType::kF8E4M3) {
    invalid_argument(
        fmt::format("k_cache: dtype must be k's dtype {} or e4m3, got {}", dtype_name(a.k.dtype), dtype_name(a.k_cache.dtype)));
  }
  const int64_t tokens = a.k.size(0), hkv = a.k.size(1), d = a.k.size(2);
  if (d <= 0 || d % 8 != 0) invalid_argument(fmt::format("k: head_dim (dimension 2) must be a positive multiple of 8, got {}", d));
  for (int i = 0; i < 3; ++i) check_dim(a.v, "v", i, a.k.size(i), "k's size");
  check_dim(a.slot_mapping, "slot_mapping", 0, tokens, "k's tokens (dimension 0)");
  const int64_t page_size = a.k_cache.size(1);
  if (!detail::supported_page_size(page_size)) {
    invalid_argument(fmt::format("k_cache: page_size (dimension 1) must be a power of two from 1 to 256, got {}", page_size));
  }
  check_dim(a.k_cache, "k_cache", 2, hkv, "k's Hkv");
  check_dim(a.k_cache, "k_cache", 3, d, "k's head_dim");
  for (int i = 0; i < 4; ++i) check_dim(a.v_cache, "v_cache", i, a.k_cache.size(i), "k_cache's size");
  if (a.k_cache.dtype == DType::kF8E4M3) {
    if (!(std::isfinite(a.k_scale) && a.k_scale > 0))
      invalid_argument(fmt::format("k_scale: must be finite and > 0 for an e4m3 cache, got {}", a.k_scale));
    if (!(std::isfinite(a.v_scale) && a.v_scale > 0))
      invalid_argument(fmt::format("v_scale: must be finite and > 0 for an e4m3 cache, got {}", a.v_scale));
  }
  detail::check_disjoint(a.k_cache, "k_cache", {{&a.k, "k"}, {&a.v, "v"}, {&a.slot_mapping, "slot_mapping"}, {&a.v_cache, "v_cache"}});
  detail::check_disjoint(a.v_cache, "v_cache", {{&a.k, "k"}, {&a.v, "v"}, {&a.slot_mapping, "slot_mapping"}});
}

void kv_cache_append(const KvAppendArgs& a, Stream stream) {
  validate(a);
  KilnKvAppendParams p{};
  p.k = a.k.data;
  p.v = a.v.data;
  p.slot_mapping = static_cast<const long long*>(a.slot_mapping.data);
  p.k_cache = a.k_cache.data;
  p.v_cache = a.v_cache.data;
  p.k_row_stride = a.k.stride(0);
  p.k_head_stride = a.k.stride(1);
  p.v_row_stride = a.v.stride(0);
  p.v_head_stride = a.v.stride(1);
  p.k_cache_page_stride = a.k_cache.stride(0);
  p.k_cache_row_stride = a.k_cache.stride(1);
  p.k_cache_head_stride = a.k_cache.stride(2);
  p.v_cache_page_stride = a.v_cache.stride(0);
  p.v_cache_row_stride = a.v_cache.stride(1);
  p.v_cache_head_stride = a.v_cache.stride(2);
  p.slot_stride = a.slot_mapping.stride(0);
  p.tokens = static_cast<int>(a.k.size(0));
  p.num_heads_kv = static_cast<int>(a.k.size(1));
  p.head_dim = static_cast<int>(a.k.size(2));
  while ((int64_t{1} << p.page_shift) < a.k_cache.size(1)) ++p.page_shift;
  const bool fp8 = a.k_cache.dtype == DType::kF8E4M3;
  p.k_scale = fp8 ? a.k_scale : 1.0f;
  p.v_scale = fp8 ? a.v_scale : 1.0f;
  if (a.k.numel() == 0) return;
  detail::OperatorCall call{detail::kv_append_signature_table().call_key(a),
                            [](const void* x) { return signature_of(*static_cast<const KvAppendArgs*>(x)); },
                            &a,
                            a.k.device,
                            &p,
                            sizeof(p),
                            stream};
  detail::run_operator(call);
}

}  // namespace kiln
