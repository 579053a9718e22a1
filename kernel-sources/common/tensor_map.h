// A CUDA tensor map (CUtensorMap) as the parameter blocks carry it: 128 bytes on a 64-byte boundary,
// opaque to the kernel. kiln encodes it on the host at launch (KernelSpec::tensor_maps); a kernel
// takes its parameter block as __grid_constant__ and passes the map's address to TMA copies.
// Plain C (C11 and C++), shared by host code, run-time-compiled kernels and plugins written in C.
#pragma once

#ifdef __cplusplus
#define KILN_ALIGNAS(n) alignas(n)
#else
#define KILN_ALIGNAS(n) _Alignas(n)
#endif

struct KilnTensorMap {
  KILN_ALIGNAS(64) unsigned long long words[16];
};
#ifndef __cplusplus
typedef struct KilnTensorMap KilnTensorMap;
#endif
