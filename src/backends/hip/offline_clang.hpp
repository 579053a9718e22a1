// The offline AMD compiler: clang (20 or newer; Debian's clang-22 here, or ROCm's own clang)
// compiling kiln's kernel sources to a code object for a named gfx target, as a child process.
// A build box with no ROCm and no GPU produces a fleet's AMD binaries this way.
#pragma once

#include <optional>
#include <string>

#include "backends/compile_request.hpp"

namespace kiln::detail::hip {

// The clang kiln uses: KILN_CLANG, else the newest clang++-NN (20 to 23) on PATH or under
// /usr/lib/llvm-NN/bin, else ROCm's (ROCM_PATH or /opt/rocm)/llvm/bin/clang++. nullopt and
// `why` filled when there is none, or the one named is older than 20 (no gfx950).
std::optional<std::string> find_clang(std::string* why = nullptr);

// Compiles request.source (its headers written to a private temporary folder) for
// request.target under a time limit. Throws kiln::Error(kCompileFailed) with clang's output.
CompileResult clang_compile(const CompileRequest& request, double timeout_seconds);

// "clang 22.1.8 <hash>": the version line clang prints, plus a hash of its full --version text
// and the compiler file's size. Runs clang once per process.
const std::string& clang_identity();

// "<path>|<size>|<mtime ns>|<inode>" of the clang binary find_clang() picks.
std::optional<std::string> clang_fingerprint();

}  // namespace kiln::detail::hip
