// Where kiln's operators take scratch memory (MoE staging, split-decode partials), and how an
// engine prepares calls before capturing them in a CUDA graph.
#pragma once

#include <cstddef>

#include "kiln/tensor.hpp"

namespace kiln {

// By default a kernel's workspace comes from the device's default memory pool, allocated and freed
// on the call's stream (cuMemAllocAsync / hipMallocAsync). An engine that owns device memory
// registers its allocator once; kiln then takes every workspace from it:
//   allocate(bytes, device, stream, user) returns device memory usable by work enqueued on
//     `stream`, or nullptr when it cannot (the call fails with kDriverError, launching nothing);
//   release(pointer, bytes, device, stream, user) is called once the launch that uses the memory
//     is enqueued on `stream`: the allocator must be stream-ordered (reuse it only for work
//     ordered after that stream's), as torch's caching allocator and cudaFreeAsync are.
// Both may be called from any thread that calls an operator; neither may call kiln.
struct ScratchAllocator {
  void* (*allocate)(size_t bytes, int device, Stream stream, void* user) = nullptr;
  void (*release)(void* pointer, size_t bytes, int device, Stream stream, void* user) = nullptr;
  void* user = nullptr;
};
// Replaces the allocator for calls that start afterwards; both functions null restores kiln's own.
// Throws kInvalidArgument when exactly one is null.
void set_scratch_allocator(const ScratchAllocator& allocator);

// While a PrepareOnly lives, operator calls on its thread are validated, select their kernel and
// compile or load it, but launch nothing and write nothing. Run one step of an engine under it
// before capturing that step in a CUDA graph: a call whose kernel is not loaded in the process
// fails while its stream captures (kGraphCapture), because compiling and loading cannot be
// captured. Scopes nest.
class PrepareOnly {
 public:
  PrepareOnly();
  ~PrepareOnly();
  PrepareOnly(const PrepareOnly&) = delete;
  PrepareOnly& operator=(const PrepareOnly&) = delete;
};

}  // namespace kiln
