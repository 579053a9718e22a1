// Fuzzes signature strings (kiln explain/compile --sig, the C ABI): a parsed signature
// round-trips through its canonical form; anything else raises kiln::Error.
#include <cstdint>
#include <string>

#include "kiln/error.hpp"
#include "kiln/registry.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto names = kiln::operator_names();
  const kiln::OperatorId op = kiln::operator_from_name(names[data[0] % names.size()]);
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const kiln::Signature sig = kiln::Signature::parse(op, text);
    const std::string canonical = sig.canonical();
    const kiln::Signature again = kiln::Signature::parse(op, canonical.substr(canonical.find(':') + 1));
    if (!(again == sig)) __builtin_trap();
    for (const auto& [key, value] : sig.fields()) {
      try {
        sig.get_int(key);
      } catch (const kiln::Error&) {
      }
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
