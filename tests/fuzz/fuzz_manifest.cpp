// Fuzzes manifest parsing: any input either parses or raises kiln::Error, nothing else.
#include <cstdint>
#include <string>

#include "kiln/error.hpp"
#include "kiln/warmup.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const kiln::Manifest m = kiln::parse_manifest(text, "fuzz.json");
    for (const auto& sig : m.signatures) {
      if (sig.canonical().empty()) __builtin_trap();
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
