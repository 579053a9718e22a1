// The HIP runtime (libamdhip64), loaded with dlopen at first use: AMD device detection with the
// full gcnArchName, and module load and launch. No ROCm header is needed to build kiln: the few
// entry points used are declared in runtime.cpp with the C ABI they have had since ROCm 5.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/platform.hpp"
#include "kiln/registry.hpp"
#include "kiln/tensor.hpp"

namespace kiln::detail::hip {

// Where libamdhip64 was loaded from; throws kiln::Error(kDriverError) when it cannot be loaded.
// KILN_LIBAMDHIP64 names the one file to use.
std::string runtime_library_path();

// Number of AMD GPUs; throws kiln::Error(kDriverError) with the runtime's reason
// ("hipErrorNoDevice") when there are none or the runtime cannot be loaded.
int device_count();

// Platform of AMD GPU `index` (arch = the full gcnArchName, "gfx942:sramecc+:xnack-"); cached.
const Platform& device_platform(int index);

struct LoadedFunction {
  void* module = nullptr;    // hipModule_t
  void* function = nullptr;  // hipFunction_t
};
// Loads a code object on device `index` and finds `lowered_name` in it.
LoadedFunction load_function(int index, const std::vector<uint8_t>& code_object, const std::string& lowered_name,
                             const std::string& kernel_name);
void unload(const LoadedFunction& f);

// Launches with one parameter block passed by value. Clusters and programmatic dependent launch
// do not exist on AMD: a shape asking for them is an error (kUnsupported). A cooperative shape
// goes through hipModuleLaunchCooperativeKernel (ROCm 6 and newer), which fails rather than
// deadlock when the grid cannot be resident at once; a runtime without it is a clear error.
void launch(int index, void* function, const LaunchShape& shape, const void* params, Stream stream, const std::string& kernel_name);

// Device memory of device `index` ordered on `stream` (hipMallocAsync, from the device's default
// memory pool; freed on the stream): the AMD counterpart of cuda::stream_alloc.
void* stream_alloc(int index, size_t bytes, Stream stream);
void stream_free(void* pointer, Stream stream) noexcept;
void fill_async(void* pointer, uint8_t value, size_t bytes, Stream stream);
bool stream_capturing(Stream stream);

// Plain memory, copies and events of the current device, for tools (hipMalloc, hipMemcpyAsync,
// hipEvent*). Throw kiln::Error(kDriverError).
void set_device(int index);
int runtime_version();
std::pair<size_t, size_t> memory_info(int index);
void* device_alloc(size_t bytes);
void device_free(void* pointer) noexcept;
void memset(void* device_pointer, uint8_t value, size_t bytes);
void copy(void* destination, const void* source, size_t bytes, bool to_device, Stream stream);
void synchronize(Stream stream);
void synchronize_device();
void* event_create();
void event_destroy(void* event) noexcept;
void event_record(void* event, Stream stream);
void event_synchronize(void* event);
float event_elapsed_ms(void* start, void* stop);

}  // namespace kiln::detail::hip
