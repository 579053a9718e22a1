// What the tensor-core prefill kernels share (attention.prefill.mma, .mma_window, .wgmma,
// .wgmma_window): the signature checks, the grid rule and the shared-memory budget, given the few
// numbers in which they differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/registry.hpp"

namespace kiln::detail {

// What differs between the kernels.
struct PrefillKernel {
  const char* name;
  const char* source;
  const char* entry;  // template name: <dtype, head_dim, softcap[, warps, heads, key_rows, stages]>
  Priority priority;
  bool windows_only = false;  // accepts only signatures with a window
  int warps = 0;              // head-packing and mma.sync kernels: warps per CTA, 16 query rows each; 0 for wgmma
  bool packs_heads = false;   // CTAs own packed_heads(group, warps) query heads (else one)
  int min_arch;
  std::vector<std::string> features;
  int block_rows_d64 = 0;  // wgmma: query rows per CTA at head_dim 64, and at 128; two threads per row
  int block_rows_d128 = 0;
  int key_rows;            // rows of each K and V tile
  int stages;              // K and V tile pairs in shared memory
  uint32_t alignment = 0;  // slack added to shared memory to align the tiles
  bool tma = false;        // Q, K and V copied by TMA (tensor maps in the parameter block), one mbarrier per stage
};

KernelSpec prefill_kernel(const PrefillKernel& k);

// The mma.sync kernels of attention/prefill_mma.cuh, 4 warps each.
PrefillKernel mma_sync_kernel(const char* name, Priority priority);

}  // namespace kiln::detail
