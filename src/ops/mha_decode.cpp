// mha_decode_with_kvcache: argument validation, the selector's signature, the parameter block.
#include <cmath>

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

void validate(const MhaDecodeArgs& a) {
  if (a.q_len < 1 || a.q_len > 16) invalid_argument(fmt::format("q_len: must be 1..16, got {}", a.q_len));
  check_tensor(a.q, {"q", 3, {DType::kBF16, DType::kF16}});
  const int64_t rows = a.q.size(0);
  if (rows % a.q_len != 0) {
    invalid_argument(fmt::format("q: dimension 0 ({}) must be batch * q_len (q_len = {})", rows, a.q_len));
  }
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
                                   rows / a.q_len,
                                   "batch (q rows / q_len)",
                                   [](const void* ctx, int64_t) { return int64_t{static_cast<const MhaDecodeArgs*>(ctx)->q_len}; },
                                   &a,
                                   "q_len",
                                   true};
  detail::check_paged_attention(paged);
}

void mha_decode_with_kvcache(const MhaDecodeArgs& a, Stream stream) {
  validate(a);
  KilnDecodeParams p{};
  p.q = a.q.data;
  p.k_cache = a.k_cache.data;
  p.v_cache = a.v_cache.data;
  p.out = a.out.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.sinks = static_cast<const float*>(a.sinks.data);
  p.page_table = static_cast<const int*>(a.page_table.data);
  p.cache_seqlens = static_cast<const int*>(a.cache_seqlens.data);
  p.q_row_stride = a.q.stride(0);
  p.q_head_stride = a.q.stride(1);
  p.k_page_stride = a.k_cache.stride(0);
  p.k_row_stride = a.k_cache.stride(1);
  p.k_head_stride = a.k_cache.stride(2);
  p.v_page_stride = a.v_cache.stride(0);
  p.v_row_stride = a.v_cache.stride(1);
  p.v_head_stride = a.v_cache.stride(2);
  p.out_row_stride = a.out.stride(0);
  p.out_head_stride = a.out.stride(1);
  p.lse_row_stride = a.lse.defined() ? a.lse.stride(0) : 0;
  p.page_table_stride = a.page_table.stride(0);
  p.batch = static_cast<int>(a.q.size(0) / a.q_len);
  p.q_len = a.q_len;
  p.num_heads_q = static_cast<int>(a.q.size(1));
  p.num_heads_kv = static_cast<int>(a.k_cache.size(2));
  p.head_dim = static_cast<int>(a.q.size(2));
  p.page_size = static_cast<int>(a.k_cache.size(1));
  p.max_pages_per_seq = static_cast<int>(a.page_table.size(1));
  p.window_left = a.window_left;
  p.softmax_scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = a.softcap;
  p.k_scale = a.k_cache.dtype == DType::kF8E4M3 ? a.k_scale : 1.0f;
  p.v_scale = a.k_cache.dtype == DType::kF8E4M3 ? a.v_scale : 1.0f;
  if (a.q.numel() == 0) return;
  detail::OperatorCall call{detail::decode_signature_table().call_key(a),
                            [](const void* x) { return signature_of(*static_cast<const MhaDecodeArgs*>(x)); },
                            &a,
                            a.q.device,
                            &p,
                            stream,
                            &p.workspace};
  detail::run_operator(call);
}

}  // namespace kiln
