#include "jit/key.hpp"

#include <xxhash.h>

#include <algorithm>

#include <fmt/format.h>

namespace kiln::detail {
namespace {

void put(std::string& out, const std::string& field) {
  const uint64_t n = field.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));  // little endian
  out += field;
}

}  // namespace

std::string key_material(const CompileRequest& r, const std::string& compiler_identity) {
  std::string out;
  put(out, "kiln-kernel-key");
  put(out, std::to_string(kKeyFormatVersion));
  put(out, r.kernel_name);
  put(out, r.source_name);
  put(out, r.source);
  auto headers = r.headers;
  std::sort(headers.begin(), headers.end());
  put(out, std::to_string(headers.size()));
  for (const auto& [name, text] : headers) {
    put(out, name);
    put(out, text);
  }
  put(out, r.name_expression);
  put(out, std::to_string(r.options.size()));
  for (const auto& o : r.options) put(out, o);
  put(out, r.target);
  put(out, compiler_identity);
  return out;
}

KernelKey compute_key(const CompileRequest& r, const std::string& compiler_identity) {
  const std::string bytes = key_material(r, compiler_identity);
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return {h.high64, h.low64};
}

}  // namespace kiln::detail
