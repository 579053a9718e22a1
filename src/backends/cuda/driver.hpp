// The CUDA driver API, loaded from libcuda.so.1 at first use. Each symbol is resolved once, at
// its first call site use; a missing driver or symbol raises kiln::Error(kDriverError).
//
//   KILN_CU_CALL(cuCtxGetCurrent, &ctx);   // throws with the call, error name and string
#pragma once

#include <cuda.h>

#include <string>

namespace kiln::detail::cuda {

// Address of a driver symbol; loads libcuda on first use. Throws kiln::Error(kDriverError).
void* driver_symbol(const char* name);
// True when libcuda could be loaded (no exception).
bool driver_available();
[[noreturn]] void throw_driver_error(CUresult result, const char* call, const char* file, int line);
// "CUDA_ERROR_INVALID_VALUE (invalid argument)"
std::string describe(CUresult result);

}  // namespace kiln::detail::cuda

// cuda.h maps many names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2); expanding before
// stringizing looks up the symbol the header declares.
#define KILN_CU_STRINGIZE2(x) #x
#define KILN_CU_STRINGIZE(x) KILN_CU_STRINGIZE2(x)
#define KILN_CU_FN(fn)                                                                                                        \
  ([]() {                                                                                                                     \
    static const auto resolved = reinterpret_cast<decltype(&fn)>(::kiln::detail::cuda::driver_symbol(KILN_CU_STRINGIZE(fn))); \
    return resolved;                                                                                                          \
  }())
#define KILN_CU_CALL(fn, ...)                                                             \
  do {                                                                                    \
    const CUresult kiln_cu_result_ = KILN_CU_FN(fn)(__VA_ARGS__);                         \
    if (kiln_cu_result_ != CUDA_SUCCESS) {                                                \
      ::kiln::detail::cuda::throw_driver_error(kiln_cu_result_, #fn, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)
