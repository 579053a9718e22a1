#include "backends/cuda/driver.hpp"

#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "core/dynamic_library.hpp"
#include "core/env.hpp"
#include "kiln/error.hpp"

namespace kiln::detail::cuda {
namespace {

const OptionalLibrary& driver_library() {
  static const OptionalLibrary lib = [] {
    // KILN_LIBCUDA names the one library to use (also how tests simulate a missing driver).
    const auto named = env_string("KILN_LIBCUDA");
    return load_optional_library("the NVIDIA driver (libcuda)",
                                 named ? std::vector<std::string>{*named} : std::vector<std::string>{"libcuda.so.1", "libcuda.so"});
  }();
  return lib;
}

}  // namespace

void* driver_symbol(const char* name) {
  const OptionalLibrary& lib = driver_library();
  if (!lib.library) {
    throw Error(ErrorCode::kDriverError, fmt::format("{} needs the NVIDIA driver, which is not available: {}", name, lib.failure));
  }
  return lib.library->symbol(name);
}

bool driver_available() { return driver_library().library != nullptr; }

std::string describe(CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  try {
    KILN_CU_FN(cuGetErrorName)(result, &name);
    KILN_CU_FN(cuGetErrorString)(result, &text);
  } catch (const Error&) {
  }
  return fmt::format("{} ({})", name ? name : fmt::format("CUresult {}", static_cast<int>(result)), text ? text : "no description");
}

void throw_driver_error(CUresult result, const char* call, const char* file, int line) {
  throw Error(ErrorCode::kDriverError, fmt::format("{} failed: {} at {}:{}", call, describe(result), file, line));
}

}  // namespace kiln::detail::cuda
