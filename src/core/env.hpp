// Reading kiln's environment settings in one place, so each is parsed (and rejected) the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln::detail {

// The variable's value, or nullopt when unset or empty.
std::optional<std::string> env_string(const char* name);
// Parses an integer setting; a malformed value throws kiln::Error naming the variable.
std::optional<int64_t> env_int(const char* name);

}  // namespace kiln::detail
