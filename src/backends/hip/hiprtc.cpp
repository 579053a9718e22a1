#include "backends/hip/hiprtc.hpp"

#include <dlfcn.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "backends/hip/code_object.hpp"
#include "backends/hip/rocm_library.hpp"
#include "core/dynamic_library.hpp"
#include "core/env.hpp"
#include "kiln/error.hpp"

namespace kiln::detail::hip {
namespace {

// The C ABI of hipRTC (hiprtc.h, ROCm 5 and newer).
using hiprtcResult = int;
using hiprtcProgram = void*;
constexpr hiprtcResult kHiprtcSuccess = 0;
using GetErrorString = const char* (*)(hiprtcResult);
using CreateProgram = hiprtcResult (*)(hiprtcProgram*, const char*, const char*, int, const char**, const char**);
using DestroyProgram = hiprtcResult (*)(hiprtcProgram*);
using AddNameExpression = hiprtcResult (*)(hiprtcProgram, const char*);
using CompileProgram = hiprtcResult (*)(hiprtcProgram, int, const char**);
using GetLoweredName = hiprtcResult (*)(hiprtcProgram, const char*, const char**);
using GetCodeSize = hiprtcResult (*)(hiprtcProgram, size_t*);
using GetCode = hiprtcResult (*)(hiprtcProgram, char*);
using GetProgramLogSize = hiprtcResult (*)(hiprtcProgram, size_t*);
using GetProgramLog = hiprtcResult (*)(hiprtcProgram, char*);

struct HiprtcLibrary : OptionalLibrary {
  std::string file;     // the real file, links resolved: ".../libamdhip64.so.5.2.21153"
  std::string release;  // "5.2.21153", from the file name; empty when it has no version
  int major = 0, minor = 0;
};

const HiprtcLibrary& hiprtc_library() {
  static const HiprtcLibrary lib = [] {
    HiprtcLibrary l;
    static_cast<OptionalLibrary&>(l) = load_optional_library(
        "hipRTC (libhiprtc, or libamdhip64 of ROCm 5)",
        rocm_library_candidates("KILN_LIBHIPRTC", {"libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so", "libamdhip64.so.5"}));
    if (!l.library) return l;
    Dl_info info{};
    try {
      if (dladdr(l.library->symbol("hiprtcCreateProgram"), &info) != 0 && info.dli_fname != nullptr) {
        std::error_code ec;
        l.file = std::filesystem::canonical(info.dli_fname, ec).string();
        if (ec) l.file = info.dli_fname;
      }
    } catch (const Error& e) {  // a libamdhip64 without hipRTC in it
      l.library.reset();
      l.failure = e.message();
      return l;
    }
    const auto at = l.file.rfind(".so.");
    if (at != std::string::npos) {
      l.release = l.file.substr(at + 4);
      std::sscanf(l.release.c_str(), "%d.%d", &l.major, &l.minor);
    }
    return l;
  }();
  return lib;
}

template <typename Fn>
Fn hiprtc_fn(const char* name) {
  const HiprtcLibrary& lib = hiprtc_library();
  if (!lib.library) throw Error(ErrorCode::kDriverError, lib.failure);
  return reinterpret_cast<Fn>(lib.library->symbol(name));
}
#define KILN_HIPRTC_FN(type, name)                      \
  ([]() {                                               \
    static const auto resolved = hiprtc_fn<type>(name); \
    return resolved;                                    \
  }())

void check(hiprtcResult result, const char* call) {
  if (result != kHiprtcSuccess) {
    throw Error(ErrorCode::kDriverError,
                fmt::format("{} failed: {}", call, KILN_HIPRTC_FN(GetErrorString, "hiprtcGetErrorString")(result)));
  }
}

// The first ROCm release whose hipRTC compiles each AMD target kiln knows.
struct TargetSupport {
  const char* arch;
  int major, minor;
};
constexpr TargetSupport kHiprtcTargets[] = {{"gfx90a", 5, 0}, {"gfx942", 6, 0}, {"gfx950", 7, 0}};

class Program {
 public:
  explicit Program(const CompileRequest& r) {
    std::vector<const char*> text, names;
    for (const auto& h : r.headers) {
      names.push_back(h.first.c_str());
      text.push_back(h.second.c_str());
    }
    check(KILN_HIPRTC_FN(CreateProgram, "hiprtcCreateProgram")(&program_, r.source.c_str(), r.source_name.c_str(),
                                                               static_cast<int>(text.size()), text.data(), names.data()),
          "hiprtcCreateProgram");
  }
  ~Program() { KILN_HIPRTC_FN(DestroyProgram, "hiprtcDestroyProgram")(&program_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  hiprtcProgram get() const { return program_; }

  std::string log() const {
    size_t size = 0;
    check(KILN_HIPRTC_FN(GetProgramLogSize, "hiprtcGetProgramLogSize")(program_, &size), "hiprtcGetProgramLogSize");
    std::string text(size, '\0');
    if (size > 0) check(KILN_HIPRTC_FN(GetProgramLog, "hiprtcGetProgramLog")(program_, text.data()), "hiprtcGetProgramLog");
    while (!text.empty() && text.back() == '\0') text.pop_back();
    return text;
  }

 private:
  hiprtcProgram program_ = nullptr;
};

}  // namespace

std::optional<std::string> hiprtc_unavailable() {
  const HiprtcLibrary& lib = hiprtc_library();
  if (!lib.library) return lib.failure;
  return std::nullopt;
}

std::optional<std::string> hiprtc_refuses(const std::string& target) {
  if (auto why = hiprtc_unavailable()) return why;
  const HiprtcLibrary& lib = hiprtc_library();
  const std::string base = target.substr(0, target.find(':'));
  std::vector<std::string> known;
  const TargetSupport* wanted = nullptr;
  for (const auto& t : kHiprtcTargets) {
    if (lib.major > t.major || (lib.major == t.major && lib.minor >= t.minor)) known.emplace_back(t.arch);
    if (base == t.arch) wanted = &t;
  }
  const std::string release = lib.release.empty() ? "of unknown release (treated as ROCm 5.0)" : "of ROCm " + lib.release;
  if (wanted == nullptr || std::find(known.begin(), known.end(), base) == known.end()) {
    return fmt::format(
        "hipRTC {} ({}) does not know target {}{}; kiln does not call it for a target its release "
        "predates (ROCm 5's hipRTC aborts on gfx940 and newer). It compiles: {}",
        release, lib.file, target, wanted ? fmt::format(" (needs ROCm {}.{} or newer)", wanted->major, wanted->minor) : "",
        known.empty() ? std::string("none of kiln's targets") : fmt::format("{}", fmt::join(known, ", ")));
  }
  return std::nullopt;
}

std::optional<std::string> hiprtc_library_fingerprint() {
  const HiprtcLibrary& lib = hiprtc_library();
  if (!lib.library) return std::nullopt;
  struct stat st {};
  if (::stat(lib.file.c_str(), &st) != 0) return std::nullopt;
  return fmt::format("{}|{}|{}|{}", lib.file, st.st_size, static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec,
                     st.st_ino);
}

const std::string& hiprtc_identity() {
  static const std::string identity = [] {
    const HiprtcLibrary& lib = hiprtc_library();
    if (!lib.library) throw Error(ErrorCode::kDriverError, lib.failure);
    struct stat st {};
    ::stat(lib.file.c_str(), &st);
    const std::string what = fmt::format("{}|{}", std::filesystem::path(lib.file).filename().string(), st.st_size);
    return fmt::format("hiprtc {} {:016x}", lib.release.empty() ? "unknown" : lib.release, XXH3_64bits(what.data(), what.size()));
  }();
  return identity;
}

CompileResult hiprtc_compile(const CompileRequest& r) {
  if (auto why = hiprtc_refuses(r.target)) throw Error(ErrorCode::kUnsupported, *why);
  const auto start = std::chrono::steady_clock::now();
  Program program(r);
  if (!r.name_expression.empty()) {
    check(KILN_HIPRTC_FN(AddNameExpression, "hiprtcAddNameExpression")(program.get(), r.name_expression.c_str()),
          "hiprtcAddNameExpression");
  }
  std::vector<std::string> options = r.options;
  options.insert(options.begin(), "--offload-arch=" + r.target);
  std::vector<const char*> option_ptrs;
  for (const auto& o : options) option_ptrs.push_back(o.c_str());
  const hiprtcResult status =
      KILN_HIPRTC_FN(CompileProgram, "hiprtcCompileProgram")(program.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());
  CompileResult result;
  result.log = program.log();
  if (status != kHiprtcSuccess) {
    throw Error::compile_failed(r.kernel_name, r.target, options,
                                fmt::format("{}\n{}", KILN_HIPRTC_FN(GetErrorString, "hiprtcGetErrorString")(status), result.log));
  }
  size_t size = 0;
  check(KILN_HIPRTC_FN(GetCodeSize, "hiprtcGetCodeSize")(program.get(), &size), "hiprtcGetCodeSize");
  if (size == 0) throw Error::compile_failed(r.kernel_name, r.target, options, "hipRTC produced no code object\n" + result.log);
  result.binary.resize(size);
  check(KILN_HIPRTC_FN(GetCode, "hiprtcGetCode")(program.get(), reinterpret_cast<char*>(result.binary.data())), "hiprtcGetCode");
  const CodeObjectInfo info = read_code_object(result.binary);
  if (!target_runs(info.target, r.target)) {
    throw Error::compile_failed(r.kernel_name, r.target, options,
                                fmt::format("hipRTC built a code object for {}, not {}", info.target, r.target));
  }
  if (!r.name_expression.empty()) {
    const char* lowered = nullptr;
    check(KILN_HIPRTC_FN(GetLoweredName, "hiprtcGetLoweredName")(program.get(), r.name_expression.c_str(), &lowered),
          "hiprtcGetLoweredName");
    result.lowered_name = lowered;
  }
  result.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kiln::detail::hip
