// NVIDIA's implementation of the backend interface: the driver API (device.hpp) and NVRTC.
#include <cstring>
#include <sstream>

#include <fmt/format.h>

#include "backends/backend.hpp"
#include "backends/cuda/device.hpp"
#include "backends/cuda/driver.hpp"
#include "backends/cuda/nvrtc.hpp"
#include "kiln/error.hpp"
#include "kiln/platform.hpp"

namespace kiln::detail::cuda {
namespace {

class CudaBackend final : public VendorBackend {
 public:
  Backend kind() const override { return Backend::kCuda; }
  Vendor vendor() const override { return Vendor::kNvidia; }
  const char* name() const override { return "cuda"; }

  int device_count() override { return cuda::device_count(); }

  void detect(DeviceReport& report) override {
    if (!driver_available()) {
      try {
        driver_symbol("cuInit");
      } catch (const Error& e) {
        report.notes.emplace_back("NVIDIA GPUs: " + e.message());
      }
      return;
    }
    int count = 0;
    try {
      count = cuda::device_count();
    } catch (const Error& e) {
      report.notes.emplace_back("NVIDIA GPUs: " + e.message());
      return;
    }
    if (count == 0) report.notes.emplace_back("NVIDIA GPUs: the NVIDIA driver is loaded but reports no GPU");
    for (int i = 0; i < count; ++i) {
      try {
        report.devices.push_back(device(i).platform);
      } catch (const Error& e) {
        report.notes.emplace_back(fmt::format("NVIDIA GPU {}: {}", i, e.message()));
      }
    }
  }

  const Platform& device_platform(int index) override { return device(index).platform; }

  int runtime_version() override {
    int version = 0;
    KILN_CU_CALL(cuDriverGetVersion, &version);
    return version;
  }

  std::pair<size_t, size_t> memory_info(int index) override {
    ScopedContext context(device(index));
    size_t free_bytes = 0, total_bytes = 0;
    KILN_CU_CALL(cuMemGetInfo, &free_bytes, &total_bytes);
    return {free_bytes, total_bytes};
  }

  CompilerKind compiler_for(const Platform&, const JitSettings&) override { return CompilerKind::kNvrtc; }
  bool uses(CompilerKind compiler) const override { return compiler == CompilerKind::kNvrtc; }
  // KILN_NVRTC selects the prelude's NVRTC half.
  std::vector<std::string> base_options(CompilerKind) const override { return {"-std=c++17", "-DKILN_NVRTC=1"}; }

  std::string compiler_identity(CompilerKind, const IdentityMemo& memo) override {
    static const std::string identity = memo(nvrtc_library_fingerprint(), [] { return nvrtc_identity(); });
    return identity;
  }

  CompileResult compile(const CompileRequest& request, double) override { return nvrtc_compile(request); }

  // A CUBIN is a 64-bit little-endian ELF of machine EM_CUDA (190) whose flags name its SM: bits
  // 8-15 in the ELF ABI version 8 that NVRTC 12.8+ writes (sm_80 0x6005004, sm_120a 0x6007802),
  // bits 0-7 before. The "a" of sm_90a is not in the flags, so sm_90 and sm_90a binaries pass alike.
  std::optional<std::string> binary_problem(const std::string& target, const std::vector<uint8_t>& binary) const override {
    constexpr uint16_t kEmCuda = 190;
    if (binary.size() < 64 || std::memcmp(binary.data(),
                                          "\x7f"
                                          "ELF",
                                          4) != 0)
      return std::string("not an ELF file");
    if (binary[4] != 2 || binary[5] != 1) return std::string("not a 64-bit little-endian ELF");
    uint16_t machine = 0;
    std::memcpy(&machine, binary.data() + 18, 2);
    if (machine != kEmCuda) return fmt::format("ELF machine {} is not CUDA ({})", machine, kEmCuda);
    uint32_t flags = 0;
    std::memcpy(&flags, binary.data() + 48, 4);
    const int sm = static_cast<int>(binary[8] >= 8 ? (flags >> 8) & 0xffu : flags & 0xffu);
    const int wanted = platform_for_target(target).arch_version;
    if (sm != wanted) return fmt::format("a CUBIN for sm_{}, not for {} (ELF flags {:#x})", sm, target, flags);
    return std::nullopt;
  }

  // NVRTC passes ptxas's advisories on in its log, one a line: "ptxas info    : (C7512) Potential
  // Performance Loss: wgmma.mma_async instructions are serialized due to ...".
  std::vector<std::string> compile_advisories(const std::string& log) const override {
    std::vector<std::string> out;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      const size_t at = line.find("Potential Performance Loss");
      if (at == std::string::npos) continue;
      const size_t code = line.rfind('(', at);  // from the advisory's code, "(C7512)", where there is one
      out.push_back("ptxas " + line.substr(code != std::string::npos ? code : at));
    }
    return out;
  }

  void report_compilers(const std::vector<std::string>& targets, const IdentityMemo& memo, std::vector<CompilerReport>& out) override {
    CompilerReport nvrtc{"nvrtc", "", {}, ""};
    try {
      nvrtc.identity = compiler_identity(CompilerKind::kNvrtc, memo);
      nvrtc.targets = targets;
    } catch (const Error& e) {
      nvrtc.note = e.message();
    }
    out.push_back(nvrtc);
  }

  LaunchScope enter(int index) override {
    Device& dev = device(index);
    LaunchScope scope;
    scope.context = enter_context(dev, &scope.entered);
    scope.key = scope.context;
    scope.platform = &dev.platform;
    scope.device = index;
    return scope;
  }

  void leave(LaunchScope& scope) noexcept override {
    leave_context(scope.entered);
    scope.entered = false;
  }

  DeviceFunction load(const LaunchScope&, const std::vector<uint8_t>& binary, const std::string& lowered_name,
                      const std::string& kernel_name) override {
    const LoadedFunction f = load_function(binary, lowered_name, kernel_name);
    return {f.module, f.function, new LaunchLimits()};
  }

  void unload(const DeviceFunction& function) noexcept override {
    try {
      cuda::unload(LoadedFunction{static_cast<CUmodule>(function.module), static_cast<CUfunction>(function.function)});
    } catch (...) {
      // Unreachable: load() resolved the same driver.
    }
    delete static_cast<LaunchLimits*>(function.state);
  }

  void encode_tensor_map(const TensorMapRequest& map, void* slot, const std::string& kernel_name) override {
    cuda::encode_tensor_map(map, slot, kernel_name);
  }

  void launch(const LaunchScope&, const DeviceFunction& function, const LaunchShape& shape, const void* params, size_t, Stream stream,
              const std::string& kernel_name) override {
    cuda::launch(static_cast<CUfunction>(function.function), *static_cast<LaunchLimits*>(function.state), shape, params, stream,
                 kernel_name);
  }

  void* stream_alloc(const LaunchScope&, size_t bytes, Stream stream) override { return cuda::stream_alloc(bytes, stream); }
  void stream_free(void* pointer, Stream stream) noexcept override { cuda::stream_free(pointer, stream); }
  void fill_async(void* pointer, uint8_t value, size_t bytes, Stream stream) override { cuda::fill_async(pointer, value, bytes, stream); }
  bool stream_capturing(Stream stream) override { return cuda::stream_capturing(stream); }

  void* device_alloc(size_t bytes) override {
    CUdeviceptr pointer = 0;
    KILN_CU_CALL(cuMemAlloc, &pointer, bytes);
    return reinterpret_cast<void*>(pointer);
  }
  void device_free(void* pointer) noexcept override {
    try {
      if (pointer != nullptr) KILN_CU_FN(cuMemFree)(reinterpret_cast<CUdeviceptr>(pointer));
    } catch (...) {
      // Unreachable: device_alloc resolved the same driver.
    }
  }
  void memset(void* device_pointer, uint8_t value, size_t bytes) override {
    KILN_CU_CALL(cuMemsetD8, reinterpret_cast<CUdeviceptr>(device_pointer), value, bytes);
  }
  void copy_to_host(void* host, const void* device_pointer, size_t bytes, Stream stream) override {
    KILN_CU_CALL(cuMemcpyDtoHAsync, host, reinterpret_cast<CUdeviceptr>(device_pointer), bytes, static_cast<CUstream>(stream));
  }
  void copy_to_device(void* device_pointer, const void* host, size_t bytes, Stream stream) override {
    KILN_CU_CALL(cuMemcpyHtoDAsync, reinterpret_cast<CUdeviceptr>(device_pointer), host, bytes, static_cast<CUstream>(stream));
  }
  void synchronize(Stream stream) override { KILN_CU_CALL(cuStreamSynchronize, static_cast<CUstream>(stream)); }
  void synchronize_device() override { KILN_CU_CALL(cuCtxSynchronize); }

  void* event_create() override {
    CUevent event = nullptr;
    KILN_CU_CALL(cuEventCreate, &event, CU_EVENT_DEFAULT);
    return event;
  }
  void event_destroy(void* event) noexcept override {
    try {
      if (event != nullptr) KILN_CU_FN(cuEventDestroy)(static_cast<CUevent>(event));
    } catch (...) {
      // Unreachable: event_create resolved the same driver.
    }
  }
  void event_record(void* event, Stream stream) override {
    KILN_CU_CALL(cuEventRecord, static_cast<CUevent>(event), static_cast<CUstream>(stream));
  }
  void event_synchronize(void* event) override { KILN_CU_CALL(cuEventSynchronize, static_cast<CUevent>(event)); }
  float event_elapsed_ms(void* start, void* stop) override {
    float ms = 0;
    KILN_CU_CALL(cuEventElapsedTime, &ms, static_cast<CUevent>(start), static_cast<CUevent>(stop));
    return ms;
  }
};

}  // namespace

KILN_REGISTER_BACKEND(CudaBackend, 0);

}  // namespace kiln::detail::cuda
