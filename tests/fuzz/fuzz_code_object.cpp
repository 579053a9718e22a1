// Fuzzes the AMD code object reader (binaries from the cache, from a seed database a fleet
// ships, from a compiler): any input either parses or raises kiln::Error; never a read out of
// bounds. The corpus holds real gfx90a/gfx942/gfx950 code objects built by hipRTC and clang.
#include <cstdint>
#include <vector>

#include "backends/hip/code_object.hpp"
#include "kiln/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  try {
    const auto info = kiln::detail::hip::read_code_object(bytes);
    if (info.arch.empty()) __builtin_trap();
    kiln::detail::hip::target_runs(info.target, "gfx942:sramecc+:xnack-");
    if (!info.kernels.empty()) kiln::detail::hip::find_kernel(info, "kiln::prefill_reference<kiln::bf16, 64>");
  } catch (const kiln::Error&) {
  }
  return 0;
}
