// Reading AMD GPU code objects (ELF, e_machine EM_AMDGPU): the target they were built for and the
// kernels they define. kiln uses it to name the entry point of a clang-built binary, to refuse a
// cached binary built for another target, and in tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::detail::hip {

struct CodeObjectInfo {
  // "gfx942", "gfx950:sramecc+:xnack-": the base arch plus each feature the object fixes on or off.
  // A feature built as "any" (runs either way) is left out.
  std::string target;
  std::string arch;                  // base arch: "gfx942"
  std::vector<std::string> kernels;  // mangled names of the entry points (symbols with a ".kd")
};

// Throws kiln::Error(kInvalidArgument) when `bytes` is not a 64-bit little-endian AMDGPU ELF or
// is truncated anywhere kiln reads.
CodeObjectInfo read_code_object(const std::vector<uint8_t>& bytes);

// True when a binary built for `built` runs on `wanted` ("gfx942:xnack-" runs a "gfx942" object
// built with xnack "any", and a "gfx942:xnack-" object, but not a "gfx942:xnack+" one).
bool target_runs(const std::string& built, const std::string& wanted);

// The entry point among `kernels` that `name_expression` ("kiln::decode_reference<kiln::bf16,
// kiln::bf16, 128>") names: compared with each kernel's demangled name, spaces ignored, where
// the object holds more than one. Throws kiln::Error(kCompileFailed) listing the kernels found.
std::string find_kernel(const CodeObjectInfo& info, const std::string& name_expression);

}  // namespace kiln::detail::hip
