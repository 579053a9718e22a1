#include "kiln/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string_view>

#include "core/env.hpp"

namespace kiln {

std::optional<LogLevel> detail::parse_log_level(std::string_view v) {
  if (v == "debug") return LogLevel::kDebug;
  if (v == "info") return LogLevel::kInfo;
  if (v == "warn" || v == "warning") return LogLevel::kWarn;
  if (v == "error") return LogLevel::kError;
  if (v == "off") return LogLevel::kOff;
  return std::nullopt;
}

namespace {

LogLevel level_from_env() {
  auto value = detail::env_string("KILN_LOG");
  if (!value) return LogLevel::kWarn;
  if (auto level = detail::parse_log_level(*value)) return *level;
  std::fprintf(stderr, "[kiln warn] KILN_LOG='%s' is not one of debug|info|warn|error|off; using warn\n", value->c_str());
  return LogLevel::kWarn;
}

struct LogState {
  std::atomic<LogLevel> level{level_from_env()};
  std::mutex mutex;  // guards callback and serializes stderr lines
  LogCallback callback;
};

LogState& state() {
  static LogState s;
  return s;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) { state().level.store(level); }
LogLevel log_level() { return state().level.load(); }

void set_log_callback(LogCallback callback) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().callback = std::move(callback);
}

void log(LogLevel level, const std::string& message) {
  LogState& s = state();
  if (level < s.level.load() || level == LogLevel::kOff) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.callback) {
    s.callback(level, message);
  } else {
    std::fprintf(stderr, "[kiln %s] %s\n", level_name(level), message.c_str());
  }
}

}  // namespace kiln
