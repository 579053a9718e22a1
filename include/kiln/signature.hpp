// Operators and signatures: which operator a call is, and the properties of it that decide which
// kernel and which specialization run. Warm-up manifests, `kiln explain` and errors speak of these.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// Operator families and modes. An operator is one (family, mode) pair.
inline constexpr const char* kFamilyAttention = "attention";
inline constexpr const char* kFamilyMoe = "moe";
inline constexpr const char* kModePrefill = "prefill";
inline constexpr const char* kModeDecode = "decode";
inline constexpr const char* kModeExtend = "extend";
inline constexpr const char* kModeKvAppend = "kv_append";
inline constexpr const char* kModeApply = "apply";

// The public name of an operator ("mha_prefill") <-> its (family, mode).
struct OperatorId {
  std::string family;
  std::string mode;
  bool operator==(const OperatorId& other) const { return family == other.family && mode == other.mode; }
  bool operator!=(const OperatorId& other) const { return !(*this == other); }
};
OperatorId operator_from_name(const std::string& op);  // throws, listing the operators
std::string operator_name(const OperatorId& id);
std::vector<std::string> operator_names();

// What a call looks like to the selector: the operator plus the properties that decide which
// kernel and which specialization run (dtypes, head_dim, group size, causal, page_size, ...).
// Run-time sizes (batch, sequence lengths) are not part of it. Canonical form:
// "attention.prefill:causal=1,dtype=bf16,head_dim=128" — keys sorted, so equal signatures have
// equal bytes.
class Signature {
 public:
  Signature() = default;
  explicit Signature(OperatorId op) : op_(std::move(op)) {}

  const OperatorId& op() const { return op_; }
  Signature& set(const std::string& key, const std::string& value);
  Signature& set(const std::string& key, int64_t value);
  Signature& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  Signature& set(const std::string& key, bool value) = delete;  // say set_flag
  Signature& set_flag(const std::string& key, bool value) { return set(key, value ? "1" : "0"); }

  bool has(const std::string& key) const { return fields_.count(key) != 0; }
  // Typed reads; a missing or malformed field throws kiln::Error naming the key.
  const std::string& get(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  bool get_flag(const std::string& key) const;
  const std::map<std::string, std::string>& fields() const { return fields_; }

  std::string canonical() const;
  // Parses "key=value,key=value" (the CLI's --sig) for an operator; errors name the bad pair.
  static Signature parse(const OperatorId& op, const std::string& text);

  bool operator==(const Signature& other) const { return op_ == other.op_ && fields_ == other.fields_; }
  bool operator!=(const Signature& other) const { return !(*this == other); }

 private:
  OperatorId op_;
  std::map<std::string, std::string> fields_;
};

}  // namespace kiln
