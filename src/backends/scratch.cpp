// Kernel workspaces: the engine's allocator when it registered one, else the backend's pool.
#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "backends/backend.hpp"
#include "core/env.hpp"
#include "kiln/error.hpp"
#include "kiln/scratch.hpp"

namespace kiln {
namespace {

std::mutex allocator_mutex;
ScratchAllocator registered_allocator;

}  // namespace

void set_scratch_allocator(const ScratchAllocator& allocator) {
  if ((allocator.allocate == nullptr) != (allocator.release == nullptr)) {
    throw Error(ErrorCode::kInvalidArgument, "allocator: allocate and release must both be set, or both be null (kiln's own)");
  }
  std::lock_guard<std::mutex> lock(allocator_mutex);
  registered_allocator = allocator;
}

namespace detail {

ScopedScratch::ScopedScratch(VendorBackend& backend, const LaunchScope& scope, size_t bytes, size_t zeroed_bytes, Stream stream)
    : backend_(backend), device_(scope.device), bytes_(bytes), stream_(stream) {
  // Read before allocating: a malformed value throws.
  const bool poison = env_int("KILN_POISON_WORKSPACE").value_or(0) != 0;
  {
    std::lock_guard<std::mutex> lock(allocator_mutex);
    allocator_ = registered_allocator;
  }
  if (allocator_.allocate != nullptr) {
    pointer_ = allocator_.allocate(bytes, device_, stream, allocator_.user);
    if (pointer_ == nullptr) {
      throw Error(ErrorCode::kDriverError,
                  fmt::format("the engine's scratch allocator returned no memory for a {}-byte workspace on device {}", bytes, device_));
    }
  } else {
    pointer_ = backend.stream_alloc(scope, bytes, stream);
  }
  try {
    zeroed_bytes = std::min(zeroed_bytes, bytes);
    if (zeroed_bytes > 0) backend.fill_async(pointer_, 0, zeroed_bytes, stream);
    if (poison && zeroed_bytes < bytes)
      backend.fill_async(static_cast<unsigned char*>(pointer_) + zeroed_bytes, 0xFF, bytes - zeroed_bytes, stream);
  } catch (...) {
    release();
    throw;
  }
}

ScopedScratch::~ScopedScratch() { release(); }

void ScopedScratch::release() noexcept {
  if (pointer_ == nullptr) return;
  if (allocator_.release != nullptr) {
    allocator_.release(pointer_, bytes_, device_, stream_, allocator_.user);
  } else {
    backend_.stream_free(pointer_, stream_);
  }
  pointer_ = nullptr;
}

}  // namespace detail
}  // namespace kiln
