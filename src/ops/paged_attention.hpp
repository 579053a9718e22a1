// What the operators over a paged KV cache share (mha_decode_with_kvcache,
// mha_extend_with_kvcache): checks of q, out, the caches, the page table, cache_seqlens, lse,
// sinks and the scalars, each failure a kiln::Error(kInvalidArgument) naming the argument.
#pragma once

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

}  // namespace kiln::detail
