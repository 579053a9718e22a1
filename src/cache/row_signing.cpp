#include "cache/row_signing.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include "cache/kernel_cache.hpp"
#include "core/dynamic_library.hpp"
#include "core/env.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

// The four libsodium functions kiln uses, declared here: libkiln loads libsodium only when keys
// are in play, and builds without its headers.
struct Sodium {
  int (*init)();
  int (*keypair)(unsigned char* pk, unsigned char* sk);
  int (*sign_detached)(unsigned char* sig, unsigned long long* siglen, const unsigned char* m, unsigned long long mlen,
                       const unsigned char* sk);
  int (*verify_detached)(const unsigned char* sig, const unsigned char* m, unsigned long long mlen, const unsigned char* pk);
};

const Sodium& sodium() {
  static std::once_flag once;
  static Sodium s{};
  static std::string failure;
  static std::unique_ptr<DynamicLibrary> library;
  std::call_once(once, [] {
    std::vector<std::string> candidates = {"libsodium.so.23", "libsodium.so"};
    if (auto path = env_string("KILN_LIBSODIUM")) candidates = {*path};
    try {
      library = std::make_unique<DynamicLibrary>("libsodium (Ed25519 signatures of cache rows; Debian: libsodium23)", candidates);
      s.init = reinterpret_cast<int (*)()>(library->symbol("sodium_init"));
      s.keypair = reinterpret_cast<decltype(s.keypair)>(library->symbol("crypto_sign_keypair"));
      s.sign_detached = reinterpret_cast<decltype(s.sign_detached)>(library->symbol("crypto_sign_detached"));
      s.verify_detached = reinterpret_cast<decltype(s.verify_detached)>(library->symbol("crypto_sign_verify_detached"));
      if (s.init() < 0) failure = "sodium_init failed";
    } catch (const Error& e) {
      failure = e.message();
    }
  });
  if (!failure.empty()) throw Error(ErrorCode::kCacheError, "signed cache rows need libsodium: " + failure);
  return s;
}

std::optional<std::vector<uint8_t>> from_hex(const std::string& text) {
  if (text.size() % 2) return std::nullopt;
  std::vector<uint8_t> out(text.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    unsigned value = 0;
    for (int j = 0; j < 2; ++j) {
      const char c = text[2 * i + j];
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (digit < 0) return std::nullopt;
      value = value * 16 + static_cast<unsigned>(digit);
    }
    out[i] = static_cast<uint8_t>(value);
  }
  return out;
}

std::string trimmed_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  line.erase(std::remove_if(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\r' || c == '\t'; }), line.end());
  return line;
}

// Writes `text` to a new file of mode `mode`; refuses to replace an existing one.
void write_new_file(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) throw Error(ErrorCode::kCacheError, fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  ::fchmod(fd, mode);  // whatever the umask took off
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok) throw Error(ErrorCode::kCacheError, fmt::format("cannot write {}", path));
}

void append_field(std::vector<uint8_t>& m, const void* data, size_t size) {
  const uint64_t n = size;
  for (int i = 0; i < 8; ++i) m.push_back(static_cast<uint8_t>(n >> (8 * i)));
  const auto* p = static_cast<const uint8_t*>(data);
  m.insert(m.end(), p, p + size);
}

// What is signed: a domain tag, then every field that decides what runs where, each with its
// length, and the whole binary (Ed25519 hashes it with SHA-512; the row's XXH3 checksum only
// detects accidents).
std::vector<uint8_t> signed_message(const CacheRow& row) {
  static constexpr char kDomain[] = "kiln cache row v1";
  std::vector<uint8_t> m(kDomain, kDomain + sizeof(kDomain));
  uint8_t key[16];
  std::memcpy(key, &row.key.high, 8);
  std::memcpy(key + 8, &row.key.low, 8);
  append_field(m, key, sizeof key);
  for (const std::string* field :
       {&row.kernel, &row.op, &row.signature, &row.target, &row.backend, &row.compiler, &row.options, &row.entry})
    append_field(m, field->data(), field->size());
  append_field(m, row.binary.data(), row.binary.size());
  return m;
}

}  // namespace

std::string to_hex(const uint8_t* bytes, size_t size) {
  std::string out;
  out.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) out += fmt::format("{:02x}", bytes[i]);
  return out;
}

PublicKey generate_signing_key(const std::string& prefix) {
  if (prefix.empty()) throw Error(ErrorCode::kInvalidArgument, "keygen: the key files' path prefix is empty");
  const Sodium& s = sodium();
  SigningKey key;
  if (s.keypair(key.public_key.data(), key.secret.data()) != 0) throw Error(ErrorCode::kCacheError, "crypto_sign_keypair failed");
  for (const std::string& path : {prefix + ".key", prefix + ".pub"}) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0)
      throw Error(ErrorCode::kCacheError, fmt::format("keygen: {} exists; kiln does not overwrite keys", path));
  }
  write_new_file(prefix + ".key", to_hex(key.secret.data(), key.secret.size()) + "\n", 0600);
  write_new_file(prefix + ".pub", to_hex(key.public_key.data(), key.public_key.size()) + "\n", 0644);
  return key.public_key;
}

SigningKey read_signing_key(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(ErrorCode::kInvalidArgument, fmt::format("signing key {}: {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::kInvalidArgument, fmt::format("signing key {}: not a regular file", path));
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("signing key {}: other users can read or write it (mode {:o}); chmod 600 it", path, st.st_mode & 0777));
  const auto bytes = from_hex(trimmed_first_line(path));
  if (!bytes || bytes->size() != 64)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("signing key {}: expected one line of 128 hex digits (a file written by `kiln cache keygen`)", path));
  SigningKey key;
  std::copy(bytes->begin(), bytes->end(), key.secret.begin());
  std::copy(bytes->begin() + 32, bytes->end(), key.public_key.begin());  // libsodium's secret key ends with the public one
  return key;
}

std::vector<PublicKey> parse_trusted_keys(const std::string& spec, const std::string& what) {
  std::vector<PublicKey> keys;
  std::stringstream entries(spec);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    entry.erase(std::remove(entry.begin(), entry.end(), ' '), entry.end());
    if (entry.empty()) continue;
    std::string text = entry;
    const bool hex_shaped = entry.size() == 64 && from_hex(entry).has_value();
    if (!hex_shaped) {
      struct stat st {};
      if (::stat(entry.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("{}: '{}' is neither 64 hex digits (an Ed25519 public key) nor a readable .pub file", what, entry));
      text = trimmed_first_line(entry);
    }
    const auto bytes = from_hex(text);
    if (!bytes || bytes->size() != 32)
      throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: '{}' does not hold 64 hex digits (an Ed25519 public key)", what, entry));
    PublicKey key;
    std::copy(bytes->begin(), bytes->end(), key.begin());
    keys.push_back(key);
  }
  return keys;
}

std::vector<PublicKey> trusted_keys_from_environment() {
  const auto spec = env_string("KILN_CACHE_TRUSTED_KEYS");
  return spec ? parse_trusted_keys(*spec, "KILN_CACHE_TRUSTED_KEYS") : std::vector<PublicKey>{};
}

void load_signing_library() { sodium(); }

RowSignature sign_row(const CacheRow& row, const SigningKey& key) {
  const std::vector<uint8_t> m = signed_message(row);
  RowSignature signature{};
  if (sodium().sign_detached(signature.data(), nullptr, m.data(), m.size(), key.secret.data()) != 0)
    throw Error(ErrorCode::kCacheError, "crypto_sign_detached failed");
  return signature;
}

std::optional<std::string> signature_problem(const CacheRow& row, const std::vector<PublicKey>& trusted, const PublicKey& signer,
                                             const RowSignature& signature) {
  if (std::find(trusted.begin(), trusted.end(), signer) == trusted.end())
    return fmt::format("signed by {}, which is not in KILN_CACHE_TRUSTED_KEYS", to_hex(signer.data(), 8) + "...");
  const std::vector<uint8_t> m = signed_message(row);
  if (sodium().verify_detached(signature.data(), m.data(), m.size(), signer.data()) != 0)
    return "its signature does not verify (the row was changed after it was signed)";
  return std::nullopt;
}

}  // namespace kiln::detail
