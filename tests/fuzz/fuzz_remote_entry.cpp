// Fuzzes the decoder of entries fetched from the remote (Redis) tier, which any client of that
// server can write: nothing may crash, and whatever decodes must encode back to an entry that
// decodes to the same row.
#include <cstdint>
#include <string>
#include <variant>

#include "cache/remote_tier.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const auto decoded = kiln::detail::decode_remote_entry(bytes);
  const auto* entry = std::get_if<kiln::detail::DecodedEntry>(&decoded);
  if (entry == nullptr) return 0;
  const auto again = kiln::detail::decode_remote_entry(kiln::detail::encode_remote_entry(entry->row, nullptr));
  const auto* same = std::get_if<kiln::detail::DecodedEntry>(&again);
  if (same == nullptr || same->row.key != entry->row.key || same->row.binary != entry->row.binary ||
      same->row.kernel != entry->row.kernel || same->row.entry != entry->row.entry || same->row.compiler != entry->row.compiler) {
    __builtin_trap();
  }
  return 0;
}
