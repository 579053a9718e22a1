// mha_extend_with_kvcache: argument validation and the parameter block (the prefill kernels'
// KilnPrefillParams with page_table set).
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "attention/params.h"
#include "jit/operator_call.hpp"
#include "kiln/author.hpp"
#include "kiln/error.hpp"
#include "ops/paged_attention.hpp"
#include "ops/signature_table.hpp"
#include "ops/validate.hpp"

namespace kiln {

using detail::check_tensor;
using detail::invalid_argument;

void validate(const MhaExtendArgs& a) {
  check_tensor(a.q, {"q", 3, {DType::kBF16, DType::kF16}});
  check_tensor(a.cu_seqlens_q, {"cu_seqlens_q", 1, {DType::kI32}, 4});
  detail::check_same_device(a.cu_seqlens_q, "cu_seqlens_q", a.q, "q");
  const int64_t n = a.cu_seqlens_q.size(0), total_q = a.q.size(0);
  if (n < 2) invalid_argument(fmt::format("cu_seqlens_q: needs batch + 1 >= 2 entries, got {}", n));
  if (a.max_seqlen_q < 0 || a.max_seqlen_q > total_q) {
    invalid_argument(fmt::format("max_seqlen_q: must be in [0, total_q = {}], got {}", total_q, a.max_seqlen_q));
  }
  detail::check_host_cu_seqlens(a.cu_seqlens_q, "cu_seqlens_q", total_q, a.max_seqlen_q, "max_seqlen_q");
  // A sequence's keys include its new tokens: with both on the host, cache_seqlens[b] >= its q rows.
  const bool host_cu = a.cu_seqlens_q.device == kHostDevice;
  detail::PagedAttentionArgs paged{&a.q,
                                   &a.k_cache,
                                   &a.v_cache,
                                   &a.page_table,
                                   &a.cache_seqlens,
                                   &a.out,
                                   &a.lse,
                                   &a.sinks,
                                   a.softmax_scale,
                                   a.softcap,
                                   a.window_left,
                                   a.k_scale,
                                   a.v_scale,
                                   n - 1,
                                   "batch (cu_seqlens_q entries - 1)",
                                   host_cu ? [](const void* ctx, int64_t b) -> int64_t {
                                     const TensorView& cu = *static_cast<const TensorView*>(ctx);
                                     const int* v = static_cast<const int*>(cu.data);
                                     return v[(b + 1) * cu.stride(0)] - v[b * cu.stride(0)];
                                   }
                                           : [](const void*, int64_t) { return int64_t{0}; },
                                   &a.cu_seqlens_q,
                                   "the sequence's q rows",
                                   false};
  detail::check_paged_attention(paged);
}

void mha_extend_with_kvcache(const MhaExtendArgs& a, Stream stream) {
  validate(a);
  KilnPrefillParams p{};
  detail::fill_paged_params(p, a);
  p.k = a.k_cache.data;
  p.v = a.v_cache.data;
  p.cu_seqlens_q = static_cast<const int*>(a.cu_seqlens_q.data);
  p.batch = static_cast<int>(a.cu_seqlens_q.size(0) - 1);
  p.max_seqlen_q = a.max_seqlen_q;
  p.max_seqlen_k = static_cast<int>(a.page_table.size(1) * a.k_cache.size(1));
  p.causal = a.causal ? 1 : 0;
  p.total_q = static_cast<int>(a.q.size(0));
  while ((1 << p.page_shift) < p.page_size) ++p.page_shift;
  // Pages a TMA box of page_size rows can copy: the caches as one tensor of num_pages x page_size
  // rows (the window strip and mma.sync kernels gather e4m3 caches all the same).
  const int64_t element_bytes = dtype_size(a.k_cache.dtype);
  auto whole_pages = [&](const TensorView& cache) {
    return cache.stride(0) == cache.size(1) * cache.stride(1) && cache.stride(1) * element_bytes % 16 == 0 &&
           cache.stride(2) * element_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(cache.data) % 16 == 0 &&
           cache.size(0) * cache.size(1) <= INT32_MAX;
  };
  if (p.page_size >= 8 && whole_pages(a.k_cache) && whole_pages(a.v_cache)) {
    p.total_k = static_cast<int>(a.k_cache.size(0) * a.k_cache.size(1));
    p.kv_element_bytes = static_cast<int>(element_bytes);
  }
  if (a.q.numel() == 0) return;  // nothing to compute
  detail::OperatorCall call{detail::extend_signature_table().call_key(a),
                            [](const void* x) { return signature_of(*static_cast<const MhaExtendArgs*>(x)); },
                            &a,
                            a.q.device,
                            &p,
                            sizeof(p),
                            stream};
  detail::run_operator(call);
}

}  // namespace kiln
