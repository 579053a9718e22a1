// What the operators over a paged KV cache share (mha_decode_with_kvcache,
// mha_extend_with_kvcache): checks of q, out, the caches, the page table, cache_seqlens, lse,
// sinks and the scalars, each failure a kiln::Error(kInvalidArgument) naming the argument.
#pragma once

#include <cmath>
#include <cstdint>

#include "kiln/tensor.hpp"

namespace kiln::detail {

struct PagedAttentionArgs {
  const TensorView *q, *k_cache, *v_cache, *page_table, *cache_seqlens, *out, *lse, *sinks;
  float softmax_scale, softcap;
  int32_t window_left;
  float k_scale, v_scale;
  int64_t batch;           // rows page_table and cache_seqlens must have
  const char* batch_what;  // how the caller's batch is counted, for messages
  // With host-resident cache_seqlens: the least non-zero length sequence b may have (its new
  // tokens are in the cache). `min_len_why` names it in the message.
  int64_t (*min_len)(const void* ctx, int64_t b);
  const void* min_len_ctx;
  const char* min_len_why;
  bool empty_allowed;  // a length of 0 is allowed whatever min_len says (the output is zeros)
};

// True for the page sizes the paged kernels take: powers of two from 1 to 256.
bool supported_page_size(int64_t page_size);

void check_paged_attention(const PagedAttentionArgs& a);

// The parameter-block fields decode and extend share (KilnDecodeParams, and KilnPrefillParams
// with a page table), from their validated arguments: q, out, lse, sinks, page table and lengths
// with their strides, the caches' strides, heads, page size, window, scale, softcap, e4m3 scales.
// The cache pointers are named differently in the two blocks: the caller sets them.
template <typename Params, typename Args>
void fill_paged_params(Params& p, const Args& a) {
  p.q = a.q.data;
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
  p.num_heads_q = static_cast<int>(a.q.size(1));
  p.num_heads_kv = static_cast<int>(a.k_cache.size(2));
  p.head_dim = static_cast<int>(a.q.size(2));
  p.page_size = static_cast<int>(a.k_cache.size(1));
  p.window_left = a.window_left;
  p.softmax_scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = a.softcap;
  const bool fp8 = a.k_cache.dtype == DType::kF8E4M3;
  p.k_scale = fp8 ? a.k_scale : 1.0f;
  p.v_scale = fp8 ? a.v_scale : 1.0f;
}

}  // namespace kiln::detail
