// mha_prefill: argument validation and the parameter block.
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "attention/params.h"
#include "jit/operator_call.hpp"
#include "kiln/author.hpp"
#include "kiln/error.hpp"
#include "ops/signature_table.hpp"
#include "ops/validate.hpp"

namespace kiln {

using detail::check_dim;
using detail::check_host_cu_seqlens;
using detail::check_optional_tensor;
using detail::check_same_device;
using detail::check_tensor;
using detail::invalid_argument;

void validate(const MhaPrefillArgs& a) {
  const std::initializer_list<DType> half_types = {DType::kBF16, DType::kF16};
  check_tensor(a.q, {"q", 3, half_types});
  check_tensor(a.k, {"k", 3, half_types});
  check_tensor(a.v, {"v", 3, half_types});
  check_tensor(a.out, {"out", 3, half_types});
  check_tensor(a.cu_seqlens_q, {"cu_seqlens_q", 1, {DType::kI32}, 4});
  check_tensor(a.cu_seqlens_k, {"cu_seqlens_k", 1, {DType::kI32}, 4});
  check_optional_tensor(a.lse, {"lse", 2, {DType::kF32}, 4});
  check_optional_tensor(a.sinks, {"sinks", 1, {DType::kF32}, 4});
  if (a.q.device == kHostDevice) invalid_argument("q: must be in device memory, got host memory");
  for (auto [t, name] : {std::pair{&a.k, "k"}, {&a.v, "v"}, {&a.out, "out"}, {&a.lse, "lse"}}) {
    if (t->defined() && t->device == kHostDevice) {
      invalid_argument(fmt::format("{}: must be in device memory, got host memory", name));
    }
    check_same_device(*t, name, a.q, "q");
  }
  check_same_device(a.cu_seqlens_q, "cu_seqlens_q", a.q, "q");
  check_same_device(a.cu_seqlens_k, "cu_seqlens_k", a.q, "q");
  check_same_device(a.sinks, "sinks", a.q, "q");

  for (auto [t, name] : {std::pair{&a.k, "k"}, {&a.v, "v"}, {&a.out, "out"}}) {
    if (t->dtype != a.q.dtype) {
      invalid_argument(fmt::format("{}: dtype {} must match q's dtype {}", name, dtype_name(t->dtype), dtype_name(a.q.dtype)));
    }
  }
  const int64_t total_q = a.q.size(0), hq = a.q.size(1), d = a.q.size(2);
  const int64_t total_k = a.k.size(0), hkv = a.k.size(1);
  if (d <= 0 || d % 8 != 0) invalid_argument(fmt::format("q: head_dim (dimension 2) must be a positive multiple of 8, got {}", d));
  if (hq <= 0) invalid_argument("q: number of heads (dimension 1) must be positive");
  if (hkv <= 0) invalid_argument("k: number of heads (dimension 1) must be positive");
  check_dim(a.k, "k", 2, d, "q's head_dim");
  check_dim(a.v, "v", 0, total_k, "k's total_k");
  check_dim(a.v, "v", 1, hkv, "k's Hkv");
  check_dim(a.v, "v", 2, d, "q's head_dim");
  if (hq % hkv != 0) {
    invalid_argument(fmt::format("q/k: Hq = {} must be a multiple of Hkv = {}", hq, hkv));
  }
  for (int i = 0; i < 3; ++i) check_dim(a.out, "out", i, a.q.size(i), "q's size");
  const int64_t n = a.cu_seqlens_q.size(0);
  if (n < 2) invalid_argument(fmt::format("cu_seqlens_q: needs batch + 1 >= 2 entries, got {}", n));
  check_dim(a.cu_seqlens_k, "cu_seqlens_k", 0, n, "cu_seqlens_q's length (batch + 1)");
  if (a.max_seqlen_q < 0 || a.max_seqlen_q > total_q) {
    invalid_argument(fmt::format("max_seqlen_q: must be in [0, total_q = {}], got {}", total_q, a.max_seqlen_q));
  }
  if (a.max_seqlen_k < 0 || a.max_seqlen_k > total_k) {
    invalid_argument(fmt::format("max_seqlen_k: must be in [0, total_k = {}], got {}", total_k, a.max_seqlen_k));
  }
  check_host_cu_seqlens(a.cu_seqlens_q, "cu_seqlens_q", total_q, a.max_seqlen_q, "max_seqlen_q");
  check_host_cu_seqlens(a.cu_seqlens_k, "cu_seqlens_k", total_k, a.max_seqlen_k, "max_seqlen_k");
  if (a.lse.defined()) {
    check_dim(a.lse, "lse", 0, total_q, "total_q");
    check_dim(a.lse, "lse", 1, hq, "Hq");
  }
  if (a.sinks.defined()) check_dim(a.sinks, "sinks", 0, hq, "Hq");
  if (!std::isfinite(a.softmax_scale)) invalid_argument("softmax_scale: must be finite");
  if (!std::isfinite(a.softcap) || a.softcap < 0) invalid_argument(fmt::format("softcap: must be >= 0 (0 = none), got {}", a.softcap));
  if (a.window_left < -1) invalid_argument(fmt::format("window_left: must be -1 (none) or >= 0, got {}", a.window_left));
  detail::check_disjoint(a.out, "out", {{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.lse, "lse"}});
  detail::check_disjoint(a.lse, "lse", {{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}});
}

void mha_prefill(const MhaPrefillArgs& a, Stream stream) {
  validate(a);
  KilnPrefillParams p{};
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.out = a.out.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.sinks = static_cast<const float*>(a.sinks.data);
  p.cu_seqlens_q = static_cast<const int*>(a.cu_seqlens_q.data);
  p.cu_seqlens_k = static_cast<const int*>(a.cu_seqlens_k.data);
  p.q_row_stride = a.q.stride(0);
  p.q_head_stride = a.q.stride(1);
  p.k_row_stride = a.k.stride(0);
  p.k_head_stride = a.k.stride(1);
  p.v_row_stride = a.v.stride(0);
  p.v_head_stride = a.v.stride(1);
  p.out_row_stride = a.out.stride(0);
  p.out_head_stride = a.out.stride(1);
  p.lse_row_stride = a.lse.defined() ? a.lse.stride(0) : 0;
  p.batch = static_cast<int>(a.cu_seqlens_q.size(0) - 1);
  p.num_heads_q = static_cast<int>(a.q.size(1));
  p.num_heads_kv = static_cast<int>(a.k.size(1));
  p.head_dim = static_cast<int>(a.q.size(2));
  p.max_seqlen_q = a.max_seqlen_q;
  p.max_seqlen_k = a.max_seqlen_k;
  p.causal = a.causal ? 1 : 0;
  p.window_left = a.window_left;
  p.softmax_scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  p.softcap = a.softcap;
  p.total_q = static_cast<int>(a.q.size(0));
  p.total_k = static_cast<int>(a.k.size(0));
  p.kv_element_bytes = 2;
  if (a.q.numel() == 0) return;  // nothing to compute
  detail::OperatorCall call{detail::prefill_signature_table().call_key(a),
                            [](const void* x) { return signature_of(*static_cast<const MhaPrefillArgs*>(x)); },
                            &a,
                            a.q.device,
                            &p,
                            sizeof(p),
                            stream};
  detail::run_operator(call);
}

}  // namespace kiln
