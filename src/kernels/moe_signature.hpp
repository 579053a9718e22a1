// What the MoE kernel registrations share: the signatures every MoE kernel runs and the template
// arguments its signature maps to (moe_common.cuh's enumerations, in the same order for each
// kernel template).
#pragma once

#include <optional>
#include <string>

#include <fmt/format.h>

#include "kiln/registry.hpp"

namespace kiln::detail {

constexpr int kMoeMaxTopK = 32;  // kMoeMaxTopK in kernel-sources/moe/moe_common.cuh

inline int moe_bias_kind(const std::string& bias) { return bias == "none" ? 0 : bias == "f32" ? 1 : 2; }

// W4A8: act_dtype=e4m3 (absent with bf16 activations), MXFP4 weights only.
inline bool moe_mxfp8_activations(const Signature& sig) { return sig.has("act_dtype") && sig.get("act_dtype") == "e4m3"; }

// bf16 activations, bf16 or MXFP4 weights (standard or prepared), or W4A8; top_k up to kMoeMaxTopK.
inline std::optional<std::string> moe_accepts(const Signature& sig) {
  if (sig.get("dtype") != "bf16") return fmt::format("dtype {} unsupported (supported: bf16)", sig.get("dtype"));
  const std::string& w = sig.get("weights");
  if (w != "bf16" && w != "mxfp4" && w != "mxfp4_prepared")
    return fmt::format("weights {} unsupported (supported: bf16, mxfp4, mxfp4_prepared)", w);
  if (sig.has("act_dtype") && sig.get("act_dtype") != "bf16" && sig.get("act_dtype") != "e4m3")
    return fmt::format("act_dtype {} unsupported (supported: bf16, e4m3)", sig.get("act_dtype"));
  if (moe_mxfp8_activations(sig) && w == "bf16") return std::string("act_dtype e4m3 needs MXFP4 weights");
  if (sig.get_int("top_k") > kMoeMaxTopK) return fmt::format("top_k {} unsupported (at most {})", sig.get_int("top_k"), kMoeMaxTopK);
  return std::nullopt;
}

// moe_common.cuh's MoeWeightFormat of the signature's weights.
inline int moe_weight_format(const Signature& sig) {
  const std::string& w = sig.get("weights");
  return w == "mxfp4" ? 1 : w == "mxfp4_prepared" ? 2 : 0;
}

// "kiln::moe_apply_reference<format, activation, layout, routing, logits_bf16, bias13, bias2, act_mxfp8>"
inline std::string moe_template_instance(const char* kernel_template, const Signature& sig) {
  const std::string& routing = sig.get("routing");
  const int routing_kind = routing == "topk_softmax" ? 0 : routing == "softmax_topk" ? 1 : 2;
  const bool logits_bf16 = sig.has("logits") && sig.get("logits") == "bf16";
  return fmt::format("{}<{}, {}, {}, {}, {}, {}, {}, {}>", kernel_template, moe_weight_format(sig),
                     sig.get("activation") == "swiglu_clamped" ? 1 : 0, sig.get("layout") == "interleaved" ? 1 : 0, routing_kind,
                     logits_bf16 ? "true" : "false", moe_bias_kind(sig.get("w13_bias")), moe_bias_kind(sig.get("w2_bias")),
                     moe_mxfp8_activations(sig) ? "true" : "false");
}

}  // namespace kiln::detail
