// One table per operator says which properties of a call decide its kernel. Both views of a call
// are derived from it: the Signature the selector sees (built on a miss) and the packed CallKey
// the hit path looks kernels up by (built on every call, without strings). Equal keys therefore
// mean equal signatures.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "jit/operator_call.hpp"
#include "kiln/author.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

// How a field's packed value is written in the signature.
enum class FieldText {
  kNumber,  // the value itself: head_dim=128
  kFlag,    // 0 or 1: causal=1
  kName,    // a name the field's `name_of` gives the value: dtype=bf16
};

template <typename Args>
struct SignatureField {
  const char* key;
  FieldText text;
  int64_t (*value)(const Args& args);
  const char* (*name_of)(int64_t value) = nullptr;  // kName only
  bool (*present)(const Args& args) = nullptr;      // optional fields: absent when it says false
};

// A CallKey slot for a field the call does not have.
inline constexpr int64_t kAbsentField = std::numeric_limits<int64_t>::min();

template <typename Args, size_t N>
struct SignatureTable {
  OperatorId op;
  std::array<SignatureField<Args>, N> fields;

  Signature signature(const Args& args) const {
    Signature sig(op);
    for (const auto& f : fields) {
      if (f.present != nullptr && !f.present(args)) continue;
      const int64_t v = f.value(args);
      switch (f.text) {
        case FieldText::kNumber: sig.set(f.key, v); break;
        case FieldText::kFlag: sig.set_flag(f.key, v != 0); break;
        case FieldText::kName: sig.set(f.key, f.name_of(v)); break;
      }
    }
    return sig;
  }

  // `this` tells the operators apart: one table per operator.
  CallKey call_key(const Args& args) const {
    static_assert(N <= std::tuple_size<decltype(CallKey::fields)>::value, "CallKey has too few fields for this operator");
    CallKey key;
    key.op = this;
    for (size_t i = 0; i < N; ++i) {
      const auto& f = fields[i];
      key.fields[i] = f.present != nullptr && !f.present(args) ? kAbsentField : f.value(args);
    }
    return key;
  }

  // The one check of a signature written by hand (the CLI's --sig, kiln_explain_json, manifests):
  // throws kInvalidArgument naming the first key the operator does not have, a required key that
  // is missing (with the full set), or a value no call can give: a flag other than 0 or 1, a
  // number below 1, a name the field never takes (with those it does).
  void validate(const Signature& sig, const std::string& op_name) const {
    const SignatureKeys k = keys();
    const std::string all = fmt::format("{}{}{}", fmt::join(k.required, ", "), k.optional.empty() ? "" : ", ", fmt::join(k.optional, ", "));
    auto fail = [](const std::string& why) { throw Error(ErrorCode::kInvalidArgument, "signature: " + why); };
    for (const auto& [key, value] : sig.fields()) {
      const SignatureField<Args>* field = nullptr;
      for (const auto& f : fields) {
        if (key == f.key) field = &f;
      }
      if (field == nullptr) fail(fmt::format("unknown key '{}' for {} (its keys: {})", key, op_name, all));
      switch (field->text) {
        case FieldText::kFlag:
          if (value != "0" && value != "1" && value != "true" && value != "false")
            fail(fmt::format("{}={}: a flag is 0 or 1 (or false, true)", key, value));
          break;
        case FieldText::kNumber: {
          int64_t number = 0;
          const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
          if (error != std::errc() || end != value.data() + value.size() || number < 1)
            fail(fmt::format("{}={}: expected a whole number of at least 1", key, value));
          break;
        }
        case FieldText::kName: {
          std::vector<std::string> names;
          for (int64_t v = -1; v < 64; ++v) {  // every value the field's enumeration or dtype can hold
            const std::string name = field->name_of(v);
            if (name != "invalid" && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
          }
          if (std::find(names.begin(), names.end(), value) == names.end())
            fail(fmt::format("{}={}: expected one of {}", key, value, fmt::join(names, ", ")));
          break;
        }
      }
    }
    for (const auto& key : k.required) {
      if (!sig.has(key)) fail(fmt::format("missing key '{}' (a {} signature has {})", key, op_name, all));
    }
  }

  SignatureKeys keys() const {
    SignatureKeys k;
    for (const auto& f : fields) (f.present != nullptr ? k.optional : k.required).emplace_back(f.key);
    return k;
  }
};

template <typename Args, typename... Fields>
SignatureTable<Args, sizeof...(Fields)> signature_table(OperatorId op, Fields... fields) {
  return {std::move(op), {fields...}};
}

// MXFP4 weights, standard or prepared (moe_prepare_weights).
inline bool is_mxfp4(DType t) { return t == DType::kF4E2M1x2 || t == DType::kF4E2M1x2Prepared; }

// The operators' tables (signatures.cpp).
const SignatureTable<MhaPrefillArgs, 9>& prefill_signature_table();
const SignatureTable<MhaDecodeArgs, 10>& decode_signature_table();
const SignatureTable<MhaExtendArgs, 11>& extend_signature_table();
const SignatureTable<KvAppendArgs, 2>& kv_append_signature_table();
const SignatureTable<MoeArgs, 15>& moe_signature_table();

}  // namespace kiln::detail
