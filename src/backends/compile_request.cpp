#include "backends/compile_request.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/error.hpp"
#include "platform/vendors.hpp"

namespace kiln::detail {

using nlohmann::json;

const char* compiler_kind_name(CompilerKind kind) {
  switch (kind) {
    case CompilerKind::kNvrtc: return "nvrtc";
    case CompilerKind::kHiprtc: return "hiprtc";
    case CompilerKind::kClang: return "clang";
  }
  // A backend plugin's compiler takes its vendor's number (platform/vendors.hpp).
  if (is_plugin_vendor(static_cast<Vendor>(kind))) return plugin_compiler_name(static_cast<Vendor>(kind));
  return "unknown";
}

namespace {

// Throws when a message was written by another protocol version (1: before messages carried one).
void check_protocol(const json& j, const char* sender) {
  const auto it = j.find("protocol");
  const int version = it != j.end() && it->is_number_integer() ? it->get<int>() : 1;
  if (auto why = worker_protocol_mismatch(version, sender)) throw Error(ErrorCode::kCompileFailed, *why);
}

}  // namespace

std::optional<std::string> worker_protocol_mismatch(int version, const char* sender) {
  if (version == kWorkerProtocolVersion) return std::nullopt;
  return fmt::format("{} speaks worker protocol {}, this kiln speaks {}: install the kiln-compile-worker of the same release", sender,
                     version, kWorkerProtocolVersion);
}

std::vector<uint8_t> encode_request(const CompileRequest& r) {
  json j;
  j["protocol"] = kWorkerProtocolVersion;
  j["compiler"] = static_cast<int>(r.compiler);
  j["kernel_name"] = r.kernel_name;
  j["source_name"] = r.source_name;
  j["source"] = r.source;
  j["headers"] = r.headers;
  j["name_expression"] = r.name_expression;
  j["options"] = r.options;
  j["target"] = r.target;
  return json::to_cbor(j);
}

CompileRequest decode_request(const std::vector<uint8_t>& bytes) {
  try {
    const json j = json::from_cbor(bytes);
    check_protocol(j, "the compile request");
    CompileRequest r;
    const int compiler = j.at("compiler").get<int>();
    if (compiler < 0 || compiler > static_cast<int>(CompilerKind::kClang)) {
      throw Error(ErrorCode::kInternal, fmt::format("malformed compile request: unknown compiler {}", compiler));
    }
    r.compiler = static_cast<CompilerKind>(compiler);
    r.kernel_name = j.at("kernel_name").get<std::string>();
    r.source_name = j.at("source_name").get<std::string>();
    r.source = j.at("source").get<std::string>();
    r.headers = j.at("headers").get<std::vector<std::pair<std::string, std::string>>>();
    r.name_expression = j.at("name_expression").get<std::string>();
    r.options = j.at("options").get<std::vector<std::string>>();
    r.target = j.at("target").get<std::string>();
    return r;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInternal, std::string("malformed compile request: ") + e.what());
  }
}

std::vector<uint8_t> encode_result(const CompileResult& r) {
  json j;
  j["protocol"] = kWorkerProtocolVersion;
  j["binary"] = json::binary(r.binary);
  j["lowered_name"] = r.lowered_name;
  j["log"] = r.log;
  j["compile_ms"] = r.compile_ms;
  return json::to_cbor(j);
}

CompileResult decode_result(const std::vector<uint8_t>& bytes) {
  try {
    const json j = json::from_cbor(bytes);
    check_protocol(j, "the compile worker");
    CompileResult r;
    r.binary = j.at("binary").get_binary();
    r.lowered_name = j.at("lowered_name").get<std::string>();
    r.log = j.at("log").get<std::string>();
    r.compile_ms = j.at("compile_ms").get<double>();
    return r;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInternal, std::string("malformed compile result from the worker: ") + e.what());
  }
}

}  // namespace kiln::detail
