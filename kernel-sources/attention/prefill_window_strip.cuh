// Sliding-window prefill for windows of at most 129 keys (window_left <= 128) at head_dim 64 and
// GQA group 8 — GPT-OSS's sliding layers — on Hopper's warpgroup MMA (wgmma, sm_90a). A CTA walks
// a strip of positions of one KV head, eight positions a step, its two warpgroups taking the steps
// in turn. A step's 64 rows are the KV head's 8 query heads at those 8 positions, whose windows all
// lie in one band of 144 keys: the 136 keys of the 8 windows and, before them, one 8-key block no
// row sees, so that P V runs whole 16-key steps. So a step needs no online softmax: S = Q K^T is
// one m64n144 chain, the softmax one pass, O = P V nine m64n64k16 MMAs, and each row is finished
// and stored at once.
//
// K and V come once per strip, one 8-key block a step (the head-packing window kernel,
// prefill_wgmma_window.cuh, copies a whole band per CTA of 16 positions), by TMA into rings of
// kRingBlocks slots whose first kBandBlocks - 1 slots repeat after the last: a block that wraps is
// copied to both, so every band is one contiguous 144-row tile an MMA descriptor can walk. Q comes
// as one box of 8 heads x 8 positions (row 8 position + head). The warpgroups take the steps two
// at a time, one each, and copies come a pair of steps at a time on the pair's mbarrier (both
// steps' Q and new blocks): a step's band holds the previous step's new block, which the other
// warpgroup's barrier alone would not cover. Once both are done with a pair (a CTA barrier), the
// pair after next is copied into its Q buffers and its bands' first blocks. Out goes back through
// the step's Q buffer so that stores write whole rows.
//
// Measured on an H200 (GPT-OSS window 128 with sinks; bench/RESULTS.md, 2026-11-30): a CTA of one
// warpgroup (194 registers, 2 CTAs an SM) was latency-bound, its 8 warps an SM issuing in about a
// third of the cycles; copying three steps ahead instead of two, and the next step's Q K^T under
// the out, left it level. Two warpgroups of 128 registers fit the same two CTAs an SM.
//
// kPaged (mha_extend_with_kvcache): the steps move back by up to 7 rows so that every step's keys,
// and so every 8-key block, start on a multiple of 8. Caches whose pages TMA copies whole (pages of
// 8 rows or more packed one after the other, KilnPrefillParams::total_k > 0) come a block a box,
// each block in one page, its row read from the page table a pair of steps ahead; blocks wholly
// before the sequence or past its keys are copied from outside the tensor (TMA fills zeros), and
// the last step zeroes the V rows past the sequence's keys, which its rows do not see but whose
// garbage P V would multiply by 0. Other caches (pages under 8 rows, heads-first or gapped
// layouts) are gathered: every thread copies 16-byte chunks of K and V rows by cp.async, keys
// outside the sequence zero-filled, each a pair of steps after its page was read. An e4m3 cache
// (Cache = e4m3) is always gathered, through registers: each thread loads its 8-byte chunk a pair
// before it stores the chunk widened to T (exactly), and k_scale and v_scale join the scores'
// scale and the output's.
//
// Launch: grid (strips, Hkv, batch): strip x of a sequence takes steps [x L, x L + L), L =
// ceil(ceil((max_seqlen_q + (kPaged ? 7 : 0)) / 8) / strips); block kWindowStripThreads; dynamic
// shared memory kWindowStripSharedBytes. Tensor maps (KilnPrefillParams::tensor_maps): q boxes of
// 64 x 8 heads x 8 rows, k and v boxes of 64 x 1 x 8 rows. Causal, no soft cap.
#pragma once

#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "attention/window_strip.h"
#include "common/cp_async.cuh"
#include "common/prelude.cuh"
#include "common/shared_address.cuh"
#include "common/tma_sm90.cuh"
#include "common/vector_memory.cuh"
#include "common/warp_specialization_sm90.cuh"
#include "common/wgmma_sm90.cuh"

namespace kiln {

template <typename T, bool kPaged = false, typename Cache = T>
__global__ void __launch_bounds__(kWindowStripThreads, 2) prefill_window_strip(const __grid_constant__ KilnPrefillParams p) {
  constexpr bool kFp8 = SameType<Cache, e4m3>::value;
  static_assert(!kFp8 || kPaged, "e4m3 keys come from a paged cache");
  constexpr int kPositions = kWindowStripPositions, kBandBlocks = kWindowStripBandBlocks, kRingBlocks = kWindowStripRingBlocks;
  constexpr int kGroups = kWindowStripWarpgroups, kQBuffers = kWindowStripQBuffers, kPairs = kQBuffers / kGroups;
  constexpr int kQBytes = 64 * 128, kBlockBytes = 8 * 128, kRingBytes = (kRingBlocks + kBandBlocks - 1) * kBlockBytes;
  constexpr int kHeads = kWindowStripHeads, kKeyTiles = kBandBlocks, kDTiles = 8;
  // Step i + kQBuffers's new block takes block i's slots, whose last band is step i's.
  static_assert(kRingBlocks == kBandBlocks - 1 + kQBuffers && kGroups == 2 && kQBuffers % kGroups == 0, "pairs of steps");
  extern __shared__ unsigned char shared_raw[];
  unsigned char* const q_buffers = align_shared<1024>(shared_raw);  // [kQBuffers][64 rows][128 bytes]
  unsigned char* const k_ring = q_buffers + kQBuffers * kQBytes;
  unsigned char* const v_ring = k_ring + kRingBytes;
  const unsigned full_barriers = shared_address(v_ring + kRingBytes);  // [kPairs], 8 bytes each

  const int batch = blockIdx.z, kv_head = blockIdx.y;
  const int q_begin = p.cu_seqlens_q[batch], len_q = p.cu_seqlens_q[batch + 1] - q_begin;
  const int k_begin = kPaged ? 0 : p.cu_seqlens_k[batch];
  const int len_k = kPaged ? p.cache_seqlens[batch] : p.cu_seqlens_k[batch + 1] - k_begin;
  const int shift = len_k - len_q;                              // row i sits at key position i + shift: bottom-right aligned
  const bool page_boxes = !kPaged || (!kFp8 && p.total_k > 0);  // else every thread gathers key rows
  // Paged: step 0 starts at row -(shift mod 8), whose key position is a multiple of 8.
  const int row0 = kPaged ? -(shift & (kPositions - 1)) : 0, max_rows = p.max_seqlen_q + (kPaged ? kPositions - 1 : 0);
  const int strip_steps = ((max_rows + kPositions - 1) / kPositions + gridDim.x - 1) / gridDim.x;
  const int first_step = blockIdx.x * strip_steps;
  const int steps = min(first_step + strip_steps, (len_q - row0 + kPositions - 1) / kPositions) - first_step;
  if (steps <= 0) return;
  // Block j of the strip holds keys first_key + 8 j ..: step i's band is blocks i .. i + 17, keys
  // 136 before its first position's to 7 after (sequence-relative; before 0 they are the previous
  // sequence's or zeros, masked either way).
  const int first_key = first_step * kPositions + row0 + shift - 8 * (kBandBlocks - 1);
  // The row of block j's first key in the tensor the k and v maps describe (paged: the caches as
  // num_pages x page_size rows; blocks outside the sequence's keys come from row -8, all zeros).
  auto block_row = [&](int j) {
    const int key = first_key + 8 * j;
    if constexpr (kPaged) {
      if (key < 0 || key >= len_k) return -8;
      return p.page_table[batch * p.page_table_stride + (key >> p.page_shift)] * p.page_size + (key & (p.page_size - 1));
    } else {
      return k_begin + key;
    }
  };
  // Gathering: the page of key row r of block j, -1 outside the sequence's keys (zero-filled).
  auto gather_page = [&](int j, int r) {
    const int key = first_key + 8 * j + r;
    return key >= 0 && key < len_k ? p.page_table[batch * p.page_table_stride + (key >> p.page_shift)] : -1;
  };
  // Paged: what the next pair's copies need from the page table, read a pair early: with page
  // boxes (thread 0) the rows of its (at most two) new blocks; gathering, the page of this thread's
  // key row (thread t copies chunk t % 8 of row t % 64 / 8 of block t / 128, K or V by t / 64 % 2).
  int next_rows[2] = {0, 0};
  uint2 held = make_uint2(0, 0);  // e4m3: this thread's chunk of the next pair to issue, loaded a pair early
  auto read_rows = [&](int pair) {
    if constexpr (kPaged) {
      if (page_boxes) {
        for (int b = 0; b < 2; ++b) next_rows[b] = 2 * pair + b < steps ? block_row(2 * pair + b + kBandBlocks - 1) : 0;
      } else {
        next_rows[0] = gather_page(2 * pair + kBandBlocks - 1 + static_cast<int>(threadIdx.x) / 128, threadIdx.x % 64 / 8);
      }
    }
  };

  // Gathering, chunk n of a pair whose first new block is first_block: chunk n % 8 (8 values) of
  // row n % 64 / 8 of block first_block + n / 128, K or V by n / 64 % 2; a thread's chunks share
  // their row and step two blocks at a time. Its address in the cache (row of page `page`) and in
  // the ring, where a block past the first lap whose slot repeats is written twice.
  auto chunk_from = [&](int first_block, int n, int page) {
    const int j = first_block + n / 128, r = n % 64 / 8;
    const bool is_v = n / 64 % 2 != 0;
    const long long at_page = page >= 0 ? page * (is_v ? p.v_page_stride : p.k_page_stride) +
                                              ((first_key + 8 * j + r) & (p.page_size - 1)) * (is_v ? p.v_row_stride : p.k_row_stride)
                                        : 0;
    return static_cast<const Cache*>(is_v ? p.v : p.k) + at_page + kv_head * (is_v ? p.v_head_stride : p.k_head_stride) + n % 8 * 8;
  };
  auto chunk_to = [&](int first_block, int n) {
    const int slot = (first_block + n / 128) % kRingBlocks;
    return shared_address(n / 64 % 2 != 0 ? v_ring : k_ring) + slot * kBlockBytes + swizzle128_offset(n % 64 / 8, n % 8);
  };
  auto chunk_twice = [&](int first_block, int n) {
    const int j = first_block + n / 128;
    return j >= kRingBlocks && j % kRingBlocks < kBandBlocks - 1;
  };
  // 16-bit caches: the chunk by cp.async (zeros for page -1).
  auto copy_chunk = [&](int first_block, int n, int page) {
    const Cache* from = chunk_from(first_block, n, page);
    const unsigned to = chunk_to(first_block, n);
    copy16_async_or_zero(to, from, page >= 0);
    if (chunk_twice(first_block, n)) copy16_async_or_zero(to + kRingBlocks * kBlockBytes, from, page >= 0);
  };
  // e4m3 caches: the chunk's 8 bytes into registers (zeros for page -1), later widened to T
  // exactly and stored (k_scale and v_scale join the scores' scale and the output's).
  auto load_chunk = [&](int first_block, int n, int page) {
    return page >= 0 ? __ldg(reinterpret_cast<const uint2*>(chunk_from(first_block, n, page))) : make_uint2(0, 0);
  };
  auto store_widened = [&](int first_block, int n, uint2 raw) {
    const Bf16x8 v = e4m3x8_to_pairs<T>(raw.x, raw.y);
    const unsigned to = chunk_to(first_block, n);
    store16_shared(to, v);
    if (chunk_twice(first_block, n)) store16_shared(to + kRingBlocks * kBlockBytes, v);
  };

  if (threadIdx.x == 0) {
    for (int b = 0; b < kPairs; ++b) mbarrier_init(full_barriers + 8 * b, page_boxes ? 1 : kWindowStripThreads + 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  // The copies of steps 2 pair and 2 pair + 1: their Q rows and the blocks no earlier step read
  // (pair 0: step 0's whole band). A block past the first lap whose slot repeats is copied twice.
  // Thread 0 makes them all by TMA, or with gathered keys the Q boxes while every thread copies its
  // 16-byte chunks of K and V rows (pair 0: about ten a thread, later pairs one) and arrives on the
  // pair's barrier as they land.
  auto issue = [&](int pair) {
    const int i = 2 * pair;
    if (i >= steps) return;
    const unsigned barrier = full_barriers + 8 * (pair % kPairs);
    const int first_block = i == 0 ? 0 : i + kBandBlocks - 1, last_block = min(i + 1, steps - 1) + kBandBlocks - 1;
    const int q_boxes = min(2, steps - i);
    if constexpr (kPaged) {
      if (!page_boxes) {
        if (threadIdx.x == 0) {
          mbarrier_arrive_expect_tx(barrier, q_boxes * kQBytes);
          for (int b = 0; b < q_boxes; ++b) {
            tma_load_3d(shared_address(q_buffers + ((i + b) % kQBuffers) * kQBytes), &p.tensor_maps[kPrefillMapQ], barrier, 0,
                        kv_head * kHeads, q_begin + (first_step + i + b) * kPositions + row0);
          }
        }
        const int chunks = (last_block - first_block + 1) * 128;
        if (i > 0) {
          if (threadIdx.x < chunks) {
            if constexpr (kFp8) {
              store_widened(first_block, threadIdx.x, held);
            } else {
              copy_chunk(first_block, threadIdx.x, next_rows[0]);
            }
          }
        } else {
          // Pair 0 copies whole bands, about ten chunks a thread: every page (and e4m3 chunk) is
          // read before the first copy, so the reads are in flight together rather than one
          // after each copy.
          constexpr int kFirstChunks = ((kBandBlocks + 1) * 128 + kWindowStripThreads - 1) / kWindowStripThreads;
          int pages[kFirstChunks];
#pragma unroll
          for (int k = 0; k < kFirstChunks; ++k) {
            const int n = threadIdx.x + k * kWindowStripThreads;
            pages[k] = n < chunks ? gather_page(first_block + n / 128, n % 64 / 8) : -1;
          }
          if constexpr (kFp8) {
            uint2 raw[kFirstChunks];
#pragma unroll
            for (int k = 0; k < kFirstChunks; ++k) raw[k] = load_chunk(first_block, threadIdx.x + k * kWindowStripThreads, pages[k]);
#pragma unroll
            for (int k = 0; k < kFirstChunks; ++k) {
              const int n = threadIdx.x + k * kWindowStripThreads;
              if (n < chunks) store_widened(first_block, n, raw[k]);
            }
          } else {
#pragma unroll
            for (int k = 0; k < kFirstChunks; ++k) {
              const int n = threadIdx.x + k * kWindowStripThreads;
              if (n < chunks) copy_chunk(first_block, n, pages[k]);
            }
          }
        }
        if constexpr (kFp8) {
          fence_async_shared();  // the widened rows, stored through the generic proxy, before wgmma reads them
          mbarrier_arrive(barrier);
        } else {
          copies_arrive_on(barrier);
        }
        return;
      }
    }
    unsigned bytes = q_boxes * kQBytes;
    for (int j = first_block; j <= last_block; ++j) bytes += (j >= kRingBlocks && j % kRingBlocks < kBandBlocks - 1 ? 4 : 2) * kBlockBytes;
    mbarrier_arrive_expect_tx(barrier, bytes);
    for (int b = 0; b < q_boxes; ++b) {
      tma_load_3d(shared_address(q_buffers + ((i + b) % kQBuffers) * kQBytes), &p.tensor_maps[kPrefillMapQ], barrier, 0, kv_head * kHeads,
                  q_begin + (first_step + i + b) * kPositions + row0);
    }
    for (int j = first_block; j <= last_block; ++j) {
      const int row = kPaged && i > 0 ? (j == first_block ? next_rows[0] : next_rows[1]) : block_row(j), slot = j % kRingBlocks;
      const bool twice = j >= kRingBlocks && slot < kBandBlocks - 1;
      for (int copy = 0; copy < (twice ? 2 : 1); ++copy) {
        const unsigned at = (slot + copy * kRingBlocks) * kBlockBytes;
        tma_load_3d(shared_address(k_ring) + at, &p.tensor_maps[kPrefillMapK], barrier, 0, kv_head, row);
        tma_load_3d(shared_address(v_ring) + at, &p.tensor_maps[kPrefillMapV], barrier, 0, kv_head, row);
      }
    }
  };
  // e4m3: this thread's chunk of `pair` into `held`, from the page read_rows read for it.
  auto fetch_held = [&](int pair) { held = load_chunk(2 * pair + kBandBlocks - 1, threadIdx.x, next_rows[0]); };
  if (threadIdx.x == 0 || !page_boxes) {
    for (int pair = 0; pair < kPairs; ++pair) {
      if (pair > 0) {  // pair 0 reads its blocks' rows as it copies
        read_rows(pair);
        if constexpr (kFp8) fetch_held(pair);
      }
      issue(pair);
    }
    // Pages are read a pair before their copies; e4m3 chunks are loaded a pair before they are
    // stored, and their pages a pair before that.
    read_rows(kPairs);
    if constexpr (kFp8) {
      fetch_held(kPairs);
      read_rows(kPairs + 1);
    }
  }

  // Through a shuffle so ptxas knows the warp index is warp-uniform (see prefill_wgmma_ws.cuh).
  const int warp_in_cta = __shfl_sync(0xffffffffu, threadIdx.x >> 5, 0), lane = threadIdx.x & 31;
  const int group = warp_in_cta / 4, warp = warp_in_cta % 4, c = lane & 3;
  const int head = kv_head * kHeads + (lane >> 2);  // this thread's rows: that head at positions 2 warp + half
  const float scale = p.softmax_scale * 1.4426950408889634f * (kFp8 ? p.k_scale : 1.0f);
  const int window = p.window_left;
  const bool has_sink = p.sinks != nullptr;
  const float sink = has_sink ? p.sinks[head] : 0.0f;
  // Out is staged in the warp's own 16 rows of the step's Q buffer (its Q K^T is done by then):
  // stmatrix from lane l's row (l % 8 + 8 (l / 8 % 2)) at chunk n + l / 16 for n = 0, 2, 4, 6; then
  // lane l stores chunk l % 8 of rows l / 8 + 4 j (head l / 8 + 4 (j % 2), position 2 warp + j / 2)
  // as whole 128-byte rows.
  unsigned stage_at[kDTiles / 2], load_at[4];
#pragma unroll
  for (int k = 0; k < kDTiles / 2; ++k)
    stage_at[k] = warp * 16 * 128 + swizzle128_offset((lane & 7) + 8 * ((lane >> 3) & 1), 2 * k + (lane >> 4));
#pragma unroll
  for (int j = 0; j < 4; ++j) load_at[j] = warp * 16 * 128 + swizzle128_offset((lane >> 3) + 4 * j, lane & 7);
  T* const out_lane = static_cast<T*>(p.out) + static_cast<long long>(q_begin + 2 * warp) * p.out_row_stride +
                      (kv_head * kHeads + (lane >> 3)) * p.out_head_stride + (lane & 7) * 8;

  for (int pair = 0; 2 * pair < steps; ++pair) {
    mbarrier_wait(full_barriers + 8 * (pair % kPairs), (pair / kPairs) & 1);
    if (!page_boxes) fence_async_shared();  // rows cp.async wrote, before wgmma reads them
    const int i = 2 * pair + group;
    if (i < steps) {
      const unsigned q_tile = shared_address(q_buffers + (i % kQBuffers) * kQBytes);
      const unsigned band = (i % kRingBlocks) * kBlockBytes;
      const int i0 = (first_step + i) * kPositions + row0;  // the step's first row
      if constexpr (kPaged) {
        // The last step's last block runs past the sequence's keys: its rows there hold whatever
        // the page held, finite or not. Zeroed (whole 128-byte rows), then handed to the async proxy.
        const int valid = len_k - (i0 + shift);
        if (page_boxes && valid < 8) {  // gathered rows past the keys are zero-filled
          const int t = threadIdx.x % 128, r = t / 8;
          if (t < 64 && r >= valid) {
            *reinterpret_cast<uint4*>(v_ring + band + (kBandBlocks - 1) * kBlockBytes + r * 128 + (t % 8) * 16) = make_uint4(0, 0, 0, 0);
          }
          fence_async_shared();
          named_barrier_sync(1 + group, 128);
        }
      }

      float s[kKeyTiles][4];
      wgmma_define_operands(s);  // the first MMA overwrites S
      wgmma_fence();
      wgmma_ss_k_major<T, 8 * kKeyTiles, 64>(s, q_tile, kQBytes, shared_address(k_ring) + band, kRingBytes);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(s);

      // Row (position q, key k of the band) sees k when 0 <= q + 136 - k <= min(window, the row's key
      // position), q the row's position in the step. With the whole window behind every row of the
      // step (all but a sequence's first steps) that cuts only tiles 0-2 on the left (window >= 120)
      // and tile 17 on the right; the first steps and shorter windows test every score.
      if (window >= 120 && i0 + shift >= window) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int q = 2 * warp + half, lo = q + 8 * (kBandBlocks - 1) - window - 2 * c;  // first key seen, less 2c
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            s[0][2 * half + e] = neg_inf();
            s[1][2 * half + e] = 8 + e < lo ? neg_inf() : s[1][2 * half + e];
            s[2][2 * half + e] = 16 + e < lo ? neg_inf() : s[2][2 * half + e];
            s[kKeyTiles - 1][2 * half + e] = e > q - 2 * c ? neg_inf() : s[kKeyTiles - 1][2 * half + e];
          }
        }
      } else {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int q = 2 * warp + half;
          const unsigned seen = static_cast<unsigned>(max(min(window, i0 + q + shift) + 1, 0));  // distances 0 .. seen - 1
          const int near = q + 8 * (kBandBlocks - 1) - 2 * c;
#pragma unroll
          for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const bool hidden = static_cast<unsigned>(near - 8 * n - e) >= seen;
              s[n][2 * half + e] = hidden ? neg_inf() : s[n][2 * half + e];
            }
          }
        }
      }
      float m_row[2] = {neg_inf(), neg_inf()}, l_row[2] = {0.0f, 0.0f}, factor[2];
      online_softmax_probabilities<true>(s, m_row, l_row, scale, factor);

      // O = P V over the band, 16 keys at a time; V N-major, 16 keys 2048 bytes on.
      unsigned pa[kKeyTiles / 2][4];
      pack_p_fragments<T>(s, pa);
      float o[kDTiles][4];
      wgmma_define_operands(o);
      wgmma_fence();
      const unsigned long long v = wgmma_descriptor(shared_address(v_ring) + band, kRingBytes, 1024);
#pragma unroll
      for (int kk = 0; kk < kKeyTiles / 2; ++kk) wgmma_rs_n_major<T, 64>(o, pa[kk], wgmma_descriptor_advance(v, kk * 16 * 128), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(o);

      // Out, normalized, through the step's Q buffer; rows past the sequence are not stored.
      float inv[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float m_nat, l, scale_o;
        finish_row_with_sink(
            m_row, l_row, half, has_sink, [&] { return sink; }, m_nat, l, scale_o);
        inv[half] = row_inverse(l, scale_o) * (kFp8 ? p.v_scale : 1.0f);
        const int row = i0 + 2 * warp + half;
        if (p.lse != nullptr && c == 0 && (!kPaged || row >= 0) && row < len_q)
          p.lse[(q_begin + row) * p.lse_row_stride + head] = row_lse(m_nat, l);
      }
#pragma unroll
      for (int k = 0; k < kDTiles / 2; ++k) {
        const unsigned r[4] = {pack2<T>(o[2 * k][0] * inv[0], o[2 * k][1] * inv[0]), pack2<T>(o[2 * k][2] * inv[1], o[2 * k][3] * inv[1]),
                               pack2<T>(o[2 * k + 1][0] * inv[0], o[2 * k + 1][1] * inv[0]),
                               pack2<T>(o[2 * k + 1][2] * inv[1], o[2 * k + 1][3] * inv[1])};
        stmatrix_x4(q_tile + stage_at[k], r);
      }
      __syncwarp();
      T* const out_step = out_lane + static_cast<long long>(i0) * p.out_row_stride;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = i0 + 2 * warp + j / 2;
        if ((!kPaged || row >= 0) && row < len_q) {
          store16(out_step + (j / 2) * p.out_row_stride + (j % 2) * 4 * p.out_head_stride, load16_shared(q_tile + load_at[j]));
        }
      }
      fence_async_shared();  // the buffer was read and written through the generic proxy; TMA refills it next
    }
    __syncthreads();  // both steps of the pair are done: their Q buffers and first blocks take the pair after next
    if (threadIdx.x == 0 || !page_boxes) {
      issue(pair + kPairs);
      if constexpr (kFp8) fetch_held(pair + kPairs + 1);
      read_rows(pair + kPairs + 1 + (kFp8 ? 1 : 0));
    }
  }
}

}  // namespace kiln
