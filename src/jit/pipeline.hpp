// The JIT pipeline: specialization -> source assembly -> key -> loaded-kernel table -> compile
// (single flight per key) -> load -> launch.
#pragma once

#include <functional>
#include <memory>

#include "backends/compile_request.hpp"
#include "jit/key.hpp"
#include "kiln/registry.hpp"

namespace kiln::detail {

// The compile request for a kernel specialized to a signature on a platform.
CompileRequest build_request(const KernelSpec& spec, const Signature& sig, const Platform& platform);

// A compiled kernel for one key, and where it came from.
struct CompiledBinary {
  KernelKey key;
  CompileResult result;
  std::string compiler;             // the identity of the compiler that built it
  const char* origin = "compiled";  // "compiled", "disk" (writable cache), "seed" or "remote"
  bool stored = false;              // in the on-disk cache (or a seed) for the next process
};

// Throws when a binary cannot be used here (e.g. the driver refuses to load it).
using BinaryCheck = std::function<void(const CompiledBinary&)>;

// The binary for a request: from this process's table, else the on-disk cache (verified, and
// passed through `check` when given: a row that fails it is dropped), else compiled — once per
// key in the process (concurrent callers wait for the one compile) and once per key across the
// host's processes (a per-key lock) — then checked and published to the cache.
// `shared`, when given, is set when another call in this process produced the binary.
std::shared_ptr<const CompiledBinary> get_or_compile(const CompileRequest& request, const BinaryCheck& check = nullptr,
                                                     bool* shared = nullptr);

}  // namespace kiln::detail
