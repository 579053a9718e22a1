// NVRTC, loaded at first use (libnvrtc.so.13 first), and the in-process compile of one kernel.
#pragma once

#include <optional>
#include <string>

#include "backends/compile_request.hpp"

namespace kiln::detail::cuda {

// Compiles request.source for request.target to a CUBIN (never PTX) and resolves the lowered
// name of request.name_expression. Throws kiln::Error(kCompileFailed) with the log, options and
// target, or kDriverError when NVRTC itself cannot be loaded.
CompileResult nvrtc_compile(const CompileRequest& request);

// "nvrtc 13.0 <fingerprint>": the version plus a hash of the PTX NVRTC emits for an empty
// program, which changes with any compiler build. Computed once per process.
const std::string& nvrtc_identity();

// "<path>|<size>|<mtime ns>|<inode>" of the libnvrtc file kiln would load, found without loading
// it; nullopt when it would come from the loader's search path. A memo of nvrtc_identity() is
// keyed by this, so a warm process never loads the compiler.
std::optional<std::string> nvrtc_library_fingerprint();

// Where libnvrtc was loaded from (for `kiln devices`); throws when it cannot be loaded.
std::string nvrtc_library_path();

}  // namespace kiln::detail::cuda
