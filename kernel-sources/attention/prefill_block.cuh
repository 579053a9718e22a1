// The query block a prefill CTA (or AMD wavefront) owns, and the keys it must visit: shared by
// the prefill kernels so that their bounds, causal alignment and window agree by construction.
#pragma once

#include "attention/params.h"
#include "common/prelude.cuh"

namespace kiln {

struct PrefillQueryBlock {
  int head, kv_head;       // the block's first query head and the KV head it reads
  int q_begin, len_q;      // the sequence's queries in the packed q: [q_begin, q_begin + len_q)
  int k_begin, len_k;      // its keys in the packed k and v
  int q0;                  // first query row of the block, relative to the sequence
  int shift;               // row i sits at key position i + shift: bottom-right aligned
  bool upper_bound;        // causal: keys past i + shift are masked (a window bounds only the left)
  int key_start, key_end;  // keys any row of the block can see: [key_start, key_end)
};

// Grid (query blocks, Hq / heads_per_block, batch): a block owns `block_rows` query positions of
// `heads_per_block` consecutive query heads (all reading one KV head). Blocks are taken last-first
// so that under causal masking the longest rows start first. The block is empty when q0 >= len_q
// (a shorter sequence of the batch).
__device__ __forceinline__ PrefillQueryBlock prefill_query_block(const KilnPrefillParams& p, int block_rows, int heads_per_block = 1) {
  PrefillQueryBlock blk;
  const int b = blockIdx.z;
  blk.head = blockIdx.y * heads_per_block;
  blk.kv_head = blk.head / (p.num_heads_q / p.num_heads_kv);
  blk.q_begin = p.cu_seqlens_q[b];
  blk.len_q = p.cu_seqlens_q[b + 1] - blk.q_begin;
  blk.k_begin = p.cu_seqlens_k[b];
  blk.len_k = p.cu_seqlens_k[b + 1] - blk.k_begin;
  blk.q0 = (gridDim.x - 1 - blockIdx.x) * block_rows;
  blk.shift = blk.len_k - blk.len_q;
  blk.upper_bound = p.causal != 0;
  const int last_row = min(blk.len_q, blk.q0 + block_rows) - 1;
  blk.key_end = blk.upper_bound ? min(blk.len_k, last_row + blk.shift + 1) : blk.len_k;
  blk.key_start = p.window_left >= 0 ? max(0, blk.q0 + blk.shift - p.window_left) : 0;
  return blk;
}

}  // namespace kiln
