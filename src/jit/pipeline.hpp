// The JIT pipeline: specialization -> source assembly -> key -> loaded-kernel table -> compile
// (single flight per key) -> load -> launch.
#pragma once

#include <memory>

#include "jit/compile_request.hpp"
#include "jit/key.hpp"
#include "kiln/registry.hpp"

namespace kiln::detail {

// The compile request for a kernel specialized to a signature on a platform.
CompileRequest build_request(const KernelSpec& spec, const Signature& sig, const Platform& platform);

// A compiled kernel for one key: compiled once per process (concurrent callers of the same key
// wait for the one compile; different keys compile in parallel).
struct CompiledBinary {
  KernelKey key;
  CompileResult result;
};
std::shared_ptr<const CompiledBinary> get_or_compile(const CompileRequest& request);

}  // namespace kiln::detail
