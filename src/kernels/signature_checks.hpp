// Signature checks shared by the built-in kernels' `accepts`: nullopt when the signature passes,
// else the reason, naming the key and what is supported.
#pragma once

#include <optional>
#include <string>

#include <fmt/format.h>

#include "kiln/registry.hpp"

namespace kiln::detail {

// `key` ("dtype") is bf16 or f16.
inline std::optional<std::string> check_16bit_dtype(const Signature& sig, const char* key = "dtype") {
  const std::string& dtype = sig.get(key);
  if (dtype != "bf16" && dtype != "f16") return fmt::format("{} {} unsupported (supported: bf16, f16)", key, dtype);
  return std::nullopt;
}

// kv_dtype: the dtype itself, or e4m3 (a cache read through per-tensor scales).
inline std::optional<std::string> check_same_or_e4m3_cache(const Signature& sig) {
  const std::string& kv = sig.get("kv_dtype");
  if (kv != sig.get("dtype") && kv != "e4m3") {
    return fmt::format("kv_dtype {} unsupported with dtype {} (supported: the same, or e4m3)", kv, sig.get("dtype"));
  }
  return std::nullopt;
}

// head_dim 64 or 128: the tensor-core kernels' tile shapes; with `also_256`, 256 too.
inline std::optional<std::string> check_head_dim_64_or_128(const Signature& sig, bool also_256 = false) {
  const int64_t d = sig.get_int("head_dim");
  if (d == 64 || d == 128 || (also_256 && d == 256)) return std::nullopt;
  return fmt::format("head_dim {} unsupported (supported: 64, 128{})", d, also_256 ? ", 256" : "");
}

}  // namespace kiln::detail
