// Logging. Messages go to stderr unless an embedding engine installs a callback.
// KILN_LOG=debug|info|warn|error sets the level (default warn).
#pragma once

#include <functional>
#include <string>

namespace kiln {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

using LogCallback = std::function<void(LogLevel, const std::string&)>;

void set_log_level(LogLevel level);
LogLevel log_level();
// Replaces stderr output; pass nullptr to restore it. The callback may be called from any thread.
void set_log_callback(LogCallback callback);
void log(LogLevel level, const std::string& message);

}  // namespace kiln
