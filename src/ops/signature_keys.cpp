// The signature keys of each operator, in one place: manifests are validated against them, and
// tests check that signature_of() produces exactly these.
#include <fmt/format.h>

#include "kiln/error.hpp"
#include "kiln/ops.hpp"

namespace kiln {

SignatureKeys signature_keys(const OperatorId& op) {
  if (op == OperatorId{kFamilyAttention, kModePrefill}) {
    return {{"dtype", "head_dim", "group", "causal", "window", "sinks", "softcap", "lse"}, {}};
  }
  if (op == OperatorId{kFamilyAttention, kModeDecode}) {
    return {{"dtype", "kv_dtype", "head_dim", "group", "page_size", "q_len", "window", "sinks", "softcap", "lse"}, {}};
  }
  if (op == OperatorId{kFamilyMoe, kModeApply}) {
    return {{"dtype", "weights", "hidden", "inter", "experts", "top_k", "routing", "activation", "layout", "w13_bias", "w2_bias"},
            {"logits", "renormalize"}};
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("operator {}.{} has no signature keys", op.family, op.mode));
}

}  // namespace kiln
