// Model manifests: parsing, validation with file:line:field errors, expansion of value arrays.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/embedded_file.hpp"
#include "kiln/author.hpp"
#include "kiln/error.hpp"
#include "kiln/warmup.hpp"

namespace kiln {
namespace detail {
extern const EmbeddedFile kEmbeddedManifests[];
extern const unsigned long kEmbeddedManifestsCount;
}  // namespace detail

namespace {

using nlohmann::json;

// Bounds on what a manifest may ask for, checked before the work they bound: a manifest is
// parsed inside serving processes too (KILN_CAPTURE), so none may cost unbounded memory or stack.
constexpr size_t kMaxManifestBytes = size_t{4} << 20;
constexpr int kMaxManifestDepth = 16;         // a manifest needs 5 levels
constexpr size_t kMaxValuesPerKey = 1024;     // values of one signature key
constexpr size_t kMaxOperatorEntries = 4096;  // entries of "operators"
constexpr size_t kMaxSignatures = 65536;      // signatures after expansion, whole manifest

// The deepest nesting of arrays and objects in a JSON text (brackets inside strings skipped), in
// one pass with no recursion.
int max_nesting(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Line of every value in a JSON text, by path ("operators[0].signature.head_dim"). nlohmann
// does not keep positions; the text has already been parsed, so this walk can be simple.
class LineMap {
 public:
  explicit LineMap(const std::string& text) : t_(text) {
    try {
      value("");
    } catch (...) {  // a map of what was reached is still useful
    }
  }
  int line(const std::string& path) const {
    auto it = lines_.find(path);
    return it == lines_.end() ? 1 : it->second;
  }

 private:
  char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
  void skip_space() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) {
      if (t_[i_] == '\n') ++line_;
      ++i_;
    }
  }
  std::string string_token() {
    std::string s;
    ++i_;  // opening quote
    while (i_ < t_.size() && t_[i_] != '"') {
      if (t_[i_] == '\\') ++i_;
      if (i_ < t_.size()) s += t_[i_++];
    }
    ++i_;
    return s;
  }
  void value(const std::string& path) {
    skip_space();
    lines_.emplace(path, line_);
    const char c = peek();
    if (c == '{') {
      ++i_;
      skip_space();
      if (peek() == '}') {
        ++i_;
        return;
      }
      while (i_ < t_.size()) {
        skip_space();
        const std::string key = string_token();
        skip_space();
        ++i_;  // ':'
        value(path.empty() ? key : path + "." + key);
        skip_space();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        ++i_;  // '}'
        return;
      }
    } else if (c == '[') {
      ++i_;
      skip_space();
      if (peek() == ']') {
        ++i_;
        return;
      }
      for (int index = 0; i_ < t_.size(); ++index) {
        value(fmt::format("{}[{}]", path, index));
        skip_space();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        ++i_;  // ']'
        return;
      }
    } else if (c == '"') {
      string_token();
    } else {
      while (i_ < t_.size() && !std::strchr(",}] \t\r\n", t_[i_])) ++i_;
    }
  }

  const std::string& t_;
  size_t i_ = 0;
  int line_ = 1;
  std::map<std::string, int> lines_;
};

// Refuses a text over the size or nesting bounds, before anything walks it.
void check_manifest_bounds(const std::string& text, const std::string& source) {
  if (text.size() > kMaxManifestBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: {} bytes; a manifest may have at most {} bytes", source, text.size(), kMaxManifestBytes));
  }
  const int depth = max_nesting(text);
  if (depth > kMaxManifestDepth) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: arrays and objects nested {} deep; a manifest may nest at most {}", source, depth, kMaxManifestDepth));
  }
}

class ManifestParser {
 public:
  // The bounds are checked before LineMap walks the text (it recurses once per level).
  ManifestParser(const std::string& text, std::string source)
      : text_(text), source_(std::move(source)), lines_((check_manifest_bounds(text, source_), text)) {}

  Manifest parse() {
    json root;
    try {
      root = json::parse(text_);
    } catch (const json::parse_error& e) {
      const size_t at = std::min(e.byte, text_.size());
      const int line = 1 + static_cast<int>(std::count(text_.begin(), text_.begin() + static_cast<long>(at), '\n'));
      throw Error(ErrorCode::kInvalidArgument, fmt::format("{}:{}: not valid JSON: {}", source_, line, e.what()));
    } catch (const json::exception& e) {  // e.g. a number too large for a double (out_of_range 406)
      throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: not valid JSON: {}", source_, e.what()));
    }
    if (!root.is_object()) fail("", "the manifest must be a JSON object");
    for (const auto& [key, value] : root.items()) {
      static const std::set<std::string> known = {"kiln_manifest", "model", "description", "operators", "buckets"};
      if (!known.count(key)) fail(key, "unknown field (expected kiln_manifest, model, description, operators, buckets)");
    }
    if (!root.contains("kiln_manifest")) fail("", "missing field kiln_manifest (the format version, 1)");
    if (!root["kiln_manifest"].is_number_integer() || root["kiln_manifest"].get<int64_t>() != kManifestFormatVersion) {
      fail("kiln_manifest", fmt::format("must be {}, the manifest format this kiln reads", kManifestFormatVersion));
    }
    Manifest m;
    m.source = source_;
    m.model = required_string(root, "model", "model");
    if (root.contains("description")) m.description = required_string(root, "description", "description");
    if (!root.contains("operators") || !root["operators"].is_array() || root["operators"].empty()) {
      fail("operators", "must be a non-empty array of {\"op\": ..., \"signature\": {...}}");
    }
    if (root["operators"].size() > kMaxOperatorEntries) {
      fail("operators", fmt::format("{} entries; a manifest may have at most {}", root["operators"].size(), kMaxOperatorEntries));
    }
    std::set<std::string> seen;
    size_t expanded = 0;  // signatures produced so far, duplicates included
    for (size_t i = 0; i < root["operators"].size(); ++i) {
      for (auto& sig : operator_entry(root["operators"][i], fmt::format("operators[{}]", i), &expanded)) {
        if (seen.insert(sig.canonical()).second) m.signatures.push_back(std::move(sig));
      }
    }
    if (root.contains("buckets")) {
      const json& b = root["buckets"];
      if (!b.is_object()) fail("buckets", "must be an object of arrays of positive integers");
      for (const auto& [name, values] : b.items()) {
        const std::string path = "buckets." + name;
        if (!values.is_array() || values.empty()) fail(path, "must be a non-empty array of positive integers");
        for (const auto& v : values) {
          if (!v.is_number_integer() || v.get<int64_t>() <= 0) fail(path, fmt::format("{} is not a positive integer", v.dump()));
          m.buckets[name].push_back(v.get<int64_t>());
        }
      }
    }
    return m;
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& problem) const {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}:{}: {}{}", source_, lines_.line(path), path.empty() ? "" : path + ": ", problem));
  }

  std::string required_string(const json& obj, const std::string& key, const std::string& path) const {
    if (!obj.contains(key)) fail(path, "missing");
    if (!obj[key].is_string() || obj[key].get<std::string>().empty()) fail(path, "must be a non-empty string");
    return obj[key].get<std::string>();
  }

  // "1"/"0" for booleans, decimal for integers, the text for strings.
  std::string scalar(const json& v, const std::string& path) const {
    if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return std::to_string(v.get<int64_t>());
    if (v.is_string()) return v.get<std::string>();
    fail(path, fmt::format("{} must be a string, a non-negative integer or a boolean", v.dump()));
  }

  // `expanded` counts the signatures of the manifest so far: an entry whose arrays would take it
  // past kMaxSignatures is refused before anything is expanded.
  std::vector<Signature> operator_entry(const json& entry, const std::string& path, size_t* expanded) const {
    if (!entry.is_object()) fail(path, "must be an object {\"op\": ..., \"signature\": {...}}");
    for (const auto& [key, value] : entry.items()) {
      if (key != "op" && key != "signature") fail(path + "." + key, "unknown field (expected op, signature)");
    }
    const std::string op_name = required_string(entry, "op", path + ".op");
    OperatorId op;
    try {
      op = operator_from_name(op_name);
    } catch (const Error& e) {
      fail(path + ".op", e.message());
    }
    if (!entry.contains("signature") || !entry["signature"].is_object()) fail(path + ".signature", "must be an object");
    const json& sig = entry["signature"];
    const SignatureKeys keys = signature_keys(op);
    for (const auto& k : keys.required) {
      if (!sig.contains(k))
        fail(path + ".signature", fmt::format("missing key '{}' (an {} signature has {})", k, op_name, fmt::join(keys.required, ", ")));
    }
    // Each key's values; arrays expand to every combination.
    std::vector<std::pair<std::string, std::vector<std::string>>> choices;
    for (const auto& [k, v] : sig.items()) {
      const std::string field = path + ".signature." + k;
      const bool known =
          std::count(keys.required.begin(), keys.required.end(), k) + std::count(keys.optional.begin(), keys.optional.end(), k);
      if (!known)
        fail(field, fmt::format("unknown key for {} (known: {}{}{})", op_name, fmt::join(keys.required, ", "),
                                keys.optional.empty() ? "" : ", ", fmt::join(keys.optional, ", ")));
      std::vector<std::string> values;
      if (v.is_array()) {
        if (v.empty()) fail(field, "an array of values must not be empty");
        if (v.size() > kMaxValuesPerKey) fail(field, fmt::format("{} values; a key may list at most {}", v.size(), kMaxValuesPerKey));
        for (size_t i = 0; i < v.size(); ++i) values.push_back(scalar(v[i], fmt::format("{}[{}]", field, i)));
      } else {
        values.push_back(scalar(v, field));
      }
      choices.emplace_back(k, std::move(values));
    }
    size_t combinations = 1;
    for (const auto& [k, values] : choices) {
      combinations *= values.size();  // each factor <= kMaxValuesPerKey: checked against the bound at every step
      if (combinations > kMaxSignatures - *expanded) {
        fail(path + ".signature", fmt::format("its arrays expand to more than the {} signatures a manifest may hold", kMaxSignatures));
      }
    }
    *expanded += combinations;
    std::vector<Signature> out = {Signature(op)};
    for (const auto& [k, values] : choices) {
      std::vector<Signature> next;
      for (const auto& partial : out) {
        for (const auto& value : values) {
          Signature s = partial;
          try {
            s.set(k, value);
          } catch (const Error& e) {
            fail(path + ".signature." + k, e.message());
          }
          next.push_back(std::move(s));
        }
      }
      out = std::move(next);
    }
    for (const auto& s : out) {  // values in range: the validator every hand-written signature goes through
      try {
        validate_signature(s);
      } catch (const Error& e) {
        fail(path + ".signature", e.message());
      }
    }
    return out;
  }

  const std::string& text_;
  std::string source_;
  LineMap lines_;
};

}  // namespace

Manifest parse_manifest(const std::string& text, const std::string& source) { return ManifestParser(text, source).parse(); }

std::vector<std::string> builtin_manifests() {
  std::vector<std::string> names;
  for (unsigned long i = 0; i < detail::kEmbeddedManifestsCount; ++i) {
    std::string name = detail::kEmbeddedManifests[i].name;  // "manifests/gpt-oss-120b.json"
    name = name.substr(name.rfind('/') + 1);
    names.push_back(name.substr(0, name.size() - 5));
  }
  return names;
}

Manifest load_manifest(const std::string& name_or_path) {
  std::error_code ec;
  const auto status = std::filesystem::status(name_or_path, ec);
  if (!ec && std::filesystem::exists(status)) {
    // A FIFO would block the read, and a huge file would be read whole before being refused.
    if (!std::filesystem::is_regular_file(status)) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("manifest: {} is not a regular file", name_or_path));
    }
    const auto size = std::filesystem::file_size(name_or_path, ec);
    if (!ec && size > kMaxManifestBytes) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: {} bytes; a manifest may have at most {} bytes", name_or_path, size, kMaxManifestBytes));
    }
  }
  std::ifstream in(name_or_path, std::ios::binary);
  if (in) {
    std::stringstream text;
    text << in.rdbuf();
    return parse_manifest(text.str(), name_or_path);
  }
  for (unsigned long i = 0; i < detail::kEmbeddedManifestsCount; ++i) {
    const detail::EmbeddedFile& f = detail::kEmbeddedManifests[i];
    if (std::string(f.name) == "manifests/" + name_or_path + ".json") {
      return parse_manifest(std::string(reinterpret_cast<const char*>(f.data), f.size), "embedded:" + name_or_path + ".json");
    }
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("manifest: '{}' is neither a readable file nor a built-in manifest ({})",
                                                       name_or_path, fmt::join(builtin_manifests(), ", ")));
}

}  // namespace kiln
