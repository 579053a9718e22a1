#include "kiln/error.hpp"

#include <fmt/format.h>

namespace kiln {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kNoKernel: return "no kernel";
    case ErrorCode::kCompileFailed: return "compile failed";
    case ErrorCode::kDriverError: return "driver error";
    case ErrorCode::kCacheError: return "cache error";
    case ErrorCode::kPluginError: return "plugin error";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kGraphCapture: return "graph capture";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(fmt::format("kiln: {}: {}", error_code_name(code), message)), code_(code), message_(message) {}

Error Error::compile_failed(const std::string& kernel, const std::string& target, const std::vector<std::string>& options,
                            const std::string& log) {
  Error e(ErrorCode::kCompileFailed,
          fmt::format("kernel '{}' for target {} did not compile\noptions: {}\nlog:\n{}", kernel, target, fmt::join(options, " "), log));
  e.compile_log_ = log;
  e.compile_options_ = options;
  e.compile_target_ = target;
  return e;
}

}  // namespace kiln
