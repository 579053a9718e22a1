#include "core/env.hpp"

#include <cstdlib>

#include "kiln/error.hpp"

namespace kiln::detail {

std::optional<std::string> env_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<int64_t> env_int(const char* name) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(*text, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text->size()) {
    throw Error(ErrorCode::kInvalidArgument, std::string("environment variable ") + name + "='" + *text + "' is not an integer");
  }
  return value;
}

}  // namespace kiln::detail
