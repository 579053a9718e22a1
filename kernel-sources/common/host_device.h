// KILN_HOST_DEVICE marks the inline functions of headers shared verbatim by kiln's host code and
// the run-time-compiled kernels (workspace layouts): __host__ __device__ in a kernel compile,
// nothing in the host build.
#pragma once

#if defined(KILN_NVRTC) || defined(KILN_HIPRTC) || defined(KILN_HIP_CLANG)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif
