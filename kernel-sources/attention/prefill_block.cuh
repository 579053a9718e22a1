// The query block a prefill CTA (or AMD wavefront) owns, and the keys it must visit: shared by
// the prefill kernels so that their bounds, causal alignment and window agree by construction.
#pragma once

#include "attention/params.h"
#include "common/prelude.cuh"

namespace kiln {

struct PrefillQueryBlock {
  int batch;               // the sequence
  int head, kv_head;       // the block's first query head and the KV head it reads
  int q_begin, len_q;      // the sequence's queries in the packed q: [q_begin, q_begin + len_q)
  int k_begin, len_k;      // its keys in the packed k and v
  int q0;                  // first query row of the block, relative to the sequence
  int shift;               // row i sits at key position i + shift: bottom-right aligned
  bool upper_bound;        // causal: keys past i + shift are masked (a window bounds only the left)
  int key_start, key_end;  // keys any row of the block can see: [key_start, key_end)
};

// The rest of a block once its sequence, first head and first row are set: its KV head, where the
// sequence's rows and keys are, and the keys its rows can see. `key_align` > 1 (a power of two dividing
// block_rows): the block moves back by up to key_align - 1 rows so that its first row's key
// position q0 + shift is a multiple of it, and key_start rounds down to one, so that key blocks
// start on whole page boxes; the first block of a sequence then holds rows before its first (q0
// < 0), which are computed but not stored, and the grid covers key_align - 1 rows more.
__device__ __forceinline__ void prefill_block_extent(const KilnPrefillParams& p, int block_rows, PrefillQueryBlock& blk,
                                                     int key_align = 1) {
  const int b = blk.batch;
  blk.kv_head = blk.head * p.num_heads_kv / p.num_heads_q;  // Hq is a multiple of Hkv
  if (p.q_len > 0) {
    blk.q_begin = b * p.q_len;
    blk.len_q = p.q_len;
  } else {
    blk.q_begin = p.cu_seqlens_q[b];
    blk.len_q = p.cu_seqlens_q[b + 1] - blk.q_begin;
  }
  if (p.page_table != nullptr) {
    blk.k_begin = 0;
    blk.len_k = p.cache_seqlens[b];
  } else {
    blk.k_begin = p.cu_seqlens_k[b];
    blk.len_k = p.cu_seqlens_k[b + 1] - blk.k_begin;
  }
  blk.shift = blk.len_k - blk.len_q;
  blk.q0 -= (blk.q0 + blk.shift) & (key_align - 1);
  blk.upper_bound = p.causal != 0;
  const int last_row = min(blk.len_q, blk.q0 + block_rows) - 1;
  blk.key_end = blk.upper_bound ? min(blk.len_k, last_row + blk.shift + 1) : blk.len_k;
  blk.key_start = p.window_left >= 0 ? max(0, blk.q0 + blk.shift - p.window_left) & -key_align : 0;
}

// Grid (query blocks, Hq / heads_per_block, batch): a block owns `block_rows` query positions of
// `heads_per_block` consecutive query heads (all reading one KV head). Blocks are taken last-first
// so that under causal masking the longest rows start first, across the heads of a group: the GPU
// starts CTAs in linear order (x fastest), and x and y are read as one index whose head varies
// fastest within a group of heads, so every head's last query block starts before any head's
// second last. (Taken head by head, the last heads' long blocks started last and ran on alone.) A
// group holds the heads whose keys and values fit kPrefillGroupKvBytes, so that what the running
// CTAs read stays in L2. The block is empty when q0 >= len_q (a shorter sequence of the batch).
enum : long long { kPrefillGroupKvBytes = 16ll << 20 };
__device__ __forceinline__ PrefillQueryBlock prefill_query_block(const KilnPrefillParams& p, int block_rows, int heads_per_block = 1) {
  PrefillQueryBlock blk;
  blk.batch = blockIdx.z;
  // KV heads per group: a power of two whose K and V (16-bit, as long as the longest query run)
  // fit the budget, at least one, and no more than the grid's heads need.
  const long long kv_bytes = 4ll * gridDim.x * block_rows * p.head_dim;
  long long kv_heads = 1;
  while (kv_heads < gridDim.y && 2 * kv_heads * kv_bytes <= kPrefillGroupKvBytes) kv_heads *= 2;
  const long long per_kv = max(1, p.num_heads_q / p.num_heads_kv / heads_per_block);
  const int group = static_cast<int>(min(static_cast<long long>(gridDim.y), per_kv * kv_heads));
  const int linear = blockIdx.y * gridDim.x + blockIdx.x, first = linear / (group * gridDim.x) * group;
  const int heads = min(group, static_cast<int>(gridDim.y) - first), within = linear - first * gridDim.x;
  const int from_last = within / heads;
  blk.head = (first + within % heads) * heads_per_block;
  blk.q0 = (gridDim.x - 1 - from_last) * block_rows;
  prefill_block_extent(p, block_rows, blk);
  return blk;
}

// For kernels whose blocks all cost about the same (the sliding-window kernel's, a band each):
// block x of head block y, in the grid's own order. It skips the order's arithmetic above (a loop
// and four divisions): in the wgmma window kernel, whose warps issue about 1800 instructions per
// CTA, that took GPT-OSS's window rows from 0.0510 to 0.0474 ms at S = 4096 (H200).
__device__ __forceinline__ PrefillQueryBlock prefill_query_block_in_order(const KilnPrefillParams& p, int block_rows, int heads_per_block,
                                                                          int key_align = 1) {
  PrefillQueryBlock blk;
  blk.batch = blockIdx.z;
  blk.head = blockIdx.y * heads_per_block;
  blk.q0 = blockIdx.x * block_rows;
  prefill_block_extent(p, block_rows, blk, key_align);
  return blk;
}

// Element offset of key `key` of sequence `batch` from the first key of that sequence (contiguous
// K or V) or from the cache's base (paged), given the tensor's row and page strides; its head
// offset is added by the caller. kPaged: read the page table (p.page_table is set).
template <bool kPaged>
__device__ __forceinline__ long long key_row_offset(const KilnPrefillParams& p, int batch, int key, long long row_stride,
                                                    long long page_stride) {
  if (!kPaged) return key * row_stride;
  const long long page = p.page_table[batch * p.page_table_stride + (key >> p.page_shift)];
  return page * page_stride + (key & (p.page_size - 1)) * row_stride;
}

// The pages of the kRows key rows a thread copies per block (first, first + step, ...), read ahead
// of the copies; contiguous K and V (kPaged false) keep nothing and compute offsets directly.
template <bool kPaged, int kRows>
struct KeyPages {
  int page[kPaged ? kRows : 1];
  // Rows past the sequence keep page 0: their copies are zero fills that read nothing.
  __device__ __forceinline__ void read(const KilnPrefillParams& p, const PrefillQueryBlock& blk, int first, int step) {
    if (!kPaged) return;
    const int* table = p.page_table + blk.batch * p.page_table_stride;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int key = first + j * step;
      page[j] = key < blk.len_k ? table[key >> p.page_shift] : 0;
    }
  }
  // The element offset of row j (key `key`) from the sequence's first key (contiguous) or from
  // the cache's base (paged).
  __device__ __forceinline__ long long offset(const KilnPrefillParams& p, int j, int key, long long row_stride,
                                              long long page_stride) const {
    if (!kPaged) return key * row_stride;
    return static_cast<long long>(page[kPaged ? j : 0]) * page_stride + (key & (p.page_size - 1)) * row_stride;
  }
};

// A decode call with several new tokens per sequence as a paged prefill: q_len rows per sequence,
// causal (bottom-right aligned, as decode's tokens are). The TMA maps stay unset.
__device__ __forceinline__ KilnPrefillParams prefill_params_of_decode(const KilnDecodeParams& d) {
  KilnPrefillParams p;
  p.q = d.q;
  p.k = d.k_cache;
  p.v = d.v_cache;
  p.out = d.out;
  p.lse = d.lse;
  p.sinks = d.sinks;
  p.cu_seqlens_q = nullptr;
  p.cu_seqlens_k = nullptr;
  p.q_row_stride = d.q_row_stride;
  p.q_head_stride = d.q_head_stride;
  p.k_row_stride = d.k_row_stride;
  p.k_head_stride = d.k_head_stride;
  p.v_row_stride = d.v_row_stride;
  p.v_head_stride = d.v_head_stride;
  p.out_row_stride = d.out_row_stride;
  p.out_head_stride = d.out_head_stride;
  p.lse_row_stride = d.lse_row_stride;
  p.batch = d.batch;
  p.num_heads_q = d.num_heads_q;
  p.num_heads_kv = d.num_heads_kv;
  p.head_dim = d.head_dim;
  p.max_seqlen_q = d.q_len;
  p.max_seqlen_k = d.max_pages_per_seq * d.page_size;
  p.causal = 1;
  p.window_left = d.window_left;
  p.softmax_scale = d.softmax_scale;
  p.softcap = d.softcap;
  p.total_q = d.batch * d.q_len;
  p.total_k = 0;
  p.page_table = d.page_table;
  p.cache_seqlens = d.cache_seqlens;
  p.page_table_stride = d.page_table_stride;
  p.k_page_stride = d.k_page_stride;
  p.v_page_stride = d.v_page_stride;
  p.page_size = d.page_size;
  p.page_shift = 0;
  while ((1 << p.page_shift) < d.page_size) ++p.page_shift;  // page sizes are powers of two up to 256
  p.q_len = d.q_len;
  p.k_scale = d.k_scale;
  p.v_scale = d.v_scale;
  return p;
}

}  // namespace kiln
