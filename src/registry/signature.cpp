#include <fmt/format.h>

#include "kiln/error.hpp"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

struct OperatorName {
  const char* name;
  const char* family;
  const char* mode;
};
constexpr OperatorName kOperators[] = {
    {"mha_prefill", kFamilyAttention, kModePrefill},
    {"mha_decode_with_kvcache", kFamilyAttention, kModeDecode},
    {"mha_extend_with_kvcache", kFamilyAttention, kModeExtend},
    {"kv_cache_append", kFamilyAttention, kModeKvAppend},
    {"moe_apply", kFamilyMoe, kModeApply},
};

bool valid_key(const std::string& key) {
  if (key.empty()) return false;
  for (char c : key) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// Values are short tokens; ',', '=' and ':' would make the canonical form ambiguous.
bool valid_value(const std::string& value) {
  if (value.empty()) return false;
  for (char c : value) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.' || c == '+';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

OperatorId operator_from_name(const std::string& op) {
  for (const auto& o : kOperators) {
    if (op == o.name) return {o.family, o.mode};
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("operator: unknown operator '{}' (expected one of {})", op, fmt::join(operator_names(), ", ")));
}

std::string operator_name(const OperatorId& id) {
  for (const auto& o : kOperators) {
    if (id.family == o.family && id.mode == o.mode) return o.name;
  }
  return id.family + "." + id.mode;
}

std::vector<std::string> operator_names() {
  std::vector<std::string> names;
  for (const auto& o : kOperators) names.emplace_back(o.name);
  return names;
}

Signature& Signature::set(const std::string& key, const std::string& value) {
  if (!valid_key(key)) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("signature: key '{}' must be non-empty [a-z0-9_]", key));
  }
  if (!valid_value(value)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("signature: value '{}' of key '{}' must be non-empty [A-Za-z0-9_.+-]", value, key));
  }
  fields_[key] = value;
  return *this;
}

Signature& Signature::set(const std::string& key, int64_t value) { return set(key, std::to_string(value)); }

const std::string& Signature::get(const std::string& key) const {
  auto it = fields_.find(key);
  if (it == fields_.end()) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("signature {}: missing key '{}'", canonical(), key));
  }
  return it->second;
}

int64_t Signature::get_int(const std::string& key) const {
  const std::string& text = get(key);
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || used == 0) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("signature: key '{}' = '{}' is not an integer", key, text));
  }
  return value;
}

bool Signature::get_flag(const std::string& key) const {
  const std::string& text = get(key);
  if (text == "1" || text == "true") return true;
  if (text == "0" || text == "false") return false;
  throw Error(ErrorCode::kInvalidArgument, fmt::format("signature: key '{}' = '{}' is not a flag (0 or 1)", key, text));
}

std::string Signature::canonical() const {
  std::string out = op_.family + "." + op_.mode + ":";
  bool first = true;
  for (const auto& [k, v] : fields_) {  // std::map: sorted keys
    if (!first) out += ',';
    out += k;
    out += '=';
    out += v;
    first = false;
  }
  return out;
}

Signature Signature::parse(const OperatorId& op, const std::string& text) {
  Signature sig(op);
  size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    size_t comma = text.find(',', pos);
    std::string pair = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = pair.find('=');
    if (eq == std::string::npos) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("signature: '{}' is not key=value (in '{}')", pair, text));
    }
    std::string key = pair.substr(0, eq);
    if (sig.has(key)) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("signature: key '{}' given twice (in '{}')", key, text));
    }
    sig.set(key, pair.substr(eq + 1));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return sig;
}

}  // namespace kiln
