// CUDA devices: detection, contexts, module load and launch through the driver API.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/platform.hpp"
#include "kiln/registry.hpp"
#include "kiln/tensor.hpp"

namespace kiln::detail::cuda {

struct Device {
  int index = 0;
  CUdevice handle = 0;
  Platform platform;
  std::once_flag primary_once;
  CUcontext primary = nullptr;  // retained on first need, held for the life of the process
};

int device_count();  // initializes the driver; throws kiln::Error(kDriverError)
// Detected once per index. Throws kiln::Error: no driver, index out of range, unknown arch.
Device& device(int index);

// Makes a context of `dev` current until leave_context(): the caller's current context when it
// belongs to that device (an engine such as PyTorch made it), else the device's primary context
// (pushed; `*pushed` says so).
CUcontext enter_context(Device& dev, bool* pushed);
void leave_context(bool pushed) noexcept;

// Makes a context of `dev` current for the scope: the caller's current context when it belongs
// to that device (an engine such as PyTorch made it), else the device's primary context.
class ScopedContext {
 public:
  explicit ScopedContext(Device& dev);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  CUcontext get() const { return context_; }

 private:
  CUcontext context_ = nullptr;
  bool pushed_ = false;
};

// Loads a CUBIN into the current context and finds `lowered_name` in it.
struct LoadedFunction {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
};
LoadedFunction load_function(const std::vector<uint8_t>& cubin, const std::string& lowered_name, const std::string& kernel_name);

void unload(const LoadedFunction& f);

// Encodes `map` into the 64-byte-aligned 128 bytes at `slot` (cuTensorMapEncodeTiled). Throws
// kiln::Error(kDriverError), naming the kernel, when the driver rejects it.
void encode_tensor_map(const TensorMapRequest& map, void* slot, const std::string& kernel_name);

// The opt-in limits of one loaded function, raised as its launches need them and never lowered.
// They belong to the function, not to a launch: when each launch set the dynamic shared memory
// limit to its own size, a thread launching 4-warp decode CTAs lowered it between another
// thread's raise and its 8-warp launch, which then failed (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on
// an H100; tests/gpu Gpu.OneKernelLaunchedFromTwoThreadsWithDifferentSharedMemory). Raises are
// serialized; a launch within the current limits takes no lock and makes no driver call.
class LaunchLimits {
 public:
  void raise_for(CUfunction function, const LaunchShape& shape);

 private:
  std::mutex mutex_;
  std::atomic<uint32_t> dynamic_shared_bytes_{0};
  std::atomic<bool> non_portable_clusters_{false};
};

// Launches `function` with `params` (one struct, passed by value) on `stream`, first raising
// `limits` where the shape needs more (any dynamic shared memory: the opt-in counts the static
// arrays too; clusters above 8 CTAs).
void launch(CUfunction function, LaunchLimits& limits, const LaunchShape& shape, const void* params, Stream stream,
            const std::string& kernel_name);

// Device memory ordered on `stream`: allocated from the current device's memory pool
// (cuMemAllocAsync) and freed on the stream, so it is released after the kernels enqueued
// meanwhile, and capturable in a CUDA graph. Throws kiln::Error(kDriverError), e.g. when the pool
// is out of memory.
void* stream_alloc(size_t bytes, Stream stream);
void stream_free(void* pointer, Stream stream) noexcept;
void fill_async(void* pointer, uint8_t value, size_t bytes, Stream stream);
// Whether `stream` is capturing a CUDA graph.
bool stream_capturing(Stream stream);

}  // namespace kiln::detail::cuda
