// KILN_HOST_DEVICE marks the inline functions of headers shared verbatim by kiln's host code and
// the run-time-compiled kernels (workspace layouts): __host__ __device__ in a kernel compile,
// nothing in the host build.
#pragma once

#if defined(KILN_HIP_CLANG)  // nothing predefined there (common/prelude.cuh)
#define KILN_HOST_DEVICE __attribute__((host, device))
#elif defined(KILN_NVRTC) || defined(KILN_HIPRTC)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
