// The signature table of each operator (signature_table.hpp): signature_of(), signature_keys()
// and the hit path's call keys all come from these, and manifests are validated against them.
#include <fmt/format.h>

#include "attention/window_strip.h"
#include "kiln/author.hpp"
#include "kiln/error.hpp"
#include "moe/stream_workspace.h"
#include "ops/signature_table.hpp"

namespace kiln {
namespace detail {
namespace {

const char* dtype_text(int64_t v) { return dtype_name(static_cast<DType>(v)); }
const char* dtype_or_none_text(int64_t v) { return v < 0 ? "none" : dtype_name(static_cast<DType>(v)); }
int64_t dtype_or_none(const TensorView& t) { return t.defined() ? static_cast<int64_t>(t.dtype) : -1; }

const char* weights_text(int64_t v) {
  switch (static_cast<DType>(v)) {
    case DType::kF4E2M1x2: return "mxfp4";
    case DType::kF4E2M1x2Prepared: return "mxfp4_prepared";
    default: return "bf16";
  }
}

// -1: top-k ids and weights come precomputed.
int64_t routing_value(const MoeArgs& a) { return a.router_logits.defined() ? static_cast<int64_t>(a.routing) : -1; }
const char* routing_text(int64_t v) {
  if (v < 0) return "precomputed";
  return static_cast<MoeRouting>(v) == MoeRouting::kTopkThenSoftmax ? "topk_softmax" : "softmax_topk";
}
const char* activation_text(int64_t v) { return static_cast<MoeActivation>(v) == MoeActivation::kSiluGlu ? "silu_glu" : "swiglu_clamped"; }
const char* layout_text(int64_t v) { return static_cast<GateUpLayout>(v) == GateUpLayout::kConcatenated ? "concat" : "interleaved"; }

using Prefill = SignatureField<MhaPrefillArgs>;
using Decode = SignatureField<MhaDecodeArgs>;
using Extend = SignatureField<MhaExtendArgs>;
using KvAppend = SignatureField<KvAppendArgs>;
using Moe = SignatureField<MoeArgs>;
constexpr auto kNumber = FieldText::kNumber;
constexpr auto kFlag = FieldText::kFlag;
constexpr auto kName = FieldText::kName;

}  // namespace

const SignatureTable<MhaPrefillArgs, 9>& prefill_signature_table() {
  static const auto table = signature_table<MhaPrefillArgs>(
      {kFamilyAttention, kModePrefill},
      Prefill{"dtype", kName, [](const MhaPrefillArgs& a) { return static_cast<int64_t>(a.q.dtype); }, dtype_text},
      Prefill{"head_dim", kNumber, [](const MhaPrefillArgs& a) { return a.q.size(2); }},
      Prefill{"group", kNumber, [](const MhaPrefillArgs& a) { return a.q.size(1) / a.k.size(1); }},
      Prefill{"causal", kFlag, [](const MhaPrefillArgs& a) { return int64_t{a.causal}; }},
      Prefill{"window", kFlag, [](const MhaPrefillArgs& a) { return int64_t{a.window_left >= 0}; }},
      Prefill{"sinks", kFlag, [](const MhaPrefillArgs& a) { return int64_t{a.sinks.defined()}; }},
      Prefill{"softcap", kFlag, [](const MhaPrefillArgs& a) { return int64_t{a.softcap > 0}; }},
      Prefill{"lse", kFlag, [](const MhaPrefillArgs& a) { return int64_t{a.lse.defined()}; }},
      // Only calls whose window reaches at most kWindowStripMaxWindow keys back carry it (GPT-OSS's
      // sliding layers): they run a kernel of their own (attention/window_strip.h); other calls keep
      // their signatures.
      Prefill{"short_window", kFlag, [](const MhaPrefillArgs&) { return int64_t{1}; }, nullptr,
              [](const MhaPrefillArgs& a) { return a.window_left >= 0 && a.window_left <= kWindowStripMaxWindow; }});
  return table;
}

const SignatureTable<MhaDecodeArgs, 10>& decode_signature_table() {
  static const auto table = signature_table<MhaDecodeArgs>(
      {kFamilyAttention, kModeDecode},
      Decode{"dtype", kName, [](const MhaDecodeArgs& a) { return static_cast<int64_t>(a.q.dtype); }, dtype_text},
      Decode{"kv_dtype", kName, [](const MhaDecodeArgs& a) { return static_cast<int64_t>(a.k_cache.dtype); }, dtype_text},
      Decode{"head_dim", kNumber, [](const MhaDecodeArgs& a) { return a.q.size(2); }},
      Decode{"group", kNumber, [](const MhaDecodeArgs& a) { return a.q.size(1) / a.k_cache.size(2); }},
      Decode{"page_size", kNumber, [](const MhaDecodeArgs& a) { return a.k_cache.size(1); }},
      Decode{"q_len", kNumber, [](const MhaDecodeArgs& a) { return int64_t{a.q_len}; }},
      Decode{"window", kFlag, [](const MhaDecodeArgs& a) { return int64_t{a.window_left >= 0}; }},
      Decode{"sinks", kFlag, [](const MhaDecodeArgs& a) { return int64_t{a.sinks.defined()}; }},
      Decode{"softcap", kFlag, [](const MhaDecodeArgs& a) { return int64_t{a.softcap > 0}; }},
      Decode{"lse", kFlag, [](const MhaDecodeArgs& a) { return int64_t{a.lse.defined()}; }});
  return table;
}

const SignatureTable<MhaExtendArgs, 11>& extend_signature_table() {
  static const auto table = signature_table<MhaExtendArgs>(
      {kFamilyAttention, kModeExtend},
      Extend{"dtype", kName, [](const MhaExtendArgs& a) { return static_cast<int64_t>(a.q.dtype); }, dtype_text},
      Extend{"kv_dtype", kName, [](const MhaExtendArgs& a) { return static_cast<int64_t>(a.k_cache.dtype); }, dtype_text},
      Extend{"head_dim", kNumber, [](const MhaExtendArgs& a) { return a.q.size(2); }},
      Extend{"group", kNumber, [](const MhaExtendArgs& a) { return a.q.size(1) / a.k_cache.size(2); }},
      Extend{"page_size", kNumber, [](const MhaExtendArgs& a) { return a.k_cache.size(1); }},
      Extend{"causal", kFlag, [](const MhaExtendArgs& a) { return int64_t{a.causal}; }},
      Extend{"window", kFlag, [](const MhaExtendArgs& a) { return int64_t{a.window_left >= 0}; }},
      Extend{"sinks", kFlag, [](const MhaExtendArgs& a) { return int64_t{a.sinks.defined()}; }},
      Extend{"softcap", kFlag, [](const MhaExtendArgs& a) { return int64_t{a.softcap > 0}; }},
      Extend{"lse", kFlag, [](const MhaExtendArgs& a) { return int64_t{a.lse.defined()}; }},
      // As prefill's: only calls whose window reaches at most kWindowStripMaxWindow keys back.
      Extend{"short_window", kFlag, [](const MhaExtendArgs&) { return int64_t{1}; }, nullptr,
             [](const MhaExtendArgs& a) { return a.window_left >= 0 && a.window_left <= kWindowStripMaxWindow; }});
  return table;
}

const SignatureTable<KvAppendArgs, 2>& kv_append_signature_table() {
  static const auto table = signature_table<KvAppendArgs>(
      {kFamilyAttention, kModeKvAppend},
      KvAppend{"dtype", kName, [](const KvAppendArgs& a) { return static_cast<int64_t>(a.k.dtype); }, dtype_text},
      KvAppend{"kv_dtype", kName, [](const KvAppendArgs& a) { return static_cast<int64_t>(a.k_cache.dtype); }, dtype_text});
  return table;
}

const SignatureTable<MoeArgs, 15>& moe_signature_table() {
  static const auto table = signature_table<MoeArgs>(
      {kFamilyMoe, kModeApply}, Moe{"dtype", kName, [](const MoeArgs& a) { return static_cast<int64_t>(a.x.dtype); }, dtype_text},
      Moe{"weights", kName, [](const MoeArgs& a) { return static_cast<int64_t>(a.w13.dtype); }, weights_text},
      Moe{"hidden", kNumber, [](const MoeArgs& a) { return a.x.size(1); }},
      Moe{"inter", kNumber, [](const MoeArgs& a) { return a.w13.size(1) / 2; }},
      Moe{"experts", kNumber, [](const MoeArgs& a) { return a.w13.size(0); }},
      Moe{"top_k", kNumber, [](const MoeArgs& a) { return int64_t{a.top_k}; }}, Moe{"routing", kName, routing_value, routing_text},
      Moe{"logits", kName, [](const MoeArgs& a) { return static_cast<int64_t>(a.router_logits.dtype); }, dtype_text,
          [](const MoeArgs& a) { return a.router_logits.defined(); }},
      Moe{"renormalize", kFlag, [](const MoeArgs& a) { return int64_t{a.renormalize}; }, nullptr,
          [](const MoeArgs& a) { return a.router_logits.defined() && a.routing == MoeRouting::kSoftmaxThenTopk; }},
      Moe{"activation", kName, [](const MoeArgs& a) { return static_cast<int64_t>(a.activation); }, activation_text},
      Moe{"layout", kName, [](const MoeArgs& a) { return static_cast<int64_t>(a.gate_up_layout); }, layout_text},
      Moe{"w13_bias", kName, [](const MoeArgs& a) { return dtype_or_none(a.w13_bias); }, dtype_or_none_text},
      Moe{"w2_bias", kName, [](const MoeArgs& a) { return dtype_or_none(a.w2_bias); }, dtype_or_none_text},
      // Only W4A8 calls carry it: bf16 activations keep the signatures (and cache keys) they had.
      Moe{"act_dtype", kName, [](const MoeArgs& a) { return static_cast<int64_t>(a.activation_dtype); }, dtype_text,
          [](const MoeArgs& a) { return a.activation_dtype != DType::kBF16; }},
      // Only MXFP4 calls whose experts average at least 96 routed pairs carry it: they run a build
      // of their own (kernel-sources/moe/stream_workspace.h); the other calls keep their signatures.
      Moe{"large_batch", kFlag, [](const MoeArgs&) { return int64_t{1}; }, nullptr,
          [](const MoeArgs& a) { return is_mxfp4(a.w13.dtype) && kiln_moe_large_batch(a.x.size(0), a.top_k, a.w13.size(0)) != 0; }});
  return table;
}

}  // namespace detail

Signature signature_of(const MhaPrefillArgs& args) { return detail::prefill_signature_table().signature(args); }
Signature signature_of(const MhaDecodeArgs& args) { return detail::decode_signature_table().signature(args); }
Signature signature_of(const MhaExtendArgs& args) { return detail::extend_signature_table().signature(args); }
Signature signature_of(const KvAppendArgs& args) { return detail::kv_append_signature_table().signature(args); }
Signature signature_of(const MoeArgs& args) { return detail::moe_signature_table().signature(args); }

void validate_signature(const Signature& sig) {
  const std::string name = operator_name(sig.op());
  if (sig.op() == detail::prefill_signature_table().op) return detail::prefill_signature_table().validate(sig, name);
  if (sig.op() == detail::decode_signature_table().op) return detail::decode_signature_table().validate(sig, name);
  if (sig.op() == detail::extend_signature_table().op) return detail::extend_signature_table().validate(sig, name);
  if (sig.op() == detail::kv_append_signature_table().op) return detail::kv_append_signature_table().validate(sig, name);
  if (sig.op() == detail::moe_signature_table().op) return detail::moe_signature_table().validate(sig, name);
  throw Error(ErrorCode::kInvalidArgument, fmt::format("operator {}.{} has no signature", sig.op().family, sig.op().mode));
}

SignatureKeys signature_keys(const OperatorId& op) {
  if (op == detail::prefill_signature_table().op) return detail::prefill_signature_table().keys();
  if (op == detail::decode_signature_table().op) return detail::decode_signature_table().keys();
  if (op == detail::extend_signature_table().op) return detail::extend_signature_table().keys();
  if (op == detail::kv_append_signature_table().op) return detail::kv_append_signature_table().keys();
  if (op == detail::moe_signature_table().op) return detail::moe_signature_table().keys();
  throw Error(ErrorCode::kInvalidArgument, fmt::format("operator {}.{} has no signature keys", op.family, op.mode));
}

}  // namespace kiln
