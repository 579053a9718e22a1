#include "cache/kernel_key.hpp"

#include <fmt/format.h>

namespace kiln::detail {

std::string KernelKey::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

}  // namespace kiln::detail
