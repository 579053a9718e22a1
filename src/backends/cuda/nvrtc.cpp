#include "backends/cuda/nvrtc.hpp"

#include <filesystem>

#include <dlfcn.h>

#include <nvrtc.h>
#include <xxhash.h>

#include <sys/stat.h>

#include <chrono>
#include <memory>

#include <fmt/format.h>

#include "core/dynamic_library.hpp"
#include "core/env.hpp"
#include "kiln/error.hpp"

namespace kiln::detail::cuda {
namespace {

// Where kiln looks for libnvrtc, in order: the newest soname first, under CUDA_HOME, CUDA_PATH,
// /usr/local/cuda, then the loader's search path (bare sonames).
std::vector<std::string> nvrtc_candidates() {
  if (auto path = env_string("KILN_LIBNVRTC")) return {*path};  // exactly this one
  std::vector<std::string> dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (auto root = env_string(var)) dirs.push_back(*root + "/lib64/");
  }
  dirs.push_back("/usr/local/cuda/lib64/");
  dirs.push_back("");
  std::vector<std::string> candidates;
  for (const char* soname : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
    for (const auto& dir : dirs) candidates.push_back(dir + soname);
  }
  return candidates;
}

// NVRTC opens libnvrtc-builtins for every compile and closes it after. That library has
// thread-local storage, and unloading it leaves stale dynamic-TLS records in the process (LSan's
// leak check then crashed reading them); it also costs a reload per compile. Kept loaded here, as
// kiln keeps every vendor library. Best effort: NVRTC loads it itself when this finds nothing.
void keep_builtins_loaded(const DynamicLibrary& nvrtc) {
  const std::string& path = nvrtc.path();
  const std::string dir = path.find('/') == std::string::npos ? "" : std::filesystem::path(path).parent_path().string() + "/";
  int major = 0, minor = 0;
  const auto version = reinterpret_cast<decltype(&nvrtcVersion)>(nvrtc.symbol("nvrtcVersion"));
  if (version(&major, &minor) != NVRTC_SUCCESS) return;
  for (const std::string& name :
       {fmt::format("{}libnvrtc-builtins.so.{}.{}", dir, major, minor), fmt::format("libnvrtc-builtins.so.{}.{}", major, minor)}) {
    if (dlopen(name.c_str(), RTLD_NOW | RTLD_NODELETE) != nullptr) return;
  }
}

const DynamicLibrary& nvrtc_library() {
  static const std::unique_ptr<DynamicLibrary> lib = [] {
    auto loaded = std::make_unique<DynamicLibrary>("NVRTC (libnvrtc)", nvrtc_candidates());
    keep_builtins_loaded(*loaded);
    return loaded;
  }();
  return *lib;
}

#define KILN_NVRTC_FN(fn)                                                                      \
  ([]() {                                                                                      \
    static const auto resolved = reinterpret_cast<decltype(&fn)>(nvrtc_library().symbol(#fn)); \
    return resolved;                                                                           \
  }())

void check(nvrtcResult result, const char* call) {
  if (result != NVRTC_SUCCESS) {
    throw Error(ErrorCode::kDriverError, fmt::format("{} failed: {}", call, KILN_NVRTC_FN(nvrtcGetErrorString)(result)));
  }
}
#define KILN_NVRTC_CALL(fn, ...) check(KILN_NVRTC_FN(fn)(__VA_ARGS__), #fn)

// Owns an nvrtcProgram so every error path destroys it.
class Program {
 public:
  explicit Program(const CompileRequest& r) {
    std::vector<const char*> header_text, header_names;
    for (const auto& h : r.headers) {
      header_names.push_back(h.first.c_str());
      header_text.push_back(h.second.c_str());
    }
    KILN_NVRTC_CALL(nvrtcCreateProgram, &program_, r.source.c_str(), r.source_name.c_str(), static_cast<int>(header_text.size()),
                    header_text.data(), header_names.data());
  }
  ~Program() { KILN_NVRTC_FN(nvrtcDestroyProgram)(&program_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return program_; }

  std::string log() const {
    size_t size = 0;
    KILN_NVRTC_CALL(nvrtcGetProgramLogSize, program_, &size);
    std::string text(size, '\0');
    if (size > 0) KILN_NVRTC_CALL(nvrtcGetProgramLog, program_, text.data());
    while (!text.empty() && text.back() == '\0') text.pop_back();
    return text;
  }

 private:
  nvrtcProgram program_ = nullptr;
};

}  // namespace

std::string nvrtc_library_path() { return nvrtc_library().path(); }

std::optional<std::string> nvrtc_library_fingerprint() {
  for (const auto& candidate : nvrtc_candidates()) {
    if (candidate.find('/') == std::string::npos) return std::nullopt;  // would come from the loader
    struct stat st {};
    if (::stat(candidate.c_str(), &st) != 0) continue;
    return fmt::format("{}|{}|{}|{}", candidate, st.st_size, static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec,
                       st.st_ino);
  }
  return std::nullopt;
}

CompileResult nvrtc_compile(const CompileRequest& r) {
  const auto start = std::chrono::steady_clock::now();
  Program program(r);
  if (!r.name_expression.empty()) KILN_NVRTC_CALL(nvrtcAddNameExpression, program.get(), r.name_expression.c_str());
  std::vector<std::string> options = r.options;
  options.insert(options.begin(), "-arch=" + r.target);
  std::vector<const char*> option_ptrs;
  for (const auto& o : options) option_ptrs.push_back(o.c_str());
  const nvrtcResult status = KILN_NVRTC_FN(nvrtcCompileProgram)(program.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());
  CompileResult result;
  result.log = program.log();
  if (status != NVRTC_SUCCESS) {
    throw Error::compile_failed(r.kernel_name, r.target, options,
                                fmt::format("{}\n{}", KILN_NVRTC_FN(nvrtcGetErrorString)(status), result.log));
  }
  size_t size = 0;
  KILN_NVRTC_CALL(nvrtcGetCUBINSize, program.get(), &size);
  if (size == 0) {
    throw Error::compile_failed(r.kernel_name, r.target, options,
                                "NVRTC produced no CUBIN (is the target a real sm_XX arch?)\n" + result.log);
  }
  result.binary.resize(size);
  KILN_NVRTC_CALL(nvrtcGetCUBIN, program.get(), reinterpret_cast<char*>(result.binary.data()));
  if (!r.name_expression.empty()) {
    const char* lowered = nullptr;
    KILN_NVRTC_CALL(nvrtcGetLoweredName, program.get(), r.name_expression.c_str(), &lowered);
    result.lowered_name = lowered;
  }
  result.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

const std::string& nvrtc_identity() {
  static const std::string identity = [] {
    int major = 0, minor = 0;
    KILN_NVRTC_CALL(nvrtcVersion, &major, &minor);
    // PTX of an empty program carries the compiler's full build string.
    nvrtcProgram program = nullptr;
    KILN_NVRTC_CALL(nvrtcCreateProgram, &program, "__global__ void kiln_probe() {}", "probe.cu", 0, nullptr, nullptr);
    std::string ptx;
    const char* opts[] = {"-arch=compute_80"};
    if (KILN_NVRTC_FN(nvrtcCompileProgram)(program, 1, opts) == NVRTC_SUCCESS) {
      size_t size = 0;
      KILN_NVRTC_FN(nvrtcGetPTXSize)(program, &size);
      ptx.resize(size);
      KILN_NVRTC_FN(nvrtcGetPTX)(program, ptx.data());
    }
    KILN_NVRTC_FN(nvrtcDestroyProgram)(&program);
    return fmt::format("nvrtc {}.{} {:016x}", major, minor, XXH3_64bits(ptx.data(), ptx.size()));
  }();
  return identity;
}

}  // namespace kiln::detail::cuda
