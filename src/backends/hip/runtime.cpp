#include "backends/hip/runtime.hpp"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "backends/hip/device_properties.hpp"
#include "backends/hip/rocm_library.hpp"
#include "core/dynamic_library.hpp"
#include "kiln/error.hpp"

namespace kiln::detail::hip {
namespace {

// The C ABI of the few HIP entry points kiln calls (hip_runtime_api.h, ROCm 5 and newer).
using hipError_t = int;
constexpr hipError_t kHipSuccess = 0;
using GetErrorString = const char* (*)(hipError_t);
using GetErrorName = const char* (*)(hipError_t);
using GetDeviceCount = hipError_t (*)(int*);
using SetDevice = hipError_t (*)(int);
using GetDeviceProperties = hipError_t (*)(void*, int);
using ModuleLoadData = hipError_t (*)(void**, const void*);
using ModuleGetFunction = hipError_t (*)(void**, void*, const char*);
using ModuleUnload = hipError_t (*)(void*);
using ModuleLaunchKernel = hipError_t (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                                          void**);
using ModuleLaunchCooperativeKernel = hipError_t (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                                                     void**);
using MallocAsync = hipError_t (*)(void**, size_t, void*);
using FreeAsync = hipError_t (*)(void*, void*);
using MemsetD8Async = hipError_t (*)(void*, unsigned char, size_t, void*);
using StreamIsCapturing = hipError_t (*)(void*, int*);  // status 0: hipStreamCaptureStatusNone

const OptionalLibrary& runtime_library() {
  static const OptionalLibrary lib = load_optional_library(
      "the HIP runtime (libamdhip64)",
      rocm_library_candidates("KILN_LIBAMDHIP64", {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"}));
  return lib;
}

void* runtime_symbol(const char* name) {
  const OptionalLibrary& lib = runtime_library();
  if (!lib.library) {
    throw Error(ErrorCode::kDriverError, fmt::format("{} needs the HIP runtime, which is not available: {}", name, lib.failure));
  }
  return lib.library->symbol(name);
}

template <typename Fn>
Fn resolve(const char* name) {
  return reinterpret_cast<Fn>(runtime_symbol(name));
}
#define KILN_HIP_FN(type, name)                       \
  ([]() {                                             \
    static const auto resolved = resolve<type>(name); \
    return resolved;                                  \
  }())

std::string describe(hipError_t status) {
  const char* name = nullptr;
  const char* text = nullptr;
  try {
    name = KILN_HIP_FN(GetErrorName, "hipGetErrorName")(status);
    text = KILN_HIP_FN(GetErrorString, "hipGetErrorString")(status);
  } catch (const Error&) {
  }
  const std::string label = name ? name : fmt::format("hipError_t {}", status);
  if (text == nullptr || label == text) return label;
  return fmt::format("{} ({})", label, text);
}

void check(hipError_t status, const char* call) {
  if (status != kHipSuccess) throw Error(ErrorCode::kDriverError, fmt::format("{} failed: {}", call, describe(status)));
}

// ROCm 6 and newer export the old layout under this name; ROCm 5's plain name has it.
GetDeviceProperties properties_entry() {
  const OptionalLibrary& lib = runtime_library();
  if (lib.library) {
    try {
      return reinterpret_cast<GetDeviceProperties>(lib.library->symbol("hipGetDevicePropertiesR0000"));
    } catch (const Error&) {
    }
  }
  return resolve<GetDeviceProperties>("hipGetDeviceProperties");
}

template <typename T>
T field(const std::vector<uint8_t>& props, size_t offset) {
  T value;
  std::memcpy(&value, props.data() + offset, sizeof(T));
  return value;
}

std::string string_field(const std::vector<uint8_t>& props, size_t offset) {
  const auto* text = reinterpret_cast<const char*>(props.data() + offset);
  return std::string(text, strnlen(text, 256));
}

}  // namespace

void set_device(int index) { check(KILN_HIP_FN(SetDevice, "hipSetDevice")(index), "hipSetDevice"); }

std::string runtime_library_path() {
  runtime_symbol("hipGetDeviceCount");
  return runtime_library().library->path();
}

int device_count() {
  // No hipInit first: the runtime initializes itself, and without a GPU hipInit reports a vague
  // hipErrorInvalidDevice where hipGetDeviceCount says hipErrorNoDevice.
  int count = 0;
  check(KILN_HIP_FN(GetDeviceCount, "hipGetDeviceCount")(&count), "hipGetDeviceCount");
  return count;
}

const Platform& device_platform(int index) {
  static std::mutex mutex;
  static std::map<int, Platform> platforms;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = platforms.find(index);
    if (it != platforms.end()) return it->second;
  }
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("device: index {} is out of range; this process sees {} AMD GPU(s)", index, count));
  }
  std::vector<uint8_t> props(DevicePropertiesR0000::kSize + 1024, 0);  // slack: never write past our buffer
  check(properties_entry()(props.data(), index), "hipGetDeviceProperties");
  const std::string arch = string_field(props, DevicePropertiesR0000::kGcnArchName);
  Platform p = platform_for_target(arch);  // unknown arch: error naming the known ones
  p.multiprocessor_count = field<int>(props, DevicePropertiesR0000::kMultiProcessorCount);
  p.shared_memory_per_block = field<size_t>(props, DevicePropertiesR0000::kSharedMemPerBlock);
  p.l2_bytes = static_cast<size_t>(field<int>(props, DevicePropertiesR0000::kL2CacheSize));
  p.warp_size = field<int>(props, DevicePropertiesR0000::kWarpSize);
  p.device_name = string_field(props, DevicePropertiesR0000::kName);
  p.detected = true;
  p.device_index = index;
  std::lock_guard<std::mutex> lock(mutex);
  return platforms.emplace(index, std::move(p)).first->second;
}

LoadedFunction load_function(int index, const std::vector<uint8_t>& code_object, const std::string& lowered_name,
                             const std::string& kernel_name) {
  set_device(index);
  LoadedFunction f;
  const hipError_t loaded = KILN_HIP_FN(ModuleLoadData, "hipModuleLoadData")(&f.module, code_object.data());
  if (loaded != kHipSuccess) {
    throw Error(ErrorCode::kDriverError,
                fmt::format("hipModuleLoadData failed for kernel '{}' ({} bytes): {}", kernel_name, code_object.size(), describe(loaded)));
  }
  const hipError_t found = KILN_HIP_FN(ModuleGetFunction, "hipModuleGetFunction")(&f.function, f.module, lowered_name.c_str());
  if (found != kHipSuccess) {
    KILN_HIP_FN(ModuleUnload, "hipModuleUnload")(f.module);
    throw Error(ErrorCode::kDriverError,
                fmt::format("kernel '{}': entry {} not found in its code object: {}", kernel_name, lowered_name, describe(found)));
  }
  return f;
}

void unload(const LoadedFunction& f) {
  if (f.module != nullptr) KILN_HIP_FN(ModuleUnload, "hipModuleUnload")(f.module);
}

void launch(int index, void* function, const LaunchShape& shape, const void* params, Stream stream, const std::string& kernel_name) {
  if (shape.has_cluster() || shape.programmatic_dependent_launch) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("kernel '{}' asks for a thread-block cluster or programmatic dependent launch, which kiln's AMD "
                            "backend does not do",
                            kernel_name));
  }
  if (shape.grid[0] == 0 || shape.grid[1] == 0 || shape.grid[2] == 0) return;  // empty problem
  set_device(index);
  // No opt-in for dynamic LDS on AMD: a module kernel may use up to the device's LDS size.
  void* args[] = {const_cast<void*>(params)};
  hipError_t result;
  if (shape.cooperative) {
    ModuleLaunchCooperativeKernel cooperative = nullptr;
    try {
      cooperative = KILN_HIP_FN(ModuleLaunchCooperativeKernel, "hipModuleLaunchCooperativeKernel");
    } catch (const Error& e) {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("kernel '{}' needs a cooperative launch (hipModuleLaunchCooperativeKernel, ROCm 6 and newer), "
                              "which the HIP runtime {} lacks: {}",
                              kernel_name, runtime_library_path(), e.what()));
    }
    result = cooperative(function, shape.grid[0], shape.grid[1], shape.grid[2], shape.block[0], shape.block[1], shape.block[2],
                         shape.dynamic_shared_bytes, stream, args);
  } else {
    result = KILN_HIP_FN(ModuleLaunchKernel, "hipModuleLaunchKernel")(function, shape.grid[0], shape.grid[1], shape.grid[2], shape.block[0],
                                                                      shape.block[1], shape.block[2], shape.dynamic_shared_bytes, stream,
                                                                      args, nullptr);
  }
  if (result != kHipSuccess) {
    throw Error(ErrorCode::kDriverError,
                fmt::format("{}launch of kernel '{}' failed (grid {}x{}x{}, block {}x{}x{}, {} B shared): {}",
                            shape.cooperative ? "cooperative " : "", kernel_name, shape.grid[0], shape.grid[1], shape.grid[2],
                            shape.block[0], shape.block[1], shape.block[2], shape.dynamic_shared_bytes, describe(result)));
  }
}

void* stream_alloc(int index, size_t bytes, Stream stream) {
  set_device(index);
  void* pointer = nullptr;
  check(KILN_HIP_FN(MallocAsync, "hipMallocAsync")(&pointer, bytes, stream), "hipMallocAsync");
  return pointer;
}

void stream_free(void* pointer, Stream stream) noexcept {
  try {
    KILN_HIP_FN(FreeAsync, "hipFreeAsync")(pointer, stream);
  } catch (...) {
    // The runtime that allocated it is loaded: resolving the symbol cannot fail here.
  }
}

void fill_async(void* pointer, uint8_t value, size_t bytes, Stream stream) {
  check(KILN_HIP_FN(MemsetD8Async, "hipMemsetD8Async")(pointer, value, bytes, stream), "hipMemsetD8Async");
}

bool stream_capturing(Stream stream) {
  int status = 0;
  const hipError_t result = KILN_HIP_FN(StreamIsCapturing, "hipStreamIsCapturing")(stream, &status);
  return result != kHipSuccess || status != 0;
}

// hipMemcpyKind values of the HIP ABI.
constexpr int kHipMemcpyHostToDevice = 1;
constexpr int kHipMemcpyDeviceToHost = 2;
using RuntimeGetVersion = hipError_t (*)(int*);
using MemGetInfo = hipError_t (*)(size_t*, size_t*);
using Malloc = hipError_t (*)(void**, size_t);
using Free = hipError_t (*)(void*);
using Memset = hipError_t (*)(void*, int, size_t);
using MemcpyAsync = hipError_t (*)(void*, const void*, size_t, int, void*);
using StreamSynchronize = hipError_t (*)(void*);
using EventCreate = hipError_t (*)(void**);
using EventDestroy = hipError_t (*)(void*);
using EventRecord = hipError_t (*)(void*, void*);
using EventSynchronize = hipError_t (*)(void*);
using EventElapsedTime = hipError_t (*)(float*, void*, void*);

int runtime_version() {
  int version = 0;
  check(KILN_HIP_FN(RuntimeGetVersion, "hipRuntimeGetVersion")(&version), "hipRuntimeGetVersion");
  return version;
}

std::pair<size_t, size_t> memory_info(int index) {
  set_device(index);
  size_t free_bytes = 0, total_bytes = 0;
  check(KILN_HIP_FN(MemGetInfo, "hipMemGetInfo")(&free_bytes, &total_bytes), "hipMemGetInfo");
  return {free_bytes, total_bytes};
}

void* device_alloc(size_t bytes) {
  void* pointer = nullptr;
  check(KILN_HIP_FN(Malloc, "hipMalloc")(&pointer, bytes), "hipMalloc");
  return pointer;
}

void device_free(void* pointer) noexcept {
  try {
    if (pointer != nullptr) KILN_HIP_FN(Free, "hipFree")(pointer);
  } catch (...) {
    // Freed memory came from this runtime: it is loaded.
  }
}

void memset(void* device_pointer, uint8_t value, size_t bytes) {
  check(KILN_HIP_FN(Memset, "hipMemset")(device_pointer, value, bytes), "hipMemset");
}

void copy(void* destination, const void* source, size_t bytes, bool to_device, Stream stream) {
  check(KILN_HIP_FN(MemcpyAsync, "hipMemcpyAsync")(destination, source, bytes, to_device ? kHipMemcpyHostToDevice : kHipMemcpyDeviceToHost,
                                                   stream),
        "hipMemcpyAsync");
}

void synchronize(Stream stream) { check(KILN_HIP_FN(StreamSynchronize, "hipStreamSynchronize")(stream), "hipStreamSynchronize"); }

using DeviceSynchronize = hipError_t (*)();
void synchronize_device() { check(KILN_HIP_FN(DeviceSynchronize, "hipDeviceSynchronize")(), "hipDeviceSynchronize"); }

void* event_create() {
  void* event = nullptr;
  check(KILN_HIP_FN(EventCreate, "hipEventCreate")(&event), "hipEventCreate");
  return event;
}

void event_destroy(void* event) noexcept {
  try {
    if (event != nullptr) KILN_HIP_FN(EventDestroy, "hipEventDestroy")(event);
  } catch (...) {
    // Events came from this runtime: it is loaded.
  }
}

void event_record(void* event, Stream stream) { check(KILN_HIP_FN(EventRecord, "hipEventRecord")(event, stream), "hipEventRecord"); }

void event_synchronize(void* event) { check(KILN_HIP_FN(EventSynchronize, "hipEventSynchronize")(event), "hipEventSynchronize"); }

float event_elapsed_ms(void* start, void* stop) {
  float ms = 0;
  check(KILN_HIP_FN(EventElapsedTime, "hipEventElapsedTime")(&ms, start, stop), "hipEventElapsedTime");
  return ms;
}

}  // namespace kiln::detail::hip
