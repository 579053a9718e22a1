// Sliding-window prefill on Hopper's warpgroup MMA (wgmma, sm_90a). The CTA holds query heads of
// one KV head over few positions, like the mma.sync window kernel (prefill_mma_sm80.cuh): warp w
// owns 16 positions of head w % kHeadsPerCta. GPT-OSS (4 warps, 4 of the 8 heads of a KV head,
// 16 positions) has a band of 144 keys: three 48-key blocks starting at the band's first key,
// copied by cp.async one block ahead (kStages = 2). Per block the warpgroup computes
// S = Q K^T as one m64n48 MMA chain (both operands in shared memory, 128-byte swizzle), one
// online-softmax step, and O += P V with P from registers and V read N-major. Out goes through
// shared memory so that stores write whole rows.
//
// Measured on an H200 (GPT-OSS window 128 with sinks, S = 4096; bench/RESULTS.md): one 144-key
// block took 133 registers (S alone is 72) and ran 1 CTA per SM, 40% slower than 48-key blocks;
// two warpgroups per CTA (all 8 heads sharing K and V) fit 2 CTAs per SM and ran 10% slower than
// one warpgroup at 5 CTAs per SM (33 KB of shared memory each); 3 stages (45 KB: 4 CTAs per SM)
// ran 3% slower than 2.
// Launch: grid (ceil(max_seqlen_q / positions), Hq / kHeadsPerCta, batch), block 32 * kWarps,
// dynamic shared memory (16 kWarps + kStages x 2 x kBlockK) x head_dim x 2 + 1024 bytes.
#pragma once

#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"
#include "common/wgmma_sm90.cuh"

namespace kiln {

// Registers for 5 CTAs of 4 warps per SM at head_dim 64 (93 used), 2 at head_dim 128; for 8-warp
// CTAs 2 and 1.
template <typename T, int kHeadDim, bool kSoftcap, int kWarps, int kHeadsPerCta, int kBlockK, int kStages>
__global__ void __launch_bounds__(kWarps * 32, kWarps == 4 ? (kHeadDim == 64 ? 5 : 2) : (kHeadDim == 64 ? 2 : 1)) prefill_wgmma_window_sm90(const KilnPrefillParams p) {
  static_assert(kWarps % 4 == 0 && kWarps % kHeadsPerCta == 0, "whole warpgroups; each head gets whole warps");
  static_assert(kBlockK % 16 == 0 && kBlockK * 128 % 1024 == 0 && kStages >= 2, "whole swizzle atoms");
  constexpr int kThreads = kWarps * 32, kRows = kWarps * 16, kPositions = kRows / kHeadsPerCta;
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  constexpr int kQAtomBytes = kRows * 128, kKAtomBytes = kBlockK * 128, kTileBytes = kKAtomBytes * (kHeadDim / 64);
  constexpr int kKeyTiles = kBlockK / 8, kDTiles = kHeadDim / 8;
  static_assert(kRows * kChunks % kThreads == 0, "whole Q copies per thread");
  extern __shared__ unsigned char shared_raw[];
  unsigned char* const q_tile = align_shared<1024>(shared_raw);
  unsigned char* const kv_tiles = q_tile + kQAtomBytes * (kHeadDim / 64);  // [kStages][K | V]

  // Through a shuffle so ptxas knows the warp index is warp-uniform (see prefill_wgmma_sm90.cuh).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const PrefillQueryBlock blk = prefill_query_block(p, kPositions, kHeadsPerCta);
  if (blk.q0 >= blk.len_q) return;
  const int num_blocks = blk.key_end > blk.key_start ? (blk.key_end - blk.key_start + kBlockK - 1) / kBlockK : 0;

  // Q rows: tile row 16 w + r is position q0 + 16 (w / kHeadsPerCta) + r of head w % kHeadsPerCta;
  // rows past the sequence zero-filled.
  const T* q_base = static_cast<const T*>(p.q) + (blk.q_begin + blk.q0) * p.q_row_stride + blk.head * p.q_head_stride;
#pragma unroll
  for (int j = 0; j < kRows * kChunks / kThreads; ++j) {
    const int i = threadIdx.x + j * kThreads, row = i / kChunks, chunk = i % kChunks, w = row / 16;
    const int position = 16 * (w / kHeadsPerCta) + row % 16;
    const bool valid = blk.q0 + position < blk.len_q;
    const T* src = q_base + (valid ? position : 0) * p.q_row_stride + (w % kHeadsPerCta) * p.q_head_stride + chunk * 8;
    copy16_async_or_zero(q_tile + swizzle128_tile_offset(row, chunk, kQAtomBytes), src, valid);
  }

  // K and V of key block `block` into its stage, one cp.async group (Q joins the first); keys past
  // the band are zero-filled (P is 0 there, and 0 * garbage could be NaN). A thread copies chunk
  // `chunk` of rows row0 + j kRowStep: kRowStep is a multiple of 8, so the swizzled offset moves by
  // whole rows, and the source pointers advance by one stride (few registers live across the loop).
  constexpr int kRowStep = kThreads / kChunks, kCopies = (kBlockK + kRowStep - 1) / kRowStep;
  static_assert(kRowStep % 8 == 0, "one swizzle phase per thread");
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const unsigned copy_offset = swizzle128_tile_offset(row0, chunk, kKAtomBytes);
  const T* const k_rows = static_cast<const T*>(p.k) + blk.k_begin * p.k_row_stride + blk.kv_head * p.k_head_stride + chunk * 8;
  const T* const v_rows = static_cast<const T*>(p.v) + blk.k_begin * p.v_row_stride + blk.kv_head * p.v_head_stride + chunk * 8;
  auto issue = [&](int block) {
    if (block >= num_blocks) {  // an empty group, so every thread always has the same groups in flight
      commit_copies();
      return;
    }
    unsigned char* const k_tile = kv_tiles + (block % kStages) * 2 * kTileBytes + copy_offset;
    const int first = blk.key_start + block * kBlockK + row0;
    const T* k_src = k_rows + static_cast<long long>(first) * p.k_row_stride;
    const T* v_src = v_rows + static_cast<long long>(first) * p.v_row_stride;
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      if (kBlockK % kRowStep != 0 && j == kCopies - 1 && row0 + j * kRowStep >= kBlockK) break;
      const bool valid = first + j * kRowStep < blk.key_end;
      copy16_async_or_zero(k_tile + j * kRowStep * 128, valid ? k_src : k_rows, valid);
      copy16_async_or_zero(k_tile + kTileBytes + j * kRowStep * 128, valid ? v_src : v_rows, valid);
      k_src += kRowStep * p.k_row_stride;
      v_src += kRowStep * p.v_row_stride;
    }
    commit_copies();
  };
#pragma unroll
  for (int block = 0; block < kStages - 1; ++block) issue(block);

  const int head = blk.head + warp % kHeadsPerCta;
  const int warp_q0 = blk.q0 + 16 * (warp / kHeadsPerCta);
  const int row_lo = warp_q0 + g;  // this thread's rows: row_lo and row_lo + 8
  const unsigned q_address = shared_address(q_tile) + (warp >> 2) * 64 * 128;
  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_row[2] = {neg_inf(), neg_inf()}, l_row[2] = {0.0f, 0.0f};  // rows g, g + 8; log2 domain

  for (int block = 0; block < num_blocks; ++block) {
    wait_copies<kStages - 2>();
    fence_async_shared();
    __syncthreads();  // this block (and Q) landed for every thread; every warpgroup is done with the previous one
    issue(block + kStages - 1);  // into the previous block's stage
    const unsigned k_address = shared_address(kv_tiles + (block % kStages) * 2 * kTileBytes);
    const unsigned v_address = k_address + kTileBytes;

    float s[kKeyTiles][4];
    wgmma_define_operands(s);  // the first MMA overwrites S: nothing of the last block stays live
    wgmma_fence();
    // S = Q K^T over head_dim.
    wgmma_ss_k_major<T, kBlockK, kHeadDim>(s, q_address, kQAtomBytes, k_address, kKAtomBytes);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);

    // Scale, cap and mask; masks only where the warp's rows cross a band edge or the end.
    const int key0 = blk.key_start + block * kBlockK;
    const bool edge = key0 + kBlockK > blk.len_k || (blk.upper_bound && key0 + kBlockK - 1 > warp_q0 + blk.shift) ||
                      (p.window_left >= 0 && key0 < warp_q0 + 15 + blk.shift - p.window_left);
    scale_and_mask_scores<kSoftcap>(s, p, edge, row_lo, blk.shift, blk.len_k, key0 + 2 * c);
    online_softmax_step(s, m_row, l_row, o);
    // O += P V over the block's keys, 16 at a time; P's A fragments are S's accumulators. V is
    // N-major: 8 keys per 1024-byte atom row group, the next 64 columns one atom column on.
    unsigned pa[kBlockK / 16][4];
    pack_p_fragments<T>(s, pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) wgmma_rs<T, kHeadDim>(o, pa[kk], wgmma_descriptor(v_address + kk * 16 * 128, kKAtomBytes, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(o);
  }
  wait_copies<0>();  // no key block: Q's copies still land before the warp reuses their rows

  // Out through the warp's own 16 Q rows in shared memory (no MMA reads them any more), so each
  // store writes whole 128-byte rows: stored straight from the accumulators, a warp instruction
  // wrote 16-byte halves of 32-byte sectors, eight rows apart.
  unsigned char* const out_tile = q_tile + warp * 16 * 128;  // rows 16 warp .. 16 warp + 15
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    float m_nat, l, scale_o;
    finish_prefill_row(p, m_row, l_row, half, head, m_nat, l, scale_o);
    const float inv = row_inverse(l, scale_o);
    if (p.lse != nullptr && c == 0 && row_lo + 8 * half < blk.len_q) {
      p.lse[(blk.q_begin + row_lo + 8 * half) * p.lse_row_stride + head] = row_lse(m_nat, l);
    }
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      *reinterpret_cast<unsigned*>(out_tile + swizzle128_tile_offset(r, n, kQAtomBytes) + 4 * c) = pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
  }
  __syncwarp();
  T* const out_rows = static_cast<T*>(p.out) + (blk.q_begin + warp_q0) * p.out_row_stride + head * p.out_head_stride;
#pragma unroll
  for (int j = 0; j < 16 * kChunks / 32; ++j) {
    const int i = lane + 32 * j, r = i / kChunks, chunk = i % kChunks;
    if (warp_q0 + r < blk.len_q) {
      *reinterpret_cast<uint4*>(out_rows + r * p.out_row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(out_tile + swizzle128_tile_offset(r, chunk, kQAtomBytes));
    }
  }
}

}  // namespace kiln
