// moe_apply: argument validation, the selector's signature, the parameter block.
#include <fmt/format.h>

#include "jit/operator_call.hpp"
#include "kiln/author.hpp"
#include "kiln/error.hpp"
#include "moe/params.h"
#include "ops/signature_table.hpp"
#include "ops/validate.hpp"

namespace kiln {

using detail::check_dim;
using detail::check_optional_tensor;
using detail::check_same_device;
using detail::check_tensor;
using detail::invalid_argument;

void validate(const MoeArgs& a) {
  check_tensor(a.x, {"x", 2, {DType::kBF16}});
  check_tensor(a.out, {"out", 2, {DType::kBF16}});
  if (a.x.device == kHostDevice) invalid_argument("x: must be in device memory, got host memory");
  const int64_t tokens = a.x.size(0), hidden = a.x.size(1);
  check_dim(a.out, "out", 0, tokens, "x's token count T");
  check_dim(a.out, "out", 1, hidden, "x's hidden size H");
  if (hidden <= 0 || hidden % 8 != 0)
    invalid_argument(fmt::format("x: hidden size H (dimension 1) must be a positive multiple of 8, got {}", hidden));

  if (static_cast<int>(a.routing) < 0 || static_cast<int>(a.routing) > 1)
    invalid_argument(fmt::format("routing: must be 0 (top-k then softmax) or 1 (softmax then top-k), got {}", static_cast<int>(a.routing)));
  if (static_cast<int>(a.activation) < 0 || static_cast<int>(a.activation) > 1)
    invalid_argument(fmt::format("activation: must be 0 (SiLU-GLU) or 1 (clamped SwiGLU), got {}", static_cast<int>(a.activation)));
  if (static_cast<int>(a.gate_up_layout) < 0 || static_cast<int>(a.gate_up_layout) > 1)
    invalid_argument(
        fmt::format("gate_up_layout: must be 0 (concatenated) or 1 (interleaved), got {}", static_cast<int>(a.gate_up_layout)));

  if (a.activation_dtype != DType::kBF16 && a.activation_dtype != DType::kF8E4M3)
    invalid_argument(fmt::format("activation_dtype: must be bf16 or e4m3 (W4A8), got {}", dtype_name(a.activation_dtype)));

  // Weights decide E and I.
  // w2 in w13's format: prepared MXFP4 weights (moe_prepare_weights) both prepared.
  const std::initializer_list<DType> weight_types = {DType::kBF16, DType::kF4E2M1x2, DType::kF4E2M1x2Prepared};
  check_tensor(a.w13, {"w13", 3, weight_types});
  const bool mxfp4 = detail::is_mxfp4(a.w13.dtype);
  check_tensor(a.w2, {"w2", 3, {a.w13.dtype}});
  const int64_t experts = a.w13.size(0);
  if (experts <= 0) invalid_argument("w13: expert count E (dimension 0) must be positive");
  if (a.w13.size(1) <= 0 || a.w13.size(1) % 2 != 0)
    invalid_argument(fmt::format("w13: dimension 1 must be 2 * I (gate and up), got {}", a.w13.size(1)));
  const int64_t inter = a.w13.size(1) / 2;
  const int64_t pack = mxfp4 ? 2 : 1;  // fp4 values per stored element
  check_dim(a.w13, "w13", 2, hidden / pack, mxfp4 ? "H / 2 (packed e2m1)" : "x's hidden size H");
  check_dim(a.w2, "w2", 0, experts, "w13's expert count E");
  check_dim(a.w2, "w2", 1, hidden, "x's hidden size H");
  if (a.activation_dtype == DType::kF8E4M3 && !mxfp4)
    invalid_argument(fmt::format("activation_dtype: e4m3 (W4A8) needs MXFP4 weights (e2m1x2), got w13 in {}", dtype_name(a.w13.dtype)));
  if (mxfp4) {
    if (hidden % 32 != 0) invalid_argument(fmt::format("x: hidden size H = {} must be a multiple of 32 for MXFP4 weights", hidden));
    if (inter % 32 != 0) invalid_argument(fmt::format("w13: intermediate size I = {} must be a multiple of 32 for MXFP4 weights", inter));
    check_dim(a.w2, "w2", 2, inter / 2, "I / 2 (packed e2m1)");
    check_tensor(a.w13_scale, {"w13_scale", 3, {DType::kE8M0}, 1});
    check_tensor(a.w2_scale, {"w2_scale", 3, {DType::kE8M0}, 1});
    check_dim(a.w13_scale, "w13_scale", 0, experts, "E");
    check_dim(a.w13_scale, "w13_scale", 1, 2 * inter, "2 * I");
    check_dim(a.w13_scale, "w13_scale", 2, hidden / 32, "H / 32");
    check_dim(a.w2_scale, "w2_scale", 0, experts, "E");
    check_dim(a.w2_scale, "w2_scale", 1, hidden, "H");
    check_dim(a.w2_scale, "w2_scale", 2, inter / 32, "I / 32");
  } else {
    check_dim(a.w2, "w2", 2, inter, "w13's intermediate size I");
    if (a.w13_scale.defined() || a.w2_scale.defined())
      invalid_argument("w13_scale/w2_scale: only MXFP4 (e2m1x2) weights take scales; these weights are bf16");
    if (inter % 8 != 0) invalid_argument(fmt::format("w13: intermediate size I = {} must be a multiple of 8", inter));
  }
  check_optional_tensor(a.w13_bias, {"w13_bias", 2, {DType::kF32, DType::kBF16}, 4});
  check_optional_tensor(a.w2_bias, {"w2_bias", 2, {DType::kF32, DType::kBF16}, 4});
  if (a.w13_bias.defined()) {
    check_dim(a.w13_bias, "w13_bias", 0, experts, "E");
    check_dim(a.w13_bias, "w13_bias", 1, 2 * inter, "2 * I");
  }
  if (a.w2_bias.defined()) {
    check_dim(a.w2_bias, "w2_bias", 0, experts, "E");
    check_dim(a.w2_bias, "w2_bias", 1, hidden, "H");
  }

  // Routing: logits, or precomputed ids + weights; not both.
  const bool have_logits = a.router_logits.defined();
  const bool have_ids = a.topk_ids.defined() || a.topk_weights.defined();
  if (have_logits == have_ids) invalid_argument("router_logits / topk_ids+topk_weights: give exactly one way of routing");
  if (a.top_k < 1 || a.top_k > experts) invalid_argument(fmt::format("top_k: must be in [1, E = {}], got {}", experts, a.top_k));
  if (have_logits) {
    check_tensor(a.router_logits, {"router_logits", 2, {DType::kF32, DType::kBF16}, 4});
    check_dim(a.router_logits, "router_logits", 0, tokens, "T");
    check_dim(a.router_logits, "router_logits", 1, experts, "w13's expert count E");
  } else {
    check_tensor(a.topk_ids, {"topk_ids", 2, {DType::kI32}, 4});
    check_tensor(a.topk_weights, {"topk_weights", 2, {DType::kF32}, 4});
    check_dim(a.topk_ids, "topk_ids", 0, tokens, "T");
    check_dim(a.topk_ids, "topk_ids", 1, a.top_k, "top_k");
    for (int i = 0; i < 2; ++i) check_dim(a.topk_weights, "topk_weights", i, a.topk_ids.size(i), "topk_ids' size");
    if (a.topk_ids.stride(0) != a.topk_weights.stride(0)) invalid_argument("topk_weights: row stride must equal topk_ids' row stride");
    if (a.topk_ids.device == kHostDevice) {
      const int* ids = static_cast<const int*>(a.topk_ids.data);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < a.top_k; ++j) {
          const int e = ids[t * a.topk_ids.stride(0) + j];
          if (e < 0 || e >= experts) invalid_argument(fmt::format("topk_ids[{}][{}] = {} is outside [0, E = {})", t, j, e, experts));
        }
      }
    }
  }
  for (auto [t, name] : {std::pair{&a.out, "out"},
                         {&a.w13, "w13"},
                         {&a.w2, "w2"},
                         {&a.w13_scale, "w13_scale"},
                         {&a.w2_scale, "w2_scale"},
                         {&a.w13_bias, "w13_bias"},
                         {&a.w2_bias, "w2_bias"},
                         {&a.router_logits, "router_logits"}}) {
    if (t->defined() && t->device == kHostDevice) invalid_argument(fmt::format("{}: must be in device memory, got host memory", name));
    check_same_device(*t, name, a.x, "x");
  }
  check_same_device(a.topk_ids, "topk_ids", a.x, "x");
  check_same_device(a.topk_weights, "topk_weights", a.x, "x");
  detail::check_disjoint(a.out, "out", {{&a.x, "x"}, {&a.w13, "w13"}, {&a.w2, "w2"}, {&a.router_logits, "router_logits"}});
}

void moe_apply(const MoeArgs& a, Stream stream) {
  validate(a);
  KilnMoeParams p{};
  p.x = a.x.data;
  p.out = a.out.data;
  p.router_logits = a.router_logits.data;
  p.topk_ids = static_cast<const int*>(a.topk_ids.data);
  p.topk_weights = static_cast<const float*>(a.topk_weights.data);
  p.w13 = a.w13.data;
  p.w13_scale = static_cast<const unsigned char*>(a.w13_scale.data);
  p.w13_bias = a.w13_bias.data;
  p.w2 = a.w2.data;
  p.w2_scale = static_cast<const unsigned char*>(a.w2_scale.data);
  p.w2_bias = a.w2_bias.data;
  p.x_row_stride = a.x.stride(0);
  p.out_row_stride = a.out.stride(0);
  p.logits_row_stride = a.router_logits.defined() ? a.router_logits.stride(0) : 0;
  p.topk_row_stride = a.topk_ids.defined() ? a.topk_ids.stride(0) : 0;
  p.w13_expert_stride = a.w13.stride(0);
  p.w13_row_stride = a.w13.stride(1);
  p.w2_expert_stride = a.w2.stride(0);
  p.w2_row_stride = a.w2.stride(1);
  if (a.w13_scale.defined()) {
    p.w13_scale_expert_stride = a.w13_scale.stride(0);
    p.w13_scale_row_stride = a.w13_scale.stride(1);
    p.w2_scale_expert_stride = a.w2_scale.stride(0);
    p.w2_scale_row_stride = a.w2_scale.stride(1);
  }
  p.w13_bias_expert_stride = a.w13_bias.defined() ? a.w13_bias.stride(0) : 0;
  p.w2_bias_expert_stride = a.w2_bias.defined() ? a.w2_bias.stride(0) : 0;
  p.num_tokens = static_cast<int>(a.x.size(0));
  p.hidden = static_cast<int>(a.x.size(1));
  p.intermediate = static_cast<int>(a.w13.size(1) / 2);
  p.num_experts = static_cast<int>(a.w13.size(0));
  p.top_k = a.top_k;
  p.renormalize = a.renormalize ? 1 : 0;
  p.activations_mxfp8 = a.activation_dtype == DType::kF8E4M3 ? 1 : 0;
  if (a.x.numel() == 0) return;
  detail::OperatorCall call{detail::moe_signature_table().call_key(a),
                            [](const void* x) { return signature_of(*static_cast<const MoeArgs*>(x)); },
                            &a,
                            a.x.device,
                            &p,
                            sizeof(p),
                            stream,
                            &p.workspace};
  detail::run_operator(call);
}

}  // namespace kiln
