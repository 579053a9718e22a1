// Complete operator signatures for tests: every key signature_of() produces, with the attention
// flags (window, sinks, softcap, lse) off.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/author.hpp"
#include "kiln/registry.hpp"

namespace kiln::test {

inline Signature prefill_signature(const std::string& dtype, int64_t head_dim, int64_t group, bool causal = true) {
  Signature s({kFamilyAttention, kModePrefill});
  s.set("dtype", dtype).set("head_dim", head_dim).set("group", group).set_flag("causal", causal);
  for (const char* f : {"window", "sinks", "softcap", "lse"}) s.set_flag(f, false);
  return s;
}

inline Signature decode_signature(const std::string& dtype, const std::string& kv_dtype, int64_t head_dim, int64_t group,
                                  int64_t page_size = 16, int64_t q_len = 1) {
  Signature s({kFamilyAttention, kModeDecode});
  s.set("dtype", dtype).set("kv_dtype", kv_dtype).set("head_dim", head_dim).set("group", group);
  s.set("page_size", page_size).set("q_len", q_len);
  for (const char* f : {"window", "sinks", "softcap", "lse"}) s.set_flag(f, false);
  return s;
}

inline Signature extend_signature(const std::string& dtype, const std::string& kv_dtype, int64_t head_dim, int64_t group,
                                  int64_t page_size = 64, bool causal = true) {
  Signature s({kFamilyAttention, kModeExtend});
  s.set("dtype", dtype).set("kv_dtype", kv_dtype).set("head_dim", head_dim).set("group", group);
  s.set("page_size", page_size).set_flag("causal", causal);
  for (const char* f : {"window", "sinks", "softcap", "lse"}) s.set_flag(f, false);
  return s;
}

inline Signature kv_append_signature(const std::string& dtype, const std::string& kv_dtype) {
  Signature s({kFamilyAttention, kModeKvAppend});
  s.set("dtype", dtype).set("kv_dtype", kv_dtype);
  return s;
}

// Router logits, top-k then softmax; the rest as given.
inline Signature moe_signature(const std::string& weights, int64_t hidden, int64_t inter, int64_t experts, int64_t top_k,
                               const std::string& logits, const std::string& activation, const std::string& layout,
                               const std::string& bias) {
  Signature m({kFamilyMoe, kModeApply});
  m.set("dtype", "bf16").set("weights", weights).set("hidden", hidden).set("inter", inter);
  m.set("experts", experts).set("top_k", top_k).set("routing", "topk_softmax").set("logits", logits);
  m.set("activation", activation).set("layout", layout).set("w13_bias", bias).set("w2_bias", bias);
  return m;
}

}  // namespace kiln::test
