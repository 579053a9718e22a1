// The 128-bit key the cache files a binary under. jit/key.hpp says how it is computed.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::detail {

struct KernelKey {
  uint64_t high = 0;
  uint64_t low = 0;
  std::string hex() const;  // 32 lowercase hex digits
  bool operator==(const KernelKey&) const = default;
};

}  // namespace kiln::detail
