// Prefill attention on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async; sm_80 and newer), in
// the FlashAttention-2 manner: each warp owns 16 query rows of one head (Q fragments held in
// registers) and walks 64-key blocks of K and V, double-buffered in shared memory by cp.async;
// it computes S = Q K^T, one online-softmax step per row and block, and O += P V, with P taken
// straight from S's accumulators. Shared-memory rows are 16-byte chunks XOR-swizzled by row
// (chunk ^ row % 8), so ldmatrix reads are conflict-free.
//
// A CTA of kWarps warps owns kHeadsPerCta consecutive query heads of one KV head, each over
// 16 * kWarps / kHeadsPerCta query positions; its warps share every K and V tile. One head per
// CTA (64 positions, 4 warps) is the general kernel; several heads over few positions suit
// sliding windows: with 4 heads of a GPT-OSS KV head over 16 positions, a 128-key window needs
// 144 keys per CTA instead of 192 for 64 positions of one head. Three CTAs per SM at head_dim 64
// (two at 128) hide one CTA's first loads behind the others' MMAs.
//
// Key blocks start at the CTA's first visible key, so a window's band is not widened to 64-key
// alignment; a warp skips 16-key chunks of a block that none of its rows sees, and blocks it sees
// nothing of. Only blocks on a band edge or past the end are masked. Query blocks are visited
// last-first, so under causal masking the longest ones start first.
// Launch: grid (ceil(max_seqlen_q / positions), Hq / kHeadsPerCta, batch), block 32 * kWarps,
// dynamic shared memory (16 kWarps + 2 x 2 x 64) x head_dim x 2 bytes: the Q rows plus two stages
// of K and V tiles.
#pragma once

#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"

namespace kiln {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile with `chunks` per row.
__device__ __forceinline__ int swizzled(int row, int chunk, int chunks) { return (row * chunks + (chunk ^ (row & 7))) * 16; }

template <typename T, int kHeadDim, bool kSoftcap, int kWarps, int kHeadsPerCta>
__global__ void __launch_bounds__(kWarps * 32, kHeadDim == 64 ? 3 : 2) prefill_mma_sm80(const KilnPrefillParams p) {
  static_assert(kWarps % kHeadsPerCta == 0, "each head gets whole warps");
  constexpr int kThreads = kWarps * 32, kRows = kWarps * 16, kPositions = kRows / kHeadsPerCta;
  constexpr int kBlockK = 64;
  constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks per row
  constexpr int kKSteps = kHeadDim / 16;        // k-steps of Q K^T
  constexpr int kDTiles = kHeadDim / 8;         // n-tiles of O
  constexpr int kKeyTiles = kBlockK / 8;        // n-tiles of S
  constexpr int kTileBytes = kBlockK * kHeadDim * 2;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned char* const q_tile = shared_bytes;  // row 16 w + r: warp w's row r
  unsigned char* const kv_tiles = shared_bytes + kRows * kHeadDim * 2;  // [stage][K | V]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const PrefillQueryBlock blk = prefill_query_block(p, kPositions, kHeadsPerCta);
  if (blk.q0 >= blk.len_q) return;
  const int num_blocks = blk.key_end > blk.key_start ? (blk.key_end - blk.key_start + kBlockK - 1) / kBlockK : 0;

  // This warp's head and 16 positions, and the keys [warp_key_start, warp_key_end) its rows see.
  const int head = blk.head + warp % kHeadsPerCta;
  const int warp_q0 = blk.q0 + 16 * (warp / kHeadsPerCta);
  const int warp_last = min(blk.len_q, warp_q0 + 16) - 1;
  int warp_key_start = p.window_left >= 0 ? max(0, warp_q0 + blk.shift - p.window_left) : 0;
  int warp_key_end = blk.upper_bound ? min(blk.len_k, warp_last + blk.shift + 1) : blk.len_k;
  if (warp_last < warp_q0) warp_key_start = warp_key_end = 0;  // rows all past the sequence

  // Each warp's 16 Q rows (rows past the sequence zero-filled), then as A fragments.
  const T* q_rows = static_cast<const T*>(p.q) + (blk.q_begin + warp_q0) * p.q_row_stride + head * p.q_head_stride;
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int row = i / kChunks, chunk = i % kChunks;
    const bool valid = warp_q0 + row < blk.len_q;
    copy16_async_or_zero(q_tile + swizzled(warp * 16 + row, chunk, kChunks), q_rows + (valid ? row : 0) * p.q_row_stride + chunk * 8, valid);
  }
  commit_copies();

  const T* k_rows = static_cast<const T*>(p.k) + blk.k_begin * p.k_row_stride + blk.kv_head * p.k_head_stride;
  const T* v_rows = static_cast<const T*>(p.v) + blk.k_begin * p.v_row_stride + blk.kv_head * p.v_head_stride;
  // K and V of key block `block` into `stage`; keys no row of the CTA sees zero-filled (P is 0
  // there, and 0 * garbage could be NaN).
  auto issue = [&](int block, int stage) {
    unsigned char* k_tile = kv_tiles + stage * 2 * kTileBytes;
    unsigned char* v_tile = k_tile + kTileBytes;
    for (int i = threadIdx.x; i < kBlockK * kChunks; i += kThreads) {
      const int row = i / kChunks, chunk = i % kChunks, key = blk.key_start + block * kBlockK + row;
      const bool valid = key < blk.key_end;
      const int at = valid ? key : 0;
      copy16_async_or_zero(k_tile + swizzled(row, chunk, kChunks), k_rows + at * p.k_row_stride + chunk * 8, valid);
      copy16_async_or_zero(v_tile + swizzled(row, chunk, kChunks), v_rows + at * p.v_row_stride + chunk * 8, valid);
    }
    commit_copies();
  };
  if (num_blocks > 0) issue(0, 0);

  if (num_blocks > 0) wait_copies<1>();  // the Q group; the first K/V group may still fly
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
  const int row_lo = warp_q0 + g;  // this thread's rows: row_lo and row_lo + 8

  for (int block = 0; block < num_blocks; ++block) {
    const int stage = block & 1;
    wait_copies<0>();
    __syncthreads();  // this block landed for every thread; every warp is done with the other stage
    if (block + 1 < num_blocks) issue(block + 1, stage ^ 1);
    const int key0 = blk.key_start + block * kBlockK;
    // The 16-key chunks [chunk_lo, chunk_hi) of this block that some row of the warp sees.
    const int chunk_lo = max(0, warp_key_start - key0) / 16;
    const int chunk_hi = min(kBlockK / 16, (warp_key_end - key0 + 15) / 16);
    if (chunk_lo >= chunk_hi) continue;
    const unsigned char* k_tile = kv_tiles + stage * 2 * kTileBytes;
    const unsigned char* v_tile = k_tile + kTileBytes;

    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        if (n / 2 < chunk_lo || n / 2 >= chunk_hi) continue;
        // Keys 8n .. 8n + 15, dims 16 ks .. 16 ks + 15: b0/b1 of key tile n, then of n + 1.
        const int mi = lane >> 3, key = n * 8 + (mi >> 1) * 8 + (lane & 7), chunk = ks * 2 + (mi & 1);
        unsigned kb[4];
        ldmatrix_x4(kb, k_tile + swizzled(key, chunk, kChunks));
        mma_16816<T>(s[n], qa[ks], kb[0], kb[1]);
        mma_16816<T>(s[n + 1], qa[ks], kb[2], kb[3]);
      }
    }

    // Scale, cap and mask; masks only where the block crosses a band edge or the end (skipped
    // chunks lie outside the band, so a block with any is an edge block).
    const bool edge = key0 + kBlockK > blk.len_k || (blk.upper_bound && key0 + kBlockK - 1 > warp_q0 + blk.shift) ||
                      (p.window_left >= 0 && key0 < warp_q0 + 15 + blk.shift - p.window_left);
    scale_and_mask_scores<kSoftcap>(s, p, edge, row_lo, blk.shift, blk.len_k, key0 + 2 * c);
    online_softmax_step(s, m_row, l_row, o);
    // O += P V over the block's keys, 16 at a time: P's A fragments are S's accumulators.
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      if (kk < chunk_lo || kk >= chunk_hi) continue;
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

  store_prefill_rows<T>(p, o, m_row, l_row, head, blk.q_begin, blk.len_q, row_lo, c);
}

}  // namespace kiln
