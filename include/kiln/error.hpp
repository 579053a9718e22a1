// kiln::Error — the one exception type kiln throws. Every message names what it is about
// (the argument, kernel, target or file) and, for compile failures, carries the log.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

enum class ErrorCode {
  kInvalidArgument = 1,  // a caller-supplied value is wrong; the message names it
  kUnsupported = 2,      // valid, but kiln does not do this (yet) on this platform
  kNoKernel = 3,         // no registered kernel accepts the signature; message has the explanation
  kCompileFailed = 4,    // the run-time compiler rejected a kernel; see compile_log()
  kDriverError = 5,      // a driver / runtime / compiler library call failed or is missing
  kCacheError = 6,       // the on-disk cache could not be used
  kPluginError = 7,      // a plugin could not be loaded or was refused
  kInternal = 8,         // a bug in kiln
  kGraphCapture = 9,     // the call needs a compile or a load while its stream captures a graph
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);

  ErrorCode code() const { return code_; }
  // The message without the "kiln: <code>: " prefix that what() carries.
  const std::string& message() const { return message_; }

  // Filled for kCompileFailed only.
  const std::string& compile_log() const { return compile_log_; }
  const std::vector<std::string>& compile_options() const { return compile_options_; }
  const std::string& compile_target() const { return compile_target_; }

  static Error compile_failed(const std::string& kernel, const std::string& target, const std::vector<std::string>& options,
                              const std::string& log);

 private:
  ErrorCode code_;
  std::string message_;
  std::string compile_log_;
  std::vector<std::string> compile_options_;
  std::string compile_target_;
};

}  // namespace kiln
