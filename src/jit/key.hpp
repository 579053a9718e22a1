// The cache key of a compiled kernel: XXH3-128 over canonical bytes of everything that changes
// the binary, and nothing else (no paths, no mtimes, no process state).
#pragma once

#include <cstdint>
#include <string>

#include "backends/compile_request.hpp"
#include "cache/kernel_key.hpp"

namespace kiln::detail {

// You MUST bump kKeyFormatVersion whenever key_material() changes what it writes or how, or
// whenever the binary format kiln stores changes. tests/test_key.cpp holds golden bytes and a
// golden hash that fail on any unversioned change.
inline constexpr uint32_t kKeyFormatVersion = 1;

// Length-prefixed fields: format tag and version, kernel name, source name and text, every
// header (sorted by name) with its text, name expression, options in order, target, compiler
// identity.
std::string key_material(const CompileRequest& request, const std::string& compiler_identity);
KernelKey compute_key(const CompileRequest& request, const std::string& compiler_identity);

}  // namespace kiln::detail
