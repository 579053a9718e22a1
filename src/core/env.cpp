#include "core/env.hpp"

#include <cctype>
#include <limits>

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

int64_t parse_size(const std::string& text, const std::string& name) {
  auto fail = [&]() -> Error {
    return Error(ErrorCode::kInvalidArgument,
                 name + "='" + text + "' is not a size: bytes, or a number with K, M, G or T (binary units: 4G, 512M)");
  };
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 18) throw fail();
  const int64_t number = std::stoll(text.substr(0, digits));
  std::string unit = text.substr(digits);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!unit.empty()) {
    const std::string letters = "KMGT";
    const size_t at = letters.find(unit[0]);
    const std::string rest = unit.substr(1);
    if (at == std::string::npos || !(rest.empty() || rest == "B" || rest == "IB")) throw fail();
    shift = 10 * static_cast<int>(at + 1);
  }
  if (shift > 0 && number > (std::numeric_limits<int64_t>::max() >> shift)) throw fail();
  return number << shift;
}

}  // namespace kiln::detail
