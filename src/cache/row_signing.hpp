// Signed cache rows: Ed25519 signatures (libsodium, loaded at first use) over every field of a row
// and its whole binary, written into bundles and seeds by `kiln cache export --sign KEY` and
// checked on import and on seed lookups whenever trusted keys are configured
// (KILN_CACHE_TRUSTED_KEYS). Ed25519 rather than an HMAC: serving nodes hold only public keys, so
// a node that is broken into cannot sign rows for the rest of the fleet.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::detail {

struct CacheRow;

using PublicKey = std::array<uint8_t, 32>;
using RowSignature = std::array<uint8_t, 64>;

struct SigningKey {
  std::array<uint8_t, 64> secret{};  // libsodium's form: seed, then the public key
  PublicKey public_key{};
};

// Writes a new key pair: `prefix`.key (the secret, mode 0600, hex) and `prefix`.pub (hex). Refuses
// to overwrite either file. Returns the public key.
PublicKey generate_signing_key(const std::string& prefix);

// Reads a secret key file written by generate_signing_key. Refuses one that other users can read
// or write, or that is not one line of 128 hex digits.
SigningKey read_signing_key(const std::string& path);

// Trusted public keys from a setting (`what` names it in errors): entries separated by commas,
// each 64 hex digits or the path of a .pub file holding them. Throws kInvalidArgument naming the
// setting and the entry for anything else.
std::vector<PublicKey> parse_trusted_keys(const std::string& spec, const std::string& what);

// KILN_CACHE_TRUSTED_KEYS, parsed; empty when unset or empty.
std::vector<PublicKey> trusted_keys_from_environment();

// Loads libsodium now (it is otherwise loaded at first use). A thread that may sign or verify while
// the process exits calls this first, so the library's state outlives it. Throws kCacheError when
// libsodium is missing.
void load_signing_library();

RowSignature sign_row(const CacheRow& row, const SigningKey& key);
// Why the row's signature does not make it trusted, or nullopt: the signer must be one of
// `trusted` and the signature must verify over the row as it is.
std::optional<std::string> signature_problem(const CacheRow& row, const std::vector<PublicKey>& trusted, const PublicKey& signer,
                                             const RowSignature& signature);

std::string to_hex(const uint8_t* bytes, size_t size);

}  // namespace kiln::detail
