// Prefill attention on Hopper's warpgroup MMA (wgmma, sm_90a). A CTA owns 64 query rows of one
// head per warpgroup: two warpgroups at head_dim 128, three at 64 (more rows per K/V tile where
// the MMAs are short). It walks 128-key blocks of K and V, staged (three deep) in
// shared memory by cp.async in the 128-byte swizzle that wgmma reads. Per block each warpgroup
// computes S = Q K^T with both operands in shared memory, one online-softmax step per row on S's
// accumulators, and O += P V with P straight from registers (the RS form) and V read N-major;
// warpgroup 1 runs half a block behind the others. Key blocks wholly outside the causal or
// window band are skipped, only edge blocks are masked; query blocks are visited last-first so
// the longest start first.
// Launch: grid (ceil(max_seqlen_q / rows), Hq, batch), block 2 x rows, with rows = 64 x warpgroups;
// dynamic shared memory (rows + 3 x 2 x 128) x head_dim x 2 bytes + 1024 (alignment of the swizzle
// atoms): 225 KB at head_dim 128.
#pragma once

#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/cp_async.cuh"
#include "common/prelude.cuh"
#include "common/wgmma_sm90.cuh"

namespace kiln {

// kPaged: K and V are paged caches (KilnPrefillParams::page_table): each copied row finds its page.
template <typename T, int kHeadDim, bool kSoftcap, bool kPaged = false>
__global__ void __launch_bounds__(kHeadDim == 64 ? 384 : 256, 1) prefill_wgmma(const KilnPrefillParams p) {
  enum : int {
    kWarpgroups = kHeadDim == 64 ? 3 : 2,
    kBlockQ = 64 * kWarpgroups,
    kCopyThreads = 256,  // the first two warpgroups issue the copies
    kBlockK = 128,
    kStages = 3,                  // K and V tiles in flight (see the loop)
    kChunks = kHeadDim / 8,       // 16-byte chunks per row
    kQAtomBytes = kBlockQ * 128,  // one 64-column swizzle-atom column of the Q tile
    kKAtomBytes = kBlockK * 128,
    kTileBytes = kKAtomBytes * (kHeadDim / 64),
    kKeyTiles = kBlockK / 8,
    kDTiles = kHeadDim / 8,
  };
  extern __shared__ unsigned char shared_raw[];
  unsigned char* const q_tile = align_shared<1024>(shared_raw);
  unsigned char* const kv_tiles = q_tile + kQAtomBytes * (kHeadDim / 64);  // [kStages][K | V]

  // The warpgroup index through a shuffle, so ptxas knows it is warp-uniform: with a plain
  // threadIdx.x / 128 it treats the lagging warpgroup's branches as divergent and serializes their wgmmas.
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0), warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const PrefillQueryBlock blk = prefill_query_block(p, kBlockQ);
  if (blk.q0 >= blk.len_q) return;
  const int block_start = blk.key_start / kBlockK;
  const int block_end = blk.key_end > blk.key_start ? (blk.key_end + kBlockK - 1) / kBlockK : block_start;

  // Q tile, rows past the sequence zero-filled.
  const T* q_rows = static_cast<const T*>(p.q) + (blk.q_begin + blk.q0) * p.q_row_stride + blk.head * p.q_head_stride;
  for (int i = threadIdx.x; i < kBlockQ * kChunks; i += kWarpgroups * 128) {
    const int row = i / kChunks, chunk = i % kChunks;
    const bool valid = blk.q0 + row < blk.len_q;
    copy16_async_or_zero(q_tile + swizzle128_tile_offset(row, chunk, kQAtomBytes), q_rows + (valid ? row : 0) * p.q_row_stride + chunk * 8,
                         valid);
  }
  commit_copies();

  const T* k_rows = static_cast<const T*>(p.k) + blk.k_begin * p.k_row_stride + blk.kv_head * p.k_head_stride;
  const T* v_rows = static_cast<const T*>(p.v) + blk.k_begin * p.v_row_stride + blk.kv_head * p.v_head_stride;
  // K and V of key block `block` into `stage`; keys past the end zero-filled (P is 0 there, and
  // 0 * garbage could be NaN). A thread always copies chunk `chunk` of rows row0 + j * kRowStep:
  // kRowStep is a multiple of 8, so the swizzled shared offset moves by whole rows.
  enum : int { kRowStep = kCopyThreads / kChunks, kCopies = kBlockK / kRowStep };
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const unsigned copy_offset = swizzle128_tile_offset(row0, chunk, kKAtomBytes);
  const T* k_thread = k_rows + chunk * 8;
  const T* v_thread = v_rows + chunk * 8;
  // Paged: the pages of the rows a thread copies for the next block, read a block ahead so the
  // page-table latency does not stall the copying warps before their MMAs.
  KeyPages<kPaged, kCopies> pages;
  auto issue = [&](int block, int stage) {
    if (threadIdx.x >= kCopyThreads) return;
    unsigned char* k_tile = kv_tiles + stage * 2 * kTileBytes + copy_offset;
    unsigned char* v_tile = k_tile + kTileBytes;
    const int first = block * kBlockK + row0;
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      const int key = first + j * kRowStep;
      const bool valid = key < blk.len_k;  // invalid: row 0 of the sequence, read as zero bytes
      const long long k_at = valid ? pages.offset(p, j, key, p.k_row_stride, p.k_page_stride) : 0;
      const long long v_at = valid ? pages.offset(p, j, key, p.v_row_stride, p.v_page_stride) : 0;
      copy16_async_or_zero(k_tile + j * kRowStep * 128, k_thread + k_at, valid);
      copy16_async_or_zero(v_tile + j * kRowStep * 128, v_thread + v_at, valid);
    }
    commit_copies();
  };
  auto read_pages = [&](int block) {
    if (threadIdx.x < kCopyThreads) pages.read(p, blk, block * kBlockK + row0, kRowStep);
  };
  read_pages(block_start);
  if (block_start < block_end) issue(block_start, 0);
  read_pages(block_start + 1);

  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float s[kKeyTiles][4];
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  float m_row[2] = {neg_inf(), neg_inf()}, l_row[2] = {0.0f, 0.0f};  // rows g, g + 8; log2 domain
  const int warp_row0 = blk.q0 + warpgroup * 64 + warp * 16;         // this warp's first row
  const int row_lo = warp_row0 + g;                                  // this thread's rows: row_lo, row_lo + 8
  const unsigned q_address = shared_address(q_tile) + warpgroup * 64 * 128;

  // O += P V over one block's keys, 16 at a time; V is N-major: 8 keys per 1024-byte atom row
  // group, the next 64 columns one atom column on.
  unsigned pa[kBlockK / 16][4];
  auto issue_pv = [&](int stage) {
    const unsigned v_address = shared_address(kv_tiles + stage * 2 * kTileBytes) + kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk)
      wgmma_rs<T, kHeadDim>(o, pa[kk], wgmma_descriptor(v_address + kk * 16 * 128, kKAtomBytes, 1024));
    wgmma_commit();
  };
  // Warpgroup 1 runs half an iteration behind the others: it issues the P V of the previous block
  // together with this block's Q K^T, so one warpgroup's softmax (exp on the MUFU) overlaps the
  // other's MMAs instead of both idling the tensor cores at once. Its P lives across the barrier,
  // so a block's stage stays untouched for one more iteration: three stages, prefetch distance 1.
  const bool lagging = warpgroup == 1;
  for (int block = block_start; block < block_end; ++block) {
    const int stage = (block - block_start) % kStages;
    wait_copies<0>();
    fence_async_shared();
    __syncthreads();  // this block (and Q) landed for every thread; no warpgroup still reads the stage refilled next
    if (block + 1 < block_end) issue(block + 1, (stage + 1) % kStages);
    read_pages(block + 2);
    const unsigned k_address = shared_address(kv_tiles + stage * 2 * kTileBytes);

    wgmma_fence();
    if (lagging && block > block_start) issue_pv(stage == 0 ? kStages - 1 : stage - 1);
    // S = Q K^T over head_dim.
    wgmma_ss_k_major<T, kBlockK, kHeadDim>(s, q_address, kQAtomBytes, k_address, kKAtomBytes);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);
    wgmma_fence_operands(o);

    // Scale, cap and mask; masks only where the warp's rows cross a band edge or the end.
    const int key0 = block * kBlockK;
    const bool edge = key0 + kBlockK > blk.len_k || (blk.upper_bound && key0 + kBlockK - 1 > warp_row0 + blk.shift) ||
                      (p.window_left >= 0 && key0 < warp_row0 + 15 + blk.shift - p.window_left);
    cap_and_mask_scores<kSoftcap>(s, p, edge, row_lo, blk.shift, blk.len_k, key0 + 2 * c);
    online_softmax_step<true>(s, m_row, l_row, o, pending_logit_scale<kSoftcap>(p));
    // P's A fragments are S's accumulators.
    pack_p_fragments<T>(s, pa);
    if (!lagging) {
      wgmma_fence();
      issue_pv(stage);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
    }
  }
  if (lagging && block_start < block_end) {  // the last block's P V
    wgmma_fence();
    issue_pv((block_end - 1 - block_start) % kStages);
    wgmma_wait<0>();
    wgmma_fence_operands(o);
  }
  wait_copies<0>();  // no key block: Q's copies still land before the CTA exits

  store_prefill_rows<T>(p, o, m_row, l_row, blk.head, blk.q_begin, blk.len_q, row_lo, c);
}

}  // namespace kiln
