// Prefill attention on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async; sm_80 and newer), in
// the FlashAttention-2 manner: each warp owns 16 query rows of one head (Q fragments held in
// registers) and walks blocks of kBlockK keys of K and V, kStages deep in shared memory by
// cp.async; it computes S = Q K^T, one online-softmax step per row and block, and O += P V, with P
// taken straight from S's accumulators. Shared-memory rows are 16-byte chunks XOR-swizzled by row
// (chunk ^ row % 8), so ldmatrix reads are conflict-free.
//
// A CTA of kWarps warps owns kHeadsPerCta consecutive query heads of one KV head, each over
// 16 * kWarps / kHeadsPerCta query positions; its warps share every K and V tile. One head per
// CTA (64 positions, 4 warps, 64-key blocks) is the general kernel. Several heads over few
// positions suit sliding windows: with 4 heads of a GPT-OSS KV head over 16 positions, a 128-key
// window needs 144 keys per CTA, three 48-key blocks, instead of 192 for 64 positions of one head.
// Key blocks start at the CTA's first visible key, so a window's band is not widened to a block
// boundary. Several CTAs per SM (see the launch bounds) hide one CTA's first loads behind the
// others' MMAs.
//
// Blocks wholly outside the causal or window band are skipped, not masked; only blocks on a band
// edge or past the end are masked. Query blocks are visited last-first, so under causal masking
// the longest ones start first.
// An e4m3 paged cache (Cache = e4m3, sm_89 and newer): K and V rows land by cp.async in stages of
// their own bytes, and every thread converts the block's into one pair of f16 tiles (exact; a
// second CTA barrier a block) that the same ldmatrix and MMA code reads, in f16: the queries turn
// f16 times k_scale as their fragments load, and O takes v_scale at the end.
// Launch: grid (ceil(max_seqlen_q / positions), Hq / kHeadsPerCta, batch), block 32 * kWarps,
// dynamic shared memory (16 kWarps + kStages x 2 x kBlockK) x head_dim x 2 bytes: the Q rows plus
// the stages of K and V tiles (with an e4m3 cache, the f16 tile pair and kStages stages of e4m3
// rows, as much or less).
#pragma once

#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/cp_async.cuh"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"
#include "common/vector_memory.cuh"

namespace kiln {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile with `chunks` per row.
__device__ __forceinline__ unsigned swizzled(int row, int chunk, int chunks) { return (row * chunks + (chunk ^ (row & 7))) * 16; }

// kPaged: K and V are paged caches (KilnPrefillParams::page_table): each copied row finds its page.
// Cache: their element type, T or (paged only) e4m3.
template <typename T, int kHeadDim, bool kSoftcap, int kWarps, int kHeadsPerCta, int kBlockK, int kStages, bool kPaged, typename Cache>
__device__ __forceinline__ void prefill_mma_cta(const KilnPrefillParams& p) {
  static_assert(kWarps % kHeadsPerCta == 0, "each head gets whole warps");
  constexpr int kThreads = kWarps * 32, kRows = kWarps * 16, kPositions = kRows / kHeadsPerCta;
  constexpr int kChunks = kHeadDim / 8;   // 16-byte chunks per row
  constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T
  constexpr int kDTiles = kHeadDim / 8;   // n-tiles of O
  constexpr int kKeyTiles = kBlockK / 8;  // n-tiles of S
  constexpr int kRowBytes = kHeadDim * 2, kTileBytes = kBlockK * kRowBytes;
  constexpr bool kFp8 = SameType<Cache, e4m3>::value;
  static_assert(!kFp8 || kPaged, "e4m3 K and V come from paged caches");
  typedef typename MmaType<T, Cache>::type M;                    // what the MMAs multiply: T, or f16
  constexpr int kCacheRowBytes = kHeadDim * int(sizeof(Cache));  // a K or V row as copied
  constexpr int kCopyChunks = kCacheRowBytes / 16;               // 16-byte copies per row
  // Rows of a K or V tile one pass of the CTA copies: all threads, or half where that would not
  // divide the tile (e4m3 rows at head_dim 64 in 48-key tiles: 16 rows, the first 64 threads).
  constexpr int kPassRows = kThreads / kCopyChunks;
  constexpr int kCopyRows = kBlockK % kPassRows == 0 ? kPassRows : kPassRows / 2;
  constexpr int kCacheTileBytes = kBlockK * kCacheRowBytes;
  static_assert(kBlockK % 16 == 0 && kBlockK % kCopyRows == 0 && (kCopyRows % 8 == 0 || 8 % kCopyRows == 0), "whole copies");
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const unsigned q_tile = shared_address(shared_bytes);  // row 16 w + r: warp w's row r
  // 16-bit caches: [kStages][K | V] tiles, swizzled, that the MMAs read. e4m3: one [K | V] pair of
  // f16 tiles the MMAs read, then [kStages][K | V] stages of plain e4m3 rows.
  const unsigned kv_tiles = q_tile + kRows * kRowBytes;
  const unsigned copy_stages = kFp8 ? kv_tiles + 2 * kTileBytes : kv_tiles;

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
    copy16_async_or_zero(q_tile + swizzled(warp * 16 + row, chunk, kChunks), q_rows + (valid ? row : 0) * p.q_row_stride + chunk * 8,
                         valid);
  }
  commit_copies();

  // K and V of key block `block` into stage block % kStages, as one cp.async group (empty past the
  // last block, so every thread always has the same groups in flight): the thread copies chunk
  // `copy_chunk` of rows copy_row + j kCopyRows (copy_step(j) past the first). Keys no row of the
  // CTA sees are zero-filled (P is 0 there, and 0 * garbage could be NaN).
  constexpr int kPerCopy = 16 / int(sizeof(Cache));  // elements a copy moves
  const int copy_row = threadIdx.x / kCopyChunks, copy_chunk = threadIdx.x % kCopyChunks;
  const Cache* k_rows =
      static_cast<const Cache*>(p.k) + blk.k_begin * p.k_row_stride + blk.kv_head * p.k_head_stride + copy_chunk * kPerCopy;
  const Cache* v_rows =
      static_cast<const Cache*>(p.v) + blk.k_begin * p.v_row_stride + blk.kv_head * p.v_head_stride + copy_chunk * kPerCopy;
  const unsigned copy_offset = kFp8 ? copy_row * kCacheRowBytes + copy_chunk * 16 : swizzled(copy_row, copy_chunk, kChunks);
  // Copy j's offset from the first copy's: whole rows where a pass copies whole 8-row swizzle
  // groups (or e4m3's plain rows); at head_dim 256 (4 rows a pass) odd copies sit in the other
  // half of a group.
  auto copy_step = [&](int j) -> unsigned {
    if constexpr (kFp8 || kCopyRows % 8 == 0) return j * kCopyRows * kCacheRowBytes;
    return swizzled(copy_row + j * kCopyRows, copy_chunk, kChunks) - copy_offset;
  };
  // Paged: the pages of the rows this thread copies for the next block, read an iteration ahead.
  KeyPages<kPaged, kBlockK / kCopyRows> pages;
  auto read_pages = [&](int block) { pages.read(p, blk, blk.key_start + block * kBlockK + copy_row, kCopyRows); };
  auto issue = [&](int block) {
    if (block >= num_blocks) {
      commit_copies();
      return;
    }
    const int key = blk.key_start + block * kBlockK + copy_row;
    const unsigned k_tile = copy_stages + block % kStages * 2 * kCacheTileBytes + copy_offset;
    if (kCopyRows == kPassRows || copy_row < kCopyRows) {
#pragma unroll
      for (int j = 0; j < kBlockK / kCopyRows; ++j) {
        const int row_key = key + j * kCopyRows;
        const bool valid = row_key < blk.key_end;
        const long long k_at = valid ? pages.offset(p, j, row_key, p.k_row_stride, p.k_page_stride) : 0;
        const long long v_at = valid ? pages.offset(p, j, row_key, p.v_row_stride, p.v_page_stride) : 0;
        copy16_async_or_zero(k_tile + copy_step(j), k_rows + k_at, valid);
        copy16_async_or_zero(k_tile + kCacheTileBytes + copy_step(j), v_rows + v_at, valid);
      }
    }
    commit_copies();
  };
#pragma unroll
  for (int block = 0; block < kStages - 1; ++block) {
    read_pages(block);
    issue(block);
  }
  read_pages(kStages - 1);

  wait_copies<kStages - 1>();  // the Q group; the K/V groups may still fly
  __syncthreads();
  unsigned qa[kKSteps][4];
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const int mi = lane >> 3, row = warp * 16 + (mi & 1) * 8 + (lane & 7), chunk = ks * 2 + (mi >> 1);
    ldmatrix_x4(qa[ks], q_tile + swizzled(row, chunk, kChunks));
    if constexpr (kFp8) {  // f16 for the MMAs, with the keys' scale
#pragma unroll
      for (int i = 0; i < 4; ++i) qa[ks][i] = scaled_pair_to_f16x2<T>(qa[ks][i], p.k_scale);
    }
  }
  // ldmatrix addresses, as offsets from a tile: K's x4 loads give b0/b1 of key tiles n and n + 1
  // over dims 16 ks .. 16 ks + 15 (lane: key (lane >> 4) 8 + lane % 8, dim chunk 2 ks + (lane >> 3) % 2);
  // V's transposed loads give dim tiles n and n + 1 over keys 16 kk .. 16 kk + 15 (lane: key
  // lane % 8 + 8 ((lane >> 3) % 2), chunk n + lane / 16). Tile offsets add rows in multiples of 8,
  // which keep the swizzle (chunk ^ row % 8), and chunks that XOR into it.
  const unsigned k_lane = (((lane >> 4) << 3) + (lane & 7)) * kRowBytes, k_xor = ((lane >> 3) & 1) ^ (lane & 7);
  const unsigned v_lane = ((lane & 7) + (((lane >> 3) & 1) << 3)) * kRowBytes, v_xor = (lane >> 4) ^ (lane & 7);

  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_row[2] = {neg_inf(), neg_inf()}, l_row[2] = {0.0f, 0.0f};  // rows g, g + 8; log2 domain
  const int row_lo = warp_q0 + g;                                    // this thread's rows: row_lo and row_lo + 8

  for (int block = 0; block < num_blocks; ++block) {
    wait_copies<kStages - 2>();
    __syncthreads();             // this block landed for every thread; every warp is done with the previous one
    issue(block + kStages - 1);  // into the previous block's stage
    read_pages(block + kStages);
    if constexpr (kFp8) {
      // The block's e4m3 rows to the f16 tiles, 16 bytes (16 values) a step, two swizzled chunks each.
      const unsigned stage = copy_stages + block % kStages * 2 * kCacheTileBytes;
      for (int i = threadIdx.x; i < 2 * kBlockK * kCopyChunks; i += kThreads) {
        const int tile = i / (kBlockK * kCopyChunks), row = i / kCopyChunks % kBlockK, chunk = i % kCopyChunks;
        const Bf16x8 raw = load16_shared(stage + tile * kCacheTileBytes + row * kCacheRowBytes + chunk * 16);
        const unsigned to = kv_tiles + tile * kTileBytes;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const unsigned lo = raw.w[2 * half], hi = raw.w[2 * half + 1];
          store16_shared(to + swizzled(row, 2 * chunk + half, kChunks), e4m3x8_to_pairs<f16>(lo, hi));
        }
      }
      __syncthreads();  // every f16 row is in place before any warp reads the tiles
    }
    const int key0 = blk.key_start + block * kBlockK;
    if (key0 >= warp_key_end || key0 + kBlockK <= warp_key_start) continue;  // none of the warp's rows sees it
    const unsigned k_tile = kFp8 ? kv_tiles : kv_tiles + block % kStages * 2 * kTileBytes;
    const unsigned v_tile = k_tile + kTileBytes;

    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; n += 2) {
        unsigned kb[4];
        ldmatrix_x4(kb, k_tile + k_lane + n * 8 * kRowBytes + (((2 * ks) ^ k_xor) << 4));
        mma_16816<M>(s[n], qa[ks], kb[0], kb[1]);
        mma_16816<M>(s[n + 1], qa[ks], kb[2], kb[3]);
      }
    }

    // Scale, cap and mask; masks only where the block crosses a band edge or the end.
    const bool edge = key0 + kBlockK > blk.len_k || (blk.upper_bound && key0 + kBlockK - 1 > warp_q0 + blk.shift) ||
                      (p.window_left >= 0 && key0 < warp_q0 + 15 + blk.shift - p.window_left);
    cap_and_mask_scores<kSoftcap>(s, p, edge, row_lo, blk.shift, blk.len_k, key0 + 2 * c);
    online_softmax_step<true, true>(s, m_row, l_row, o, pending_logit_scale<kSoftcap>(p));
    // O += P V over the block's keys, 16 at a time: P's A fragments are S's accumulators.
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      const unsigned pa[4] = {pack2<M>(s[2 * kk][0], s[2 * kk][1]), pack2<M>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<M>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<M>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < kDTiles; n += 2) {
        unsigned vb[4];
        ldmatrix_x4_trans(vb, v_tile + v_lane + kk * 16 * kRowBytes + ((n ^ v_xor) << 4));
        mma_16816<M>(o[n], pa, vb[0], vb[1]);
        mma_16816<M>(o[n + 1], pa, vb[2], vb[3]);
      }
    }
  }

  if constexpr (kFp8) {
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= p.v_scale;
    }
  }
  store_prefill_rows<T>(p, o, m_row, l_row, head, blk.q_begin, blk.len_q, row_lo, c);
}

// Registers are budgeted, at 4 warps, for 3 CTAs per SM at head_dim 64 (170 per thread), 4 with
// 48-key blocks, whose S tile is smaller (128), and 2 at head_dim 128 and 256 (255; at 256 Q's
// fragments and O alone take 192, with 32-key blocks); 8-warp CTAs get half as many.
#define KILN_PREFILL_MMA_BOUNDS                                                                  \
  __launch_bounds__(kWarps * 32, (kHeadDim == 64 ? (kBlockK <= 48 ? 16 : 12) : 8) / kWarps > 0   \
                                     ? (kHeadDim == 64 ? (kBlockK <= 48 ? 16 : 12) : 8) / kWarps \
                                     : 1)

template <typename T, int kHeadDim, bool kSoftcap, int kWarps, int kHeadsPerCta, int kBlockK, int kStages, bool kPaged = false,
          typename Cache = T>
__global__ void KILN_PREFILL_MMA_BOUNDS prefill_mma(const KilnPrefillParams p) {
  prefill_mma_cta<T, kHeadDim, kSoftcap, kWarps, kHeadsPerCta, kBlockK, kStages, kPaged, Cache>(p);
}

// Decode with several new tokens per sequence (speculative verification) as a paged prefill:
// grid (ceil(q_len / positions), Hq / kHeadsPerCta, batch).
template <typename T, int kHeadDim, bool kSoftcap, int kWarps, int kHeadsPerCta, int kBlockK, int kStages, typename Cache = T>
__global__ void KILN_PREFILL_MMA_BOUNDS decode_prefill_mma(const KilnDecodeParams d) {
  prefill_mma_cta<T, kHeadDim, kSoftcap, kWarps, kHeadsPerCta, kBlockK, kStages, true, Cache>(prefill_params_of_decode(d));
}
#undef KILN_PREFILL_MMA_BOUNDS

}  // namespace kiln
