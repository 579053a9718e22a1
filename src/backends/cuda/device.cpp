#include "backends/cuda/device.hpp"

#include <algorithm>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "backends/cuda/driver.hpp"
#include "kiln/error.hpp"

namespace kiln::detail::cuda {
namespace {

// cuLaunchKernelEx, for launches with cluster dimensions, programmatic dependent launch or
// cooperative (all CTAs co-resident) launches.
CUresult launch_with_attributes(CUfunction function, const LaunchShape& shape, void** args, Stream stream) {
  CUlaunchConfig config{};
  config.gridDimX = shape.grid[0];
  config.gridDimY = shape.grid[1];
  config.gridDimZ = shape.grid[2];
  config.blockDimX = shape.block[0];
  config.blockDimY = shape.block[1];
  config.blockDimZ = shape.block[2];
  config.sharedMemBytes = shape.dynamic_shared_bytes;
  config.hStream = static_cast<CUstream>(stream);
  CUlaunchAttribute attributes[3];
  unsigned n = 0;
  if (shape.has_cluster()) {
    attributes[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attributes[n].value.clusterDim.x = shape.cluster_dim(0);
    attributes[n].value.clusterDim.y = shape.cluster_dim(1);
    attributes[n].value.clusterDim.z = shape.cluster_dim(2);
    ++n;
  }
  if (shape.programmatic_dependent_launch) {
    attributes[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attributes[n].value.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (shape.cooperative) {
    attributes[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attributes[n].value.cooperative = 1;
    ++n;
  }
  config.attrs = n ? attributes : nullptr;
  config.numAttrs = n;
  return KILN_CU_FN(cuLaunchKernelEx)(&config, function, args, nullptr);
}

int attribute(CUdevice dev, CUdevice_attribute attr) {
  int value = 0;
  KILN_CU_CALL(cuDeviceGetAttribute, &value, attr, dev);
  return value;
}

// Chips with arch-specific ('a') features get the suffix: their wgmma/tcgen05/setmaxnreg code
// only runs when compiled for the exact arch.
std::string arch_name(int major, int minor) {
  const int cc = major * 10 + minor;
  const bool arch_specific = cc == 90 || cc == 100 || cc == 103 || cc == 110 || cc == 120 || cc == 121;
  return fmt::format("sm_{}{}", cc, arch_specific ? "a" : "");
}

void ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] { KILN_CU_CALL(cuInit, 0); });
}

}  // namespace

int device_count() {
  ensure_initialized();
  int count = 0;
  KILN_CU_CALL(cuDeviceGetCount, &count);
  return count;
}

Device& device(int index) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Device>> devices;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = devices.find(index);
    if (it != devices.end()) return *it->second;
  }
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("device: index {} is out of range; this process sees {} NVIDIA GPU(s)", index, count));
  }
  auto dev = std::make_unique<Device>();
  dev->index = index;
  KILN_CU_CALL(cuDeviceGet, &dev->handle, index);
  const int major = attribute(dev->handle, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  const int minor = attribute(dev->handle, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  Platform p = platform_for_target(arch_name(major, minor));  // unknown arch: error
  p.multiprocessor_count = attribute(dev->handle, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  p.shared_memory_per_block = static_cast<size_t>(attribute(dev->handle, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN));
  p.l2_bytes = static_cast<size_t>(attribute(dev->handle, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE));
  p.warp_size = attribute(dev->handle, CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  char name[256] = {0};
  KILN_CU_CALL(cuDeviceGetName, name, static_cast<int>(sizeof(name)), dev->handle);
  p.device_name = name;
  p.detected = true;
  p.device_index = index;
  dev->platform = std::move(p);
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = devices.emplace(index, std::move(dev));
  return *it->second;
}

CUcontext enter_context(Device& dev, bool* pushed) {
  *pushed = false;
  CUcontext current = nullptr;
  KILN_CU_CALL(cuCtxGetCurrent, &current);
  if (current != nullptr) {
    // A context's device never changes: remember the last one this thread asked about.
    thread_local CUcontext last_context = nullptr;
    thread_local CUdevice last_device = -1;
    if (current != last_context) {
      KILN_CU_CALL(cuCtxGetDevice, &last_device);
      last_context = current;
    }
    if (last_device == dev.handle) return current;
  }
  std::call_once(dev.primary_once, [&] { KILN_CU_CALL(cuDevicePrimaryCtxRetain, &dev.primary, dev.handle); });
  KILN_CU_CALL(cuCtxPushCurrent, dev.primary);
  *pushed = true;
  return dev.primary;
}

void leave_context(bool pushed) noexcept {
  if (!pushed) return;
  try {
    CUcontext popped = nullptr;
    KILN_CU_FN(cuCtxPopCurrent)(&popped);
  } catch (...) {
    // Unreachable: the push resolved the driver, and cuCtxPopCurrent is in every driver.
  }
}

ScopedContext::ScopedContext(Device& dev) : context_(enter_context(dev, &pushed_)) {}

ScopedContext::~ScopedContext() { leave_context(pushed_); }

LoadedFunction load_function(const std::vector<uint8_t>& cubin, const std::string& lowered_name, const std::string& kernel_name) {
  LoadedFunction f;
  const CUresult loaded = KILN_CU_FN(cuModuleLoadData)(&f.module, cubin.data());
  if (loaded != CUDA_SUCCESS) {
    throw Error(ErrorCode::kDriverError,
                fmt::format("cuModuleLoadData failed for kernel '{}' ({} bytes): {}", kernel_name, cubin.size(), describe(loaded)));
  }
  const CUresult found = KILN_CU_FN(cuModuleGetFunction)(&f.function, f.module, lowered_name.c_str());
  if (found != CUDA_SUCCESS) {
    KILN_CU_FN(cuModuleUnload)(f.module);
    throw Error(ErrorCode::kDriverError,
                fmt::format("kernel '{}': entry {} not found in its binary: {}", kernel_name, lowered_name, describe(found)));
  }
  return f;
}

void unload(const LoadedFunction& f) {
  if (f.module != nullptr) KILN_CU_FN(cuModuleUnload)(f.module);
}

void encode_tensor_map(const TensorMapRequest& map, void* slot, const std::string& kernel_name) {
  if (reinterpret_cast<uintptr_t>(slot) % 64 != 0) {
    throw Error(ErrorCode::kInternal, fmt::format("kernel '{}': tensor map slot not 64-byte aligned", kernel_name));
  }
  const cuuint64_t dims[3] = {map.dims[0], map.dims[1], map.dims[2]};
  const cuuint64_t strides[2] = {map.strides[0], map.strides[1]};
  const cuuint32_t box[3] = {map.box[0], map.box[1], map.box[2]};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = KILN_CU_FN(cuTensorMapEncodeTiled)(
      static_cast<CUtensorMap*>(slot), CU_TENSOR_MAP_DATA_TYPE_UINT16, map.rank, const_cast<void*>(map.base), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, map.swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw Error(
        ErrorCode::kDriverError,
        fmt::format(
            "kernel '{}': cuTensorMapEncodeTiled rejected a rank-{} map of {}x{}x{} elements (strides {}, {} B; box {}x{}x{}) at {}: {}",
            kernel_name, map.rank, map.dims[0], map.dims[1], map.dims[2], map.strides[0], map.strides[1], map.box[0], map.box[1],
            map.box[2], map.base, describe(result)));
  }
}

void LaunchLimits::raise_for(CUfunction function, const LaunchShape& shape) {
  // Beside the kernel's static arrays, more than 48 KB in all needs the opt-in, whatever the dynamic
  // share: raise it for any (an experimental MoE launch with 27 KB static and 40 KB dynamic failed
  // as CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE without it).
  const uint32_t shared = shape.dynamic_shared_bytes;
  // Clusters above the portable 8 CTAs (Hopper allows 16) need the kernel to opt in.
  const bool large_cluster = shape.has_cluster() && shape.cluster_dim(0) * shape.cluster_dim(1) * shape.cluster_dim(2) > 8;
  const bool shared_ok = shared <= dynamic_shared_bytes_.load(std::memory_order_acquire);
  if (shared_ok && (!large_cluster || non_portable_clusters_.load(std::memory_order_acquire))) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (shared > dynamic_shared_bytes_.load(std::memory_order_relaxed)) {
    KILN_CU_CALL(cuFuncSetAttribute, function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(shared));
    dynamic_shared_bytes_.store(shared, std::memory_order_release);
  }
  if (large_cluster && !non_portable_clusters_.load(std::memory_order_relaxed)) {
    KILN_CU_CALL(cuFuncSetAttribute, function, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
    non_portable_clusters_.store(true, std::memory_order_release);
  }
}

void launch(CUfunction function, LaunchLimits& limits, const LaunchShape& shape, const void* params, Stream stream,
            const std::string& kernel_name) {
  limits.raise_for(function, shape);
  if (shape.grid[0] == 0 || shape.grid[1] == 0 || shape.grid[2] == 0) return;  // empty problem
  void* args[] = {const_cast<void*>(params)};
  CUresult result;
  if (!shape.has_cluster() && !shape.programmatic_dependent_launch && !shape.cooperative) {
    result = KILN_CU_FN(cuLaunchKernel)(function, shape.grid[0], shape.grid[1], shape.grid[2], shape.block[0], shape.block[1],
                                        shape.block[2], shape.dynamic_shared_bytes, static_cast<CUstream>(stream), args, nullptr);
  } else {
    result = launch_with_attributes(function, shape, args, stream);
  }
  if (result != CUDA_SUCCESS) {
    throw Error(ErrorCode::kDriverError, fmt::format("launch of kernel '{}' failed (grid {}x{}x{}, block {}x{}x{}, {} B shared): {}",
                                                     kernel_name, shape.grid[0], shape.grid[1], shape.grid[2], shape.block[0],
                                                     shape.block[1], shape.block[2], shape.dynamic_shared_bytes, describe(result)));
  }
}

void* stream_alloc(size_t bytes, Stream stream) {
  CUdeviceptr pointer = 0;
  KILN_CU_CALL(cuMemAllocAsync, &pointer, bytes, static_cast<CUstream>(stream));
  return reinterpret_cast<void*>(pointer);
}

void stream_free(void* pointer, Stream stream) noexcept {
  try {
    KILN_CU_FN(cuMemFreeAsync)(reinterpret_cast<CUdeviceptr>(pointer), static_cast<CUstream>(stream));
  } catch (...) {
    // Unreachable: stream_alloc resolved the same driver.
  }
}

void fill_async(void* pointer, uint8_t value, size_t bytes, Stream stream) {
  KILN_CU_CALL(cuMemsetD8Async, reinterpret_cast<CUdeviceptr>(pointer), value, bytes, static_cast<CUstream>(stream));
}

bool stream_capturing(Stream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // An error here (the legacy stream while another stream captures globally) means capture is
  // under way somewhere that this stream would disturb: report it as capturing.
  const CUresult result = KILN_CU_FN(cuStreamIsCapturing)(static_cast<CUstream>(stream), &status);
  return result != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace kiln::detail::cuda
