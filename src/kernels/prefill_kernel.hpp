// What the tensor-core prefill kernels share (attention.prefill.mma, .mma_window, .wgmma,
// .wgmma_window, their paged forms attention.extend.*, and attention.decode.prefill_mma): the
// signature checks, the grid rule and the shared-memory budget, given the few numbers in which
// they differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/params.h"
#include "kiln/registry.hpp"

namespace kiln::detail {

// Where a kernel's keys come from and which operator it serves.
enum class PrefillInput {
  kContiguous,   // mha_prefill: K and V packed by cu_seqlens_k
  kPagedExtend,  // mha_extend_with_kvcache: paged caches (KilnPrefillParams::page_table)
  kPagedDecode,  // mha_decode_with_kvcache with q_len >= 2: KilnDecodeParams, entry takes them
};

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
  int key_rows;                     // rows of each K and V tile
  int stages;                       // K and V tile pairs in shared memory
  uint32_t alignment = 0;           // slack added to shared memory to align the tiles
  bool tma = false;                 // Q, K and V copied by TMA (tensor maps in the parameter block), one mbarrier per stage
  int q_box_rows = 16;              // with tma: rows of one Q copy
  bool producer_warpgroup = false;  // one more warpgroup copies; K and V rings of full and empty mbarriers
  int stages_d64 = 0;               // stages at head_dim 64 where they differ (0: `stages`)
  int key_rows_d128 = 0;            // rows of each K and V tile at head_dim 128 where they differ (0: `key_rows`)
  int key_rows_d256 = 0;            // > 0: takes head_dim 256 too, with K and V tiles of this many rows
  int stages_d256 = 0;              // stages at head_dim 256 where they differ (0: `stages`)
  int page_box_rows = 0;            // paged, with tma: rows of one K or V copy at most (0: the tile's); pages bound them too
  int min_page_size = 0;            // paged: smaller pages go to other kernels
  int key_align = 1;                // blocks moved back to start keys on multiples of it (prefill_block_extent)
  PrefillInput input = PrefillInput::kContiguous;
  bool e4m3_cache = false;  // paged: reads e4m3 caches (kv_dtype e4m3) instead of the queries' type
  int staging_slots = 0;    // e4m3 producer: shared-memory slots of one K and one V tile's e4m3 bytes
  bool softcap = true;      // accepts a soft cap
};

KernelSpec prefill_kernel(const PrefillKernel& k);

// The TMA maps of the Hopper kernels: q, k and v as (head_dim, heads, rows), boxes of 64 elements x
// `q_heads` heads x `q_rows` rows for q and 64 x 1 x `key_rows` for k and v; paged caches as their
// num_pages x page_size rows. With no keys to copy by TMA (none at all, or pages TMA cannot copy)
// the maps must still encode: k and v then map one row of q.
std::vector<TensorMapRequest> prefill_tensor_maps(const KilnPrefillParams& p, int q_rows, int key_rows, int q_heads = 1);

// The mma.sync kernels of attention/prefill_mma.cuh, 4 warps each.
PrefillKernel mma_sync_kernel(const char* name, Priority priority);
// The same over e4m3 paged caches (from sm_89, whose cvt turns e4m3 pairs into f16).
PrefillKernel mma_sync_e4m3_kernel(PrefillKernel k, const char* name);
// The sliding-window Hopper kernel of attention/prefill_wgmma_window.cuh (head packing, wgmma).
PrefillKernel wgmma_window_kernel(const char* name);
// The general Hopper kernel of attention/prefill_wgmma_ws.cuh (warp-specialized).
PrefillKernel wgmma_ws_kernel(const char* name);

}  // namespace kiln::detail
