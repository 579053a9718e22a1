// A CUDA tensor map (CUtensorMap) as the parameter blocks carry it: 128 bytes on a 64-byte boundary,
// opaque to the kernel. kiln encodes it on the host at launch (KernelSpec::tensor_maps); a kernel
// takes its parameter block as __grid_constant__ and passes the map's address to TMA copies.
// Plain C, shared by host code and run-time-compiled kernels.
#pragma once

struct KilnTensorMap {
  alignas(64) unsigned long long words[16];
};
