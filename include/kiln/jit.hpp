// Controls of kiln's JIT and offline compilation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/signature.hpp"

namespace kiln {

// Where the run-time compiler runs.
//   kWorkerProcess (default): in `kiln-compile-worker`, a small executable shipped with kiln,
//     under a time limit. A compiler crash or hang becomes kiln::Error(kCompileFailed) and the
//     calling process lives on. Costs one process start per compile (measured in README).
//   kInProcess: NVRTC in the calling process. Faster, but a compiler crash takes the process
//     down (NVRTC 13.0 segfaults on some inline-PTX inputs).
// KILN_COMPILE_ISOLATION=process|inprocess, KILN_COMPILE_WORKER=PATH and
// KILN_COMPILE_TIMEOUT_S=SECONDS set the same from the environment.
enum class CompileIsolation { kWorkerProcess, kInProcess };

// Which compiler builds AMD kernels (KILN_AMD_COMPILER=auto|hiprtc|clang).
//   kAuto: hipRTC when its ROCm release knows the target, else the offline clang.
//   kHiprtc: only hipRTC; a target it does not know is an error (kUnsupported).
//   kClang: only clang (20 or newer; KILN_CLANG names the binary). A fleet whose cache was
//     warmed by clang on a build box runs with this, and the same clang release: the key records
//     the compiler, so binaries of another compiler are not taken for them.
enum class AmdCompiler { kAuto, kHiprtc, kClang };

struct JitSettings {
  CompileIsolation isolation = CompileIsolation::kWorkerProcess;
  std::string worker_path;       // empty: next to libkiln (../libexec/kiln/kiln-compile-worker)
  double timeout_seconds = 300;  // worker, and the offline clang
  AmdCompiler amd_compiler = AmdCompiler::kAuto;
  // false (KILN_JIT=off): compiler-free serving. kiln never compiles and never loads a compiler
  // library; kernels come from the cache directory or its seeds only, found by the compiler
  // identity recorded in their rows (whatever built them for this exact target), and a miss is
  // kiln::Error(kNoKernel) naming the signature, the target and the `kiln warmup` command that
  // would have stored it.
  bool compile = true;
};

JitSettings jit_settings();
void set_jit_settings(const JitSettings& settings);

struct CompiledKernel {
  std::string kernel;     // registered kernel name
  std::string signature;  // canonical
  std::string target;     // "sm_90a", "gfx942"
  std::string key;        // 32 hex digits (XXH3-128)
  std::string name_expression;
  std::string lowered_name;
  std::string compiler;         // compiler identity
  std::vector<uint8_t> binary;  // CUBIN, or an AMD code object
  double compile_ms = 0;
  // "compiled", "disk" (the cache), "seed" (a seed database), "remote" (the fleet tier, see
  // kiln/cache.hpp), or "memory" (an earlier call in this
  // process produced the same binary, e.g. for another signature that specializes identically)
  std::string origin;
  // Whether the binary is in the on-disk cache (or a seed) where the next process finds it: false
  // when the cache is memory only or the write failed (a full disk).
  bool stored = false;
};

// The run-time and offline compilers kiln can use on this machine (`kiln devices` prints them).
struct CompilerReport {
  std::string compiler;              // "nvrtc", "hiprtc", "clang"
  std::string identity;              // as recorded in keys; empty when unavailable
  std::vector<std::string> targets;  // known targets it builds here
  std::string note;                  // why it is unavailable, or which targets it refuses
};
std::vector<CompilerReport> available_compilers();

// Selects the kernel for `sig` on `target` (a name from known_targets()) and compiles it, or
// takes it from the cache (and publishes what it compiles there). Needs no GPU and no driver:
// only the run-time compiler. Throws kiln::Error.
CompiledKernel compile_for_target(const Signature& sig, const std::string& target);

}  // namespace kiln
