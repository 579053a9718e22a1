// Sliding-window prefill on Hopper's warpgroup MMA (wgmma, sm_90a). The CTA holds query heads of
// one KV head over few positions, like the mma.sync window kernel (prefill_mma.cuh): warp w
// owns 16 positions of head w % kHeadsPerCta. GPT-OSS (4 warps, 4 of the 8 heads of a KV head,
// 16 positions) has a band of 144 keys: three 48-key blocks starting at the band's first key,
// copied by TMA one block ahead (kStages = 2; one thread issues them: as cp.async every warp spent
// about 88 instructions per block on copies, and the kernel is instruction-bound). Per block the
// warpgroup computes S = Q K^T as one m64n48 MMA chain (both operands in shared memory, 128-byte
// swizzle), one online-softmax step, and O += P V with P from registers and V read N-major. Out
// goes through shared memory so that stores write whole rows.
//
// Measured on an H200 (GPT-OSS window 128 with sinks, S = 4096; bench/RESULTS.md): one 144-key
// block took 133 registers (S alone is 72) and ran 1 CTA per SM, 40% slower than 48-key blocks;
// two warpgroups per CTA (all 8 heads sharing K and V) fit 2 CTAs per SM and ran 10% slower than
// one warpgroup at 5 CTAs per SM (33 KB of shared memory each); 3 stages (45 KB: 4 CTAs per SM)
// ran 3% slower than 2.
// kPaged (mha_extend_with_kvcache over paged caches, pages of 8 rows or more): a CTA's positions
// move back so that its band starts on a multiple of 16 keys, and a block's K and V rows come as
// boxes of 16 rows (8 for pages of 8), each within one page, spread over the warps; caches whose
// pages TMA cannot copy whole come by cp.async from every thread. On an H200 GPT-OSS's window rows
// after a 4096-token prefix ran at 0.92x (pages of 64) and 0.91x (16) the contiguous kernel's
// speed, against 0.59x for the mma.sync kernel (bench/RESULTS.md).
// Launch: grid (ceil((max_seqlen_q + (kPaged ? 15 : 0)) / positions), Hq / kHeadsPerCta, batch),
// block 32 * kWarps, dynamic shared memory (16 kWarps + kStages x 2 x kBlockK) x head_dim x 2 +
// 1024 + 8 kStages bytes; KilnPrefillParams::tensor_maps holds q, k and v (boxes of 16 and kBlockK
// rows, paged min(page_size, 16); prefill_tensor_maps in src/kernels/prefill_kernel.cpp).
#pragma once

#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/cp_async.cuh"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"
#include "common/tma_sm90.cuh"
#include "common/wgmma_sm90.cuh"

namespace kiln {

// Zeroes rows [first, kTileRows) of a 128-byte-swizzled tile of kAtoms 64-column atoms
// (`atom_bytes` apart). Whole 128-byte rows, so the swizzle does not matter. Not inlined: it runs
// only where a band ends inside a block (for GPT-OSS's window of 128, whose 144-key bands are three
// whole blocks, at a sequence's first and last positions), and inlined, its per-thread index
// arithmetic was hoisted ahead of the key loop into every CTA (about 50 instructions a warp).
template <int kTileRows, int kAtoms>
__device__ __noinline__ void zero_rows_from(unsigned char* tile, int atom_bytes, int first, unsigned thread, unsigned threads) {
  for (unsigned i = thread; i < kTileRows * 8 * kAtoms; i += threads) {
    const unsigned chunk = i % 8, row = i / 8 % kTileRows, atom = i / (8 * kTileRows);
    if (static_cast<int>(row) >= first)
      *reinterpret_cast<uint4*>(tile + atom * atom_bytes + row * 128 + chunk * 16) = make_uint4(0, 0, 0, 0);
  }
}

// Registers for 5 CTAs of 4 warps per SM at head_dim 64 (84 used), 2 at head_dim 128; for 8-warp
// CTAs 2 and 1.
template <typename T, int kHeadDim, bool kSoftcap, int kWarps, int kHeadsPerCta, int kBlockK, int kStages, bool kPaged = false>
__global__ void __launch_bounds__(kWarps * 32, kWarps == 4 ? (kHeadDim == 64 ? 5 : 2) : (kHeadDim == 64 ? 2 : 1))
    prefill_wgmma_window(const __grid_constant__ KilnPrefillParams p) {
  static_assert(kWarps % 4 == 0 && kWarps % kHeadsPerCta == 0, "whole warpgroups; each head gets whole warps");
  static_assert(kBlockK % 16 == 0 && kBlockK * 128 % 1024 == 0 && kStages >= 2, "whole swizzle atoms");
  constexpr unsigned kThreads = kWarps * 32, kRows = kWarps * 16, kPositions = kRows / kHeadsPerCta;
  constexpr unsigned kChunks = kHeadDim / 8;  // 16-byte chunks per row
  constexpr int kQAtomBytes = kRows * 128, kKAtomBytes = kBlockK * 128, kTileBytes = kKAtomBytes * (kHeadDim / 64);
  constexpr int kKeyTiles = kBlockK / 8, kDTiles = kHeadDim / 8;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* const q_tile = align_shared<1024>(shared_raw);
  unsigned char* const kv_tiles = q_tile + kQAtomBytes * (kHeadDim / 64);              // [kStages][K | V]
  const unsigned full_barriers = shared_address(kv_tiles + kStages * 2 * kTileBytes);  // [kStages], 8 bytes each

  // Through a shuffle so ptxas knows the warp index is warp-uniform (see prefill_wgmma_ws.cuh).
  const int warp = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  // Paged keys: blocks start on 16-key boundaries (prefill_block_extent), so every box of
  // min(page_size, 16) rows lies in one page.
  const PrefillQueryBlock blk = prefill_query_block_in_order(p, kPositions, kHeadsPerCta, kPaged ? 16 : 1);
  if (blk.q0 >= blk.len_q) return;
  const int num_blocks = blk.key_end > blk.key_start ? (blk.key_end - blk.key_start + kBlockK - 1) / kBlockK : 0;
  // Paged caches TMA cannot copy as whole pages (params.h) come by cp.async from every thread.
  const bool page_boxes = !kPaged || p.total_k > 0;

  // Thread 0 alone copies, by TMA, kStages - 1 blocks ahead of the MMAs; block 0 brings Q too, and
  // each block completes on its stage's mbarrier. Q tile row 16 w + r is position
  // q0 + 16 (w / kHeadsPerCta) + r of head w % kHeadsPerCta: one box of 16 rows per warp. Rows past
  // the sequence arrive too (the next sequence's, or zeros past the tensor): their out rows are not
  // stored, and V rows past the band are zeroed before P V reads them (P is 0 there, and
  // 0 * garbage could be NaN).
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kStages; ++stage) mbarrier_init(full_barriers + 8 * stage, page_boxes ? 1 : kThreads + 1);
    mbarrier_init_fence();
  }
  // Paged boxes: box b, rows [16 b, 16 b + 16) of a block (page_size >= 16) or [8 b, 8 b + 8)
  // (page_size 8), is copied by lane b / kWarps of warp b % kWarps, which holds the pages of its rows
  // in the next two blocks to be issued, read ahead so that no copy waits on the page table (the
  // first two reads are in flight together). Spread over the warps, no warp issues more than two
  // boxes (a TMA copy takes uniform registers, so ptxas issues a warp's boxes one lane at a time),
  // and the warpgroup's MMAs no longer wait for one warp that issued them all: on an H200 GPT-OSS's
  // window rows after 4096 keys took 1.2% (pages of 64 and 16) and 3.7% (pages of 8) less than with
  // every box from warp 0 (bench/RESULTS.md).
  const int box_rows = kPaged ? min(p.page_size, 16) : kBlockK, boxes = kBlockK / box_rows;
  const int my_box = warp + kWarps * lane;  // this lane's box where < boxes
  auto page_of_block = [&](int block) {
    const int key = blk.key_start + block * kBlockK + my_box * box_rows;
    return my_box < boxes && block < num_blocks && key < blk.len_k ? p.page_table[blk.batch * p.page_table_stride + (key >> p.page_shift)]
                                                                   : 0;  // past the sequence: masked keys, zeroed V rows
  };
  const bool page_table_boxes = kPaged && page_boxes;
  int next_page = page_table_boxes ? page_of_block(0) : 0, page_after_next = page_table_boxes ? page_of_block(1) : 0;
  __syncthreads();
  auto issue_q = [&](unsigned barrier) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
#pragma unroll
      for (int atom = 0; atom < kHeadDim / 64; ++atom) {
        tma_load_3d(shared_address(q_tile) + atom * kQAtomBytes + w * 16 * 128, &p.tensor_maps[kPrefillMapQ], barrier, atom * 64,
                    blk.head + w % kHeadsPerCta, blk.q_begin + blk.q0 + 16 * (w / kHeadsPerCta));
      }
    }
  };
  auto issue = [&](int block) {
    if (block >= num_blocks) return;
    const unsigned barrier = full_barriers + 8 * (block % kStages);
    const unsigned k_tile = shared_address(kv_tiles + (block % kStages) * 2 * kTileBytes);
    const unsigned q_bytes = block == 0 ? kQAtomBytes * (kHeadDim / 64) : 0;
    if constexpr (kPaged) {
      if (!page_boxes) {  // every thread: its 16-byte chunks of K and V rows, arriving as they land
        if (threadIdx.x == 0) {
          mbarrier_arrive_expect_tx(barrier, q_bytes);
          if (block == 0) issue_q(barrier);
        }
        const T* k_head = static_cast<const T*>(p.k) + blk.kv_head * p.k_head_stride;
        const T* v_head = static_cast<const T*>(p.v) + blk.kv_head * p.v_head_stride;
        for (unsigned i = threadIdx.x; i < kBlockK * kChunks; i += kThreads) {
          const int r = static_cast<int>(i / kChunks), chunk = static_cast<int>(i % kChunks), key = blk.key_start + block * kBlockK + r;
          const bool valid = key < blk.len_k;
          const long long page = valid ? p.page_table[blk.batch * p.page_table_stride + (key >> p.page_shift)] : 0;
          const long long row = key & (p.page_size - 1);
          const unsigned at = swizzle128_tile_offset(r, chunk, kKAtomBytes);
          copy16_async_or_zero(k_tile + at, k_head + page * p.k_page_stride + row * p.k_row_stride + chunk * 8, valid);
          copy16_async_or_zero(k_tile + kTileBytes + at, v_head + page * p.v_page_stride + row * p.v_row_stride + chunk * 8, valid);
        }
        copies_arrive_on(barrier);
        return;
      }
      // Boxes of other warps may complete their bytes on the barrier before this arrival expects
      // them: the transaction count goes below zero, and the phase still needs the arrival.
      if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(barrier, 2 * kTileBytes + q_bytes);
        if (block == 0) issue_q(barrier);
      }
      if (my_box < boxes) {
        if (block > 0) fence_async_shared();  // the stage was last written through the generic proxy too (zeroed V rows)
        // The box's row in the caches seen as one tensor of num_pages x page_size rows.
        const int row = next_page * p.page_size + ((blk.key_start + block * kBlockK + my_box * box_rows) & (p.page_size - 1));
        const unsigned box = my_box * box_rows * 128;
#pragma unroll
        for (int atom = 0; atom < kHeadDim / 64; ++atom) {
          tma_load_3d(k_tile + atom * kKAtomBytes + box, &p.tensor_maps[kPrefillMapK], barrier, atom * 64, blk.kv_head, row);
          tma_load_3d(k_tile + kTileBytes + atom * kKAtomBytes + box, &p.tensor_maps[kPrefillMapV], barrier, atom * 64, blk.kv_head, row);
        }
      }
      next_page = page_after_next;
      page_after_next = page_of_block(block + 2);
    } else {
      if (threadIdx.x != 0) return;
      mbarrier_arrive_expect_tx(barrier, 2 * kTileBytes + q_bytes);
      if (block == 0) {
        issue_q(barrier);
      } else {
        fence_async_shared();  // the stage was last written through the generic proxy too (zeroed V rows)
      }
      const int first_key = blk.k_begin + blk.key_start + block * kBlockK;
#pragma unroll
      for (int atom = 0; atom < kHeadDim / 64; ++atom) {
        tma_load_3d(k_tile + atom * kKAtomBytes, &p.tensor_maps[kPrefillMapK], barrier, atom * 64, blk.kv_head, first_key);
        tma_load_3d(k_tile + kTileBytes + atom * kKAtomBytes, &p.tensor_maps[kPrefillMapV], barrier, atom * 64, blk.kv_head, first_key);
      }
    }
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
    __syncthreads();  // every warp is done with the previous block, whose stage thread 0 refills now
    issue(block + kStages - 1);
    mbarrier_wait(full_barriers + 8 * (block % kStages), (block / kStages) & 1);
    if (!page_boxes) fence_async_shared();  // rows cp.async wrote, before wgmma reads them
    unsigned char* const v_tile = kv_tiles + (block % kStages) * 2 * kTileBytes + kTileBytes;
    const unsigned k_address = shared_address(v_tile - kTileBytes), v_address = k_address + kTileBytes;
    const int key0 = blk.key_start + block * kBlockK;
    const bool past_band = key0 + kBlockK > blk.key_end;  // CTA-uniform
    if (past_band) zero_rows_from<kBlockK, kHeadDim / 64>(v_tile, kKAtomBytes, blk.key_end - key0, threadIdx.x, kThreads);

    float s[kKeyTiles][4];
    wgmma_define_operands(s);  // the first MMA overwrites S: nothing of the last block stays live
    wgmma_fence();
    // S = Q K^T over head_dim.
    wgmma_ss_k_major<T, kBlockK, kHeadDim>(s, q_address, kQAtomBytes, k_address, kKAtomBytes);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(s);

    // Cap and mask (the scale joins the softmax's exp2); masks only where the warp's rows cross a
    // band edge or the end.
    const bool edge = key0 + kBlockK > blk.len_k || (blk.upper_bound && key0 + kBlockK - 1 > warp_q0 + blk.shift) ||
                      (p.window_left >= 0 && key0 < warp_q0 + 15 + blk.shift - p.window_left);
    cap_and_mask_scores<kSoftcap, true>(s, p, edge, row_lo, blk.shift, blk.len_k, key0 + 2 * c);
    online_softmax_step<true, true>(s, m_row, l_row, o, pending_logit_scale<kSoftcap>(p), block == 0);
    // O += P V over the block's keys, 16 at a time; P's A fragments are S's accumulators. V is
    // N-major: 8 keys per 1024-byte atom row group, the next 64 columns one atom column on.
    unsigned pa[kBlockK / 16][4];
    pack_p_fragments<T>(s, pa);
    if (past_band) {  // the zeroed V rows, written through the generic proxy, before any warp's P V
      fence_async_shared();
      __syncthreads();
    }
    wgmma_fence();
    wgmma_rs_pv<T, kHeadDim, kBlockK>(o, pa, wgmma_descriptor(v_address, kKAtomBytes, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(o);
  }

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
    if (p.lse != nullptr && c == 0 && (!kPaged || row_lo + 8 * half >= 0) && row_lo + 8 * half < blk.len_q) {
      p.lse[(blk.q_begin + row_lo + 8 * half) * p.lse_row_stride + head] = row_lse(m_nat, l);
    }
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      *reinterpret_cast<unsigned*>(out_tile + swizzle128_tile_offset(r, n, kQAtomBytes) + 4 * c) =
          pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
  }
  __syncwarp();
  T* const out_rows = static_cast<T*>(p.out) + (blk.q_begin + warp_q0) * p.out_row_stride + head * p.out_head_stride;
#pragma unroll
  for (unsigned j = 0; j < 16 * kChunks / 32; ++j) {
    const unsigned i = lane + 32 * j, r = i / kChunks, chunk = i % kChunks;
    if ((!kPaged || warp_q0 + static_cast<int>(r) >= 0) && warp_q0 + static_cast<int>(r) < blk.len_q) {  // paged: q0 may be < 0
      *reinterpret_cast<uint4*>(out_rows + r * p.out_row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(out_tile + swizzle128_tile_offset(r, chunk, kQAtomBytes));
    }
  }
}

}  // namespace kiln
