// Prefill attention on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async; sm_80 and newer), in
// the FlashAttention-2 manner: a CTA owns 64 query rows of one head (16 per warp, Q fragments held
// in registers) and walks 64-key blocks of K and V, double-buffered in shared memory by cp.async;
// each warp computes S = Q K^T, one online-softmax step per row and block, and O += P V, with P
// taken straight from S's accumulators. Shared-memory rows are 16-byte chunks XOR-swizzled by
// row (chunk ^ row % 8), so ldmatrix reads are conflict-free. Key blocks wholly outside the causal
// or window band are skipped, not masked; only blocks on a band edge or past the end are masked.
// Query blocks are visited last-first, so under causal masking the longest ones start first.
// Launch: grid (ceil(max_seqlen_q / 64), Hq, batch), block 128, dynamic shared memory
// (64 + 2 x 2 x 64) x head_dim x 2 bytes: the Q tile plus two stages of K and V tiles.
#pragma once

#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"

namespace kiln {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile with `chunks` per row.
__device__ __forceinline__ int swizzled(int row, int chunk, int chunks) { return (row * chunks + (chunk ^ (row & 7))) * 16; }

template <typename T, int kHeadDim, bool kSoftcap>
__global__ void __launch_bounds__(128, 2) prefill_mma_sm80(const KilnPrefillParams p) {
  constexpr int kBlockQ = 64, kBlockK = 64;
  constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks per row
  constexpr int kKSteps = kHeadDim / 16;        // k-steps of Q K^T
  constexpr int kDTiles = kHeadDim / 8;         // n-tiles of O
  constexpr int kKeyTiles = kBlockK / 8;        // n-tiles of S
  constexpr int kTileBytes = kBlockK * kHeadDim * 2;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned char* const q_tile = shared_bytes;
  unsigned char* const kv_tiles = shared_bytes + kBlockQ * kHeadDim * 2;  // [stage][K | V]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const PrefillQueryBlock blk = prefill_query_block(p, kBlockQ);
  if (blk.q0 >= blk.len_q) return;
  const int block_start = blk.key_start / kBlockK;
  const int block_end = blk.key_end > blk.key_start ? (blk.key_end + kBlockK - 1) / kBlockK : block_start;

  // Q tile (rows past the sequence zero-filled), then each warp's 16 rows as A fragments.
  const T* q_rows = static_cast<const T*>(p.q) + (blk.q_begin + blk.q0) * p.q_row_stride + blk.head * p.q_head_stride;
  for (int i = threadIdx.x; i < kBlockQ * kChunks; i += 128) {
    const int row = i / kChunks, chunk = i % kChunks;
    const bool valid = blk.q0 + row < blk.len_q;
    copy16_async_or_zero(q_tile + swizzled(row, chunk, kChunks), q_rows + (valid ? row : 0) * p.q_row_stride + chunk * 8, valid);
  }
  commit_copies();

  const T* k_rows = static_cast<const T*>(p.k) + blk.k_begin * p.k_row_stride + blk.kv_head * p.k_head_stride;
  const T* v_rows = static_cast<const T*>(p.v) + blk.k_begin * p.v_row_stride + blk.kv_head * p.v_head_stride;
  // K and V of key block `block` into `stage`; keys past the end zero-filled (P is 0 there, and
  // 0 * garbage could be NaN).
  auto issue = [&](int block, int stage) {
    unsigned char* k_tile = kv_tiles + stage * 2 * kTileBytes;
    unsigned char* v_tile = k_tile + kTileBytes;
    for (int i = threadIdx.x; i < kBlockK * kChunks; i += 128) {
      const int row = i / kChunks, chunk = i % kChunks, key = block * kBlockK + row;
      const bool valid = key < blk.len_k;
      const int at = valid ? key : 0;
      copy16_async_or_zero(k_tile + swizzled(row, chunk, kChunks), k_rows + at * p.k_row_stride + chunk * 8, valid);
      copy16_async_or_zero(v_tile + swizzled(row, chunk, kChunks), v_rows + at * p.v_row_stride + chunk * 8, valid);
    }
    commit_copies();
  };
  if (block_start < block_end) issue(block_start, 0);

  if (block_start < block_end) wait_copies<1>();  // the Q group; the first K/V group may still fly
  else wait_copies<0>();
  __syncthreads();
  unsigned qa[kKSteps][4];
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const int mi = lane >> 3, row = warp * 16 + (mi & 1) * 8 + (lane & 7), chunk = ks * 2 + (mi >> 1);
    ldmatrix_x4(qa[ks], q_tile + swizzled(row, chunk, kChunks));
  }

  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_row[2] = {neg_inf(), neg_inf()}, l_row[2] = {0.0f, 0.0f};  // rows g, g + 8; log2 domain
  const int row_lo = blk.q0 + warp * 16 + g;  // this thread's rows: row_lo and row_lo + 8

  for (int block = block_start; block < block_end; ++block) {
    const int stage = (block - block_start) & 1;
    wait_copies<0>();
    __syncthreads();  // this block landed for every thread; every warp is done with the other stage
    if (block + 1 < block_end) issue(block + 1, stage ^ 1);
    const unsigned char* k_tile = kv_tiles + stage * 2 * kTileBytes;
    const unsigned char* v_tile = k_tile + kTileBytes;

    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        // Keys 8n .. 8n + 15, dims 16 ks .. 16 ks + 15: b0/b1 of key tile n, then of n + 1.
        const int mi = lane >> 3, key = n * 8 + (mi >> 1) * 8 + (lane & 7), chunk = ks * 2 + (mi & 1);
        unsigned kb[4];
        ldmatrix_x4(kb, k_tile + swizzled(key, chunk, kChunks));
        mma_16816<T>(s[n], qa[ks], kb[0], kb[1]);
        mma_16816<T>(s[n + 1], qa[ks], kb[2], kb[3]);
      }
    }

    // Scale, cap and mask; masks only where the block crosses a band edge or the end.
    const int key0 = block * kBlockK;
    const bool edge = key0 + kBlockK > blk.len_k || (blk.upper_bound && key0 + kBlockK - 1 > blk.q0 + warp * 16 + blk.shift) ||
                      (p.window_left >= 0 && key0 < blk.q0 + warp * 16 + 15 + blk.shift - p.window_left);
    scale_and_mask_scores<kSoftcap>(s, p, edge, row_lo, blk.shift, blk.len_k, key0 + 2 * c);
    online_softmax_step(s, m_row, l_row, o);
    // O += P V over the block's keys, 16 at a time: P's A fragments are S's accumulators.
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      const unsigned pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < kDTiles; n += 2) {
        const int key = kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), chunk = n + (lane >> 4);
        unsigned vb[4];
        ldmatrix_x4_trans(vb, v_tile + swizzled(key, chunk, kChunks));
        mma_16816<T>(o[n], pa, vb[0], vb[1]);
        mma_16816<T>(o[n + 1], pa, vb[2], vb[3]);
      }
    }
  }

  store_prefill_rows<T>(p, o, m_row, l_row, blk.head, blk.q_begin, blk.len_q, row_lo, c);
}

}  // namespace kiln
