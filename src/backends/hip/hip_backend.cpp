// AMD's implementation of the backend interface: the HIP runtime (runtime.hpp), hipRTC and the
// offline clang.
#include <fmt/format.h>

#include "backends/backend.hpp"
#include "backends/hip/code_object.hpp"
#include "backends/hip/hiprtc.hpp"
#include "backends/hip/offline_clang.hpp"
#include "backends/hip/runtime.hpp"
#include "kiln/error.hpp"

namespace kiln::detail::hip {
namespace {

class HipBackend final : public VendorBackend {
 public:
  Backend kind() const override { return Backend::kHip; }
  Vendor vendor() const override { return Vendor::kAmd; }
  const char* name() const override { return "hip"; }

  int device_count() override { return hip::device_count(); }

  void detect(DeviceReport& report) override {
    int count = 0;
    try {
      count = hip::device_count();
    } catch (const Error& e) {
      // The usual case on a machine without an AMD GPU: the runtime loads and says hipErrorNoDevice.
      report.notes.emplace_back("AMD GPUs: none usable: " + e.message());
      return;
    }
    if (count == 0) report.notes.emplace_back("AMD GPUs: the HIP runtime is loaded but reports no GPU");
    for (int i = 0; i < count; ++i) {
      try {
        report.devices.push_back(hip::device_platform(i));
      } catch (const Error& e) {
        report.notes.emplace_back(fmt::format("AMD GPU {}: {}", i, e.message()));
      }
    }
  }

  const Platform& device_platform(int index) override { return hip::device_platform(index); }
  int runtime_version() override { return hip::runtime_version(); }
  std::pair<size_t, size_t> memory_info(int index) override { return hip::memory_info(index); }

  CompilerKind compiler_for(const Platform& platform, const JitSettings& settings) override {
    std::string no_clang;
    switch (settings.amd_compiler) {
      case AmdCompiler::kHiprtc:
        if (auto why = hiprtc_refuses(platform.arch)) throw Error(ErrorCode::kUnsupported, *why);
        return CompilerKind::kHiprtc;
      case AmdCompiler::kClang:
        if (!find_clang(&no_clang)) throw Error(ErrorCode::kUnsupported, no_clang);
        return CompilerKind::kClang;
      case AmdCompiler::kAuto: {
        const auto no_hiprtc = hiprtc_refuses(platform.arch);
        if (!no_hiprtc) return CompilerKind::kHiprtc;
        if (find_clang(&no_clang)) return CompilerKind::kClang;
        throw Error(ErrorCode::kUnsupported, fmt::format("no compiler for {}: {}; and {}", platform.arch, *no_hiprtc, no_clang));
      }
    }
    throw Error(ErrorCode::kInternal, "unknown AMD compiler setting");
  }

  bool uses(CompilerKind compiler) const override { return compiler == CompilerKind::kHiprtc || compiler == CompilerKind::kClang; }

  // KILN_HIPRTC / KILN_HIP_CLANG select the prelude's half for that compiler.
  std::vector<std::string> base_options(CompilerKind compiler) const override {
    if (compiler == CompilerKind::kClang) return {"-std=c++17", "-O3", "-DKILN_HIP_CLANG=1"};
    return {"-std=c++17", "-O3", "-DKILN_HIPRTC=1"};
  }

  std::string compiler_identity(CompilerKind compiler, const IdentityMemo& memo) override {
    if (compiler == CompilerKind::kClang) {
      static const std::string identity = memo(clang_fingerprint(), [] { return clang_identity(); });
      return identity;
    }
    static const std::string identity = memo(hiprtc_library_fingerprint(), [] { return hiprtc_identity(); });
    return identity;
  }

  CompileResult compile(const CompileRequest& request, double timeout_seconds) override {
    if (request.compiler == CompilerKind::kClang) return clang_compile(request, timeout_seconds);
    return hiprtc_compile(request);
  }

  std::optional<std::string> binary_problem(const std::string& target, const std::vector<uint8_t>& binary) const override {
    try {
      const CodeObjectInfo info = read_code_object(binary);
      if (!target_runs(info.target, target)) return fmt::format("a code object for {}, not {}", info.target, target);
    } catch (const Error& e) {
      return e.message();
    }
    return std::nullopt;
  }

  void report_compilers(const std::vector<std::string>& targets, const IdentityMemo& memo, std::vector<CompilerReport>& out) override {
    auto identity_of = [&](CompilerReport& r, CompilerKind compiler) {
      try {
        r.identity = compiler_identity(compiler, memo);
      } catch (const Error& e) {
        r.note = e.message();
      }
    };
    CompilerReport hiprtc{"hiprtc", "", {}, ""};
    if (auto why = hiprtc_unavailable()) {
      hiprtc.note = *why;
    } else {
      identity_of(hiprtc, CompilerKind::kHiprtc);
      std::vector<std::string> refused;
      for (const auto& t : targets) (hiprtc_refuses(t) ? refused : hiprtc.targets).push_back(t);
      if (!refused.empty()) hiprtc.note = fmt::format("refuses {}: its ROCm release predates them", fmt::join(refused, ", "));
    }
    out.push_back(hiprtc);
    CompilerReport clang{"clang", "", {}, ""};
    if (const auto path = find_clang(&clang.note)) {
      identity_of(clang, CompilerKind::kClang);
      if (!clang.identity.empty()) {
        clang.targets = targets;
        clang.note = *path;
      }
    }
    out.push_back(clang);
  }

  // The device is made current by each call that needs it; nothing to undo.
  LaunchScope enter(int index) override {
    LaunchScope scope;
    scope.platform = &hip::device_platform(index);
    scope.key = scope.platform;  // its address is stable
    scope.device = index;
    return scope;
  }
  void leave(LaunchScope&) noexcept override {}

  DeviceFunction load(const LaunchScope& scope, const std::vector<uint8_t>& binary, const std::string& lowered_name,
                      const std::string& kernel_name) override {
    const LoadedFunction f = load_function(scope.device, binary, lowered_name, kernel_name);
    return {f.module, f.function, nullptr};
  }

  void unload(const DeviceFunction& function) noexcept override {
    try {
      hip::unload(LoadedFunction{function.module, function.function});
    } catch (...) {
      // Unreachable: load() resolved the same runtime.
    }
  }

  void encode_tensor_map(const TensorMapRequest&, void*, const std::string& kernel_name) override {
    throw Error(ErrorCode::kUnsupported, fmt::format("kernel '{}' needs tensor maps, which kiln provides on NVIDIA only", kernel_name));
  }

  void launch(const LaunchScope& scope, const DeviceFunction& function, const LaunchShape& shape, const void* params, size_t, Stream stream,
              const std::string& kernel_name) override {
    hip::launch(scope.device, function.function, shape, params, stream, kernel_name);
  }

  void* stream_alloc(const LaunchScope& scope, size_t bytes, Stream stream) override {
    return hip::stream_alloc(scope.device, bytes, stream);
  }
  void stream_free(void* pointer, Stream stream) noexcept override { hip::stream_free(pointer, stream); }
  void fill_async(void* pointer, uint8_t value, size_t bytes, Stream stream) override { hip::fill_async(pointer, value, bytes, stream); }
  bool stream_capturing(Stream stream) override { return hip::stream_capturing(stream); }

  void* device_alloc(size_t bytes) override { return hip::device_alloc(bytes); }
  void device_free(void* pointer) noexcept override { hip::device_free(pointer); }
  void memset(void* device_pointer, uint8_t value, size_t bytes) override { hip::memset(device_pointer, value, bytes); }
  void copy_to_host(void* host, const void* device_pointer, size_t bytes, Stream stream) override {
    hip::copy(host, device_pointer, bytes, false, stream);
  }
  void copy_to_device(void* device_pointer, const void* host, size_t bytes, Stream stream) override {
    hip::copy(device_pointer, host, bytes, true, stream);
  }
  void synchronize(Stream stream) override { hip::synchronize(stream); }
  void synchronize_device() override { hip::synchronize_device(); }
  void* event_create() override { return hip::event_create(); }
  void event_destroy(void* event) noexcept override { hip::event_destroy(event); }
  void event_record(void* event, Stream stream) override { hip::event_record(event, stream); }
  void event_synchronize(void* event) override { hip::event_synchronize(event); }
  float event_elapsed_ms(void* start, void* stop) override { return hip::event_elapsed_ms(start, stop); }
};

}  // namespace

KILN_REGISTER_BACKEND(HipBackend, 1);

}  // namespace kiln::detail::hip
