// One compile: everything the run-time compiler sees, and what it gives back. Serializable, so
// the same request can run in a separate worker process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::detail {

// Which compiler runs a request: NVRTC for NVIDIA targets; hipRTC or an offline clang for AMD.
// Open like Vendor: a backend plugin's compiler takes its vendor's number (platform/vendors.hpp).
enum class CompilerKind { kNvrtc = 0, kHiprtc = 1, kClang = 2 };
const char* compiler_kind_name(CompilerKind kind);  // "nvrtc", "hiprtc", "clang"

struct CompileRequest {
  CompilerKind compiler = CompilerKind::kNvrtc;
  std::string kernel_name;                                   // for messages
  std::string source_name;                                   // "attention/prefill_reference.cuh"
  std::string source;                                        // full text, with an instantiation preamble appended
  std::vector<std::pair<std::string, std::string>> headers;  // include name -> text
  std::string name_expression;                               // "kiln::prefill_reference<kiln::bf16, 128>"
  std::vector<std::string> options;                          // without the target
  std::string target;                                        // "sm_90a", "gfx942", "gfx950:sramecc+:xnack-"
  // Labels for the cache index and messages; not compiler inputs, not part of the key.
  std::string op;         // "mha_prefill"
  std::string signature;  // canonical signature
};

struct CompileResult {
  std::vector<uint8_t> binary;  // CUBIN, or an AMD code object (ELF)
  std::string lowered_name;
  std::string log;
  double compile_ms = 0;
};

// CBOR encodings for the worker protocol. Every message carries "protocol": a worker and a kiln
// of different versions refuse each other with both numbers. You MUST bump it whenever a message
// gains, loses or changes a field.
inline constexpr int kWorkerProtocolVersion = 2;
// Replies larger than this are refused (and the worker killed): a binary is a few MB.
inline constexpr size_t kMaxWorkerReplyBytes = size_t{256} << 20;

// Why a message of protocol `version` from `sender` cannot be read here, or nullopt.
std::optional<std::string> worker_protocol_mismatch(int version, const char* sender);

std::vector<uint8_t> encode_request(const CompileRequest& request);
CompileRequest decode_request(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode_result(const CompileResult& result);
CompileResult decode_result(const std::vector<uint8_t>& bytes);

}  // namespace kiln::detail
