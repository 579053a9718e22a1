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
  detail::fill_paged_params(p, a);
  p.k_cache = a.k_cache.data;
  p.v_cache = a.v_cache.data;
  p.batch = static_cast<int>(a.q.size(0) / a.q_len);
  p.q_len = a.q_len;
  p.max_pages_per_seq = static_cast<int>(a.page_table.size(1));
  if (a.q.numel() == 0) return;
  detail::OperatorCall call{detail::decode_signature_table().call_key(a),
                            [](const void* x) { return signature_of(*static_cast<const MhaDecodeArgs*>(x)); },
                            &a,
                            a.q.device,
                            &p,
                            sizeof(p),
                            stream,
                            &p.workspace};
  detail::run_operator(call);
}

}  // namespace kiln
