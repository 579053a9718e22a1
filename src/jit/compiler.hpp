// Runs a CompileRequest with the configured isolation (kiln/jit.hpp).
#pragma once

#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/compile_request.hpp"
#include "kiln/jit.hpp"

namespace kiln::detail {

CompileResult compile(const CompileRequest& request, const JitSettings& settings);
// Remembers compiler identities in the process's cache (backends compute them).
const IdentityMemo& cache_identity_memo();
// In a worker process under a time limit. Throws kiln::Error(kCompileFailed) when the worker
// crashes, hangs past the limit or reports a compile error.
CompileResult compile_in_worker(const CompileRequest& request, const std::string& worker_path, double timeout_seconds);
// The compiler for a platform's target: NVRTC for NVIDIA; for AMD as JitSettings::amd_compiler
// says. Throws kiln::Error(kUnsupported) saying why no compiler can build the target.
CompilerKind compiler_for(const Platform& platform, const JitSettings& settings);
// The request's compiler run here, not in a worker (clang still runs as a child process, under
// `timeout_seconds`).
CompileResult compile_in_this_process(const CompileRequest& request, double timeout_seconds);
// The compiler identity a key records for this request's compiler: remembered in the cache per
// compiler file, so a warm process finds its kernels without loading the compiler.
std::string compiler_identity(CompilerKind kind);
// KILN_COMPILE_ISOLATION, KILN_COMPILE_WORKER and KILN_COMPILE_TIMEOUT_S, read now (jit_settings()
// reads them once). Throws kiln::Error(kInvalidArgument) naming the variable.
JitSettings jit_settings_from_environment();

// The longest compile time limit accepted (a week): past it the deadline arithmetic overflows.
inline constexpr long long kMaxCompileTimeoutSeconds = 7 * 24 * 3600;

// Stops compiles in workers: running ones are killed within 0.1 s and new ones are refused, each
// with kiln::Error(kCompileFailed) saying so. Async-signal-safe: a SIGINT handler may call it (a
// worker started after the signal never saw it, and would run to its time limit).
void cancel_compiles() noexcept;

// The worker kiln would use: JitSettings::worker_path, else beside libkiln.
std::string default_worker_path();

// Worker protocol (version kWorkerProtocolVersion): the request's CBOR on stdin; on stdout one
// status byte then CBOR, at most kMaxWorkerReplyBytes — status 0: an encode_result() payload;
// status 1: {"protocol", "code", "message", "log", "options", "target"}.
inline constexpr uint8_t kWorkerOk = 0;
inline constexpr uint8_t kWorkerError = 1;
// A worker's whole stdout for `request` as its result, or kiln::Error: kCompileFailed for a
// compile error or any malformed reply (`options` and the worker's stderr `err` go into the
// message), the worker's own code for other errors. Throws nothing else.
CompileResult read_worker_reply(const CompileRequest& request, const std::vector<uint8_t>& out, const std::vector<std::string>& options,
                                const std::string& err);
// The worker's stderr kept for messages; the rest is read and dropped.
inline constexpr size_t kMaxWorkerLogBytes = size_t{1} << 20;

}  // namespace kiln::detail
