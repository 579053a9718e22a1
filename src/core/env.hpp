// Reading kiln's environment settings in one place, so each is parsed (and rejected) the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/log.hpp"

namespace kiln::detail {

// The variable's value, or nullopt when unset or empty.
std::optional<std::string> env_string(const char* name);
// Parses an integer setting; a malformed value throws kiln::Error naming the variable.
std::optional<int64_t> env_int(const char* name);
// A size in bytes: digits, optionally with a binary unit K, M, G or T (also KB/KiB, ...; 1K = 1024),
// as `4G`, `512M` or `1048576`. Throws kiln::Error(kInvalidArgument) naming `name` for anything
// else, a negative size, or one past 2^63.
int64_t parse_size(const std::string& text, const std::string& name);

// KILN_LOG's values; nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view value);

}  // namespace kiln::detail
