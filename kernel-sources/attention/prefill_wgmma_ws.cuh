// Prefill and extend attention on Hopper (sm_90a) with warp specialization, FlashAttention-3's
// structure. Warpgroup 0 is the producer: it gives most of its registers to the others and fills
// two rings of shared-memory stages, K and V, each stage guarded by a full and an empty mbarrier.
// Q, contiguous K and V (prefill), and paged K and V (extend) whose pages are whole TMA boxes come
// by TMA (a box per page, from up to four producer warps); other paged caches (pages under 8 rows,
// or not packed) by cp.async from all 128 producer threads, each row finding its page through
// shuffles of the block's page-table entries, the copies arriving on the full barrier as they land.
//
// Warpgroups 1 .. kConsumers each own 64 query rows and walk the CTA's key blocks (128 keys; 176
// for contiguous keys at head_dim 128; 80 at 256, 64 for paged keys). Per block j a consumer
// issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} together, then runs block j's softmax while P V is
// still on the tensor cores, and rescales O once it lands: the exp2 work of one block hides under
// the MMAs of the previous one. The consumers take turns to issue (named barriers, in a cycle), so
// one's softmax overlaps the others' MMAs. A stage is released by each consumer warp as soon as
// its MMA has read it, K before V. Key blocks wholly outside the causal or window band are skipped
// (by each consumer for its own 64 rows at the causal end), only edge blocks are masked; query
// blocks are visited last-first so the longest start first.
//
// An e4m3 cache (Cache = e4m3, head_dim 64 and 128, no soft cap) comes through two staging slots in
// shared memory, a block ahead: by TMA (a box a page, rows as stored) where pages are whole boxes,
// else by each producer thread's cp.async of its own 8-byte chunks. The producer threads widen
// them to T exactly into the stage and arrive on the full barrier after a proxy fence; k_scale
// joins the scores' scale and v_scale the output's.
//
// Keys past the sequence inside its last block arrive by TMA from the next sequence (or as zeros
// past the tensor). Their scores are masked, but P V would multiply their V rows by P's zeros, and
// 0 x inf is NaN: that block's V lands on a barrier of its own, the producer warp zeroes the rows,
// then completes the stage's full barrier itself.
//
// Launch: grid (ceil(max_seqlen_q / kBlockQ), Hq, batch), block 128 (kConsumers + 1) threads;
// dynamic shared memory (kBlockQ + 2 kStages x kBlockK) x head_dim x 2 + 1024 + 8 (2 + 4 kStages)
// bytes, with an e4m3 cache 4 x kBlockK x head_dim + 16 more; KilnPrefillParams::tensor_maps
// holds q (boxes of 64 rows), k and v (kBlockK rows, or for paged caches min(page_size, 128); an
// e4m3 cache's rows as 16-bit pairs, unswizzled).
#pragma once

#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/cp_async.cuh"
#include "common/prelude.cuh"
#include "common/tma_sm90.cuh"
#include "common/vector_memory.cuh"
#include "common/warp_specialization_sm90.cuh"
#include "common/wgmma_sm90.cuh"

namespace kiln {

// The kernel's shape per head dimension; the host's launch rule (src/kernels/prefill_kernel.cpp)
// mirrors it. At head_dim 64 three consumers give more rows per K and V tile where the MMAs are
// short; at 128 and 256, two fit their 64-row accumulators with room for S and P.
template <int kHeadDim, bool kPaged, bool kFp8 = false>
struct PrefillWsShape {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim 64, 128 or 256");
  enum : int {
    kConsumers = kHeadDim == 64 ? 3 : 2,
    kThreads = 128 * (kConsumers + 1),
    kBlockQ = 64 * kConsumers,
    // Contiguous keys at head_dim 128 come 176 to a block, FlashAttention-3's choice: more MMA
    // per softmax step within the consumers' 232 registers (S 88, P 44, O 64). At 256, O takes
    // 128 registers; 80 keys a block (S 40, P 20; FlashAttention-3's choice, 2-3% faster than 64 on
    // an H200) keep Q's 64 KB and two stages of K and V in shared memory with 1 KB to spare, and
    // paged keys, whose blocks are powers of two, take 64.
    kBlockK = kHeadDim == 256              ? (kPaged ? 64 : 80)
              : kHeadDim == 128 && !kPaged ? 176
                                           : 128,
    // At head_dim 128, 3 stages ran contiguous keys no faster than 2 (bench/RESULTS.md); paged keys
    // take 3, chosen for the cp.async producer and not measured apart since the page boxes; an
    // e4m3 cache 2, its staging area taking the third's room.
    kStages = kHeadDim == 64                       ? 4
              : kPaged && kHeadDim == 128 && !kFp8 ? 3
                                                   : 2,
    kLog2BlockK = kBlockK == 64 ? 6 : 7,  // log2 of a paged block's keys (64 or 128; unused otherwise)
    // The entry count is 65536 / kThreads (168 and 128): 40 + 2 x 232 <= 3 x 168, 32 + 3 x 160 <= 4 x 128.
    kProducerRegisters = kHeadDim == 64 ? 32 : 40,
    kConsumerRegisters = kHeadDim == 64 ? 160 : 232,
  };
};

// The page-table entries of one key block, spread over a warp: lane l holds entry
// first_page + l + 32 e in page[e] (a block of one-row pages needs kBlockK of them), so a row's
// page costs shuffles instead of a dependent global load. Entries past the sequence's last page
// read as page 0 (their rows are zero-filled, not read).
template <int kBlockK>
struct WarpBlockPages {
  enum : int { kEntries = kBlockK / 32 };
  int page[kEntries];
  int first_page;
  __device__ __forceinline__ void load(const KilnPrefillParams& p, const PrefillQueryBlock& blk, int block, int lane) {
    first_page = (block * kBlockK) >> p.page_shift;
    const int last_page = (blk.len_k - 1) >> p.page_shift, entries = ((kBlockK - 1) >> p.page_shift) + 1;
    const int* table = p.page_table + blk.batch * p.page_table_stride + first_page;
#pragma unroll
    for (int e = 0; e < kEntries; ++e) {
      const int at = lane + 32 * e;
      page[e] = at < entries && first_page + at <= last_page ? table[at] : 0;
    }
  }
  // Every lane of the warp calls it (shuffles), each with its own key of the block.
  __device__ __forceinline__ int of(const KilnPrefillParams& p, int key) const {
    const int local = (key >> p.page_shift) - first_page;
    // At most 32 pages a block (kBlockK >> page_shift <= 32; kBlockK is 64 or 128).
    if (p.page_shift >= (kBlockK == 64 ? 1 : 2)) return __shfl_sync(0xffffffffu, page[0], local);
    int result = 0;
#pragma unroll
    for (int e = 0; e < kEntries; ++e) {
      const int value = __shfl_sync(0xffffffffu, page[e], local & 31);
      if ((local >> 5) == e) result = value;
    }
    return result;
  }
};

template <typename T, int kHeadDim, bool kSoftcap, bool kPaged = false, typename Cache = T>
__global__ void __launch_bounds__(PrefillWsShape<kHeadDim, kPaged, SameType<Cache, e4m3>::value>::kThreads, 1)
    prefill_wgmma_ws(const __grid_constant__ KilnPrefillParams p) {
  constexpr bool kFp8 = SameType<Cache, e4m3>::value;
  static_assert(!kFp8 || (kPaged && kHeadDim <= 128 && !kSoftcap), "e4m3 keys: paged, head_dim 64 or 128, no soft cap");
  using Shape = PrefillWsShape<kHeadDim, kPaged, kFp8>;
  enum : int {
    kConsumers = Shape::kConsumers,
    kBlockQ = Shape::kBlockQ,
    kBlockK = Shape::kBlockK,
    kStages = Shape::kStages,
    kAtoms = kHeadDim / 64,  // 64-column swizzle-atom columns per row
    kQAtomBytes = kBlockQ * 128,
    kKAtomBytes = kBlockK * 128,
    kTileBytes = kKAtomBytes * kAtoms,
    kKeyTiles = kBlockK / 8,
    kDTiles = kHeadDim / 8,
    kChunks = kHeadDim / 8,                        // 16-byte chunks per row
    kProducerThreads = 128,                        // paged: all of warpgroup 0 copies
    kTurnBarrier = 1,                              // named barriers kTurnBarrier + consumer: that consumer's turn to issue
    kProducerBarrier = kTurnBarrier + kConsumers,  // the producer warpgroup's (e4m3 page boxes)
    kStagingBytes = 2 * kBlockK * kHeadDim,        // e4m3: a staging slot, K's bytes then V's
  };
  extern __shared__ unsigned char shared_raw[];
  unsigned char* const q_tile = align_shared<1024>(shared_raw);
  unsigned char* const k_tiles = q_tile + kQAtomBytes * kAtoms;   // [kStages]
  unsigned char* const v_tiles = k_tiles + kStages * kTileBytes;  // [kStages]
  // With an e4m3 cache two staging slots of a K and a V tile's bytes (kStagingBytes each), then
  // the mbarriers: Q's, the partial V block's, per stage K full, K empty, V full, V empty, and
  // with an e4m3 cache each staging slot's full.
  const unsigned staging = shared_address(v_tiles + kStages * kTileBytes);
  const unsigned barriers = staging + (kFp8 ? 2 * kStagingBytes : 0);
  const unsigned q_full = barriers, tail_full = barriers + 8;
  auto k_full = [&](int stage) { return barriers + 16 + 32 * stage; };
  auto k_empty = [&](int stage) { return barriers + 24 + 32 * stage; };
  auto v_full = [&](int stage) { return barriers + 32 + 32 * stage; };
  auto v_empty = [&](int stage) { return barriers + 40 + 32 * stage; };
  auto staging_full = [&](int slot) { return barriers + 16 + 32 * kStages + 8 * slot; };

  // Through a shuffle so ptxas knows the warpgroup index is warp-uniform: with a plain
  // threadIdx.x / 128 it treats a warpgroup's branches as divergent and serializes their wgmmas.
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  const PrefillQueryBlock blk = prefill_query_block(p, kBlockQ);
  if (blk.q0 >= blk.len_q) return;
  const int block_start = blk.key_start / kBlockK;
  const int block_end = blk.key_end > blk.key_start ? (blk.key_end + kBlockK - 1) / kBlockK : block_start;
  const int num_blocks = block_end - block_start;
  const bool page_boxes = kPaged && p.total_k > 0;  // paged keys TMA copies a page at a time (params.h)
  // Warps that issue the TMA copies of K and V, 2^tma_issuer_shift: one per 4 copies a tile takes
  // (paged keys: a box per page and 64 columns), up to the producer's four. A TMA takes its
  // operands in uniform registers, so a warp issues its lanes' boxes one after another: at head_dim
  // 128 and page 16 (16 copies a tile) one warp spent nearly all its time issuing and the consumers
  // waited for K (ncu); warps with nothing to issue would only take issue slots from the consumers.
  static_assert(!kPaged || kBlockK == 1 << Shape::kLog2BlockK, "paged tiles are 2^6 or 2^7 keys");
  // log2 of the copies a tile takes: (kBlockK >> page_shift) boxes a 64-column atom, and kAtoms / 2
  // is log2(kAtoms) for 1, 2 and 4 atoms (an e4m3 row, at most 128 bytes, is one box).
  const int tma_issuer_shift =
      page_boxes ? max(0, min(2, Shape::kLog2BlockK - min(p.page_shift, Shape::kLog2BlockK) + (kFp8 ? 0 : kAtoms / 2) - 2)) : 0;
  const int tma_issuers = 1 << tma_issuer_shift;

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    mbarrier_init(tail_full, tma_issuers);
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(k_full(stage), kPaged && (kFp8 || !page_boxes) ? kProducerThreads : tma_issuers);
      mbarrier_init(v_full(stage), kPaged && (kFp8 || !page_boxes) ? kProducerThreads : tma_issuers);
      mbarrier_init(k_empty(stage), 4 * kConsumers);  // one arrival per consumer warp
      mbarrier_init(v_empty(stage), 4 * kConsumers);
    }
    if (kFp8) {
      mbarrier_init(staging_full(0), tma_issuers);
      mbarrier_init(staging_full(1), tma_issuers);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // The producer.
    warpgroup_registers_release<Shape::kProducerRegisters>();
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(q_full, kQAtomBytes * kAtoms);
#pragma unroll
      for (int consumer = 0; consumer < kConsumers; ++consumer) {
#pragma unroll
        for (int atom = 0; atom < kAtoms; ++atom) {
          tma_load_3d(shared_address(q_tile) + atom * kQAtomBytes + consumer * 64 * 128, &p.tensor_maps[kPrefillMapQ], q_full, atom * 64,
                      blk.head, blk.q_begin + blk.q0 + 64 * consumer);
        }
      }
    }
    if constexpr (kFp8) {
      if (page_boxes) {
        // e4m3 pages TMA copies whole: block i's K and V rows (a box a page, rows as stored) land
        // in staging slot i % 2, and every producer thread widens their 16-byte chunks into the
        // stages (zeros past the sequence); once a block's V is widened, a producer barrier frees
        // its slot for block i + 2.
        enum : int { kRowChunks = kHeadDim / 16, kWidenSteps = kBlockK * kRowChunks / kProducerThreads };
        const int issuer = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const bool issuing_warp = issuer < tma_issuers;
        const int box_rows = min(p.page_size, kBlockK);
        WarpBlockPages<kBlockK> pages;
        auto stage_boxes = [&](int i) {
          const int key0 = (block_start + i) * kBlockK;
          const int boxes = min(kBlockK / box_rows, ((blk.len_k - 1) >> p.page_shift) - (key0 >> p.page_shift) + 1);
          const int issued_boxes = boxes > issuer ? ((boxes - 1 - issuer) >> tma_issuer_shift) + 1 : 0;  // by this warp
          const unsigned slot = staging + (i & 1) * kStagingBytes, full = staging_full(i & 1);
          if (lane == 0) mbarrier_arrive_expect_tx(full, 2 * issued_boxes * box_rows * kHeadDim);
          __syncwarp();
          if (lane < boxes && (lane & (tma_issuers - 1)) == issuer) {
            const int row = pages.page[0] * p.page_size + (key0 & (p.page_size - 1));
            tma_load_3d(slot + lane * box_rows * kHeadDim, &p.tensor_maps[kPrefillMapK], full, 0, blk.kv_head, row);
            tma_load_3d(slot + kStagingBytes / 2 + lane * box_rows * kHeadDim, &p.tensor_maps[kPrefillMapV], full, 0, blk.kv_head, row);
          }
        };
        // A tile's rows from `from` (kHeadDim bytes each) widened into the stage at `tile`, rows
        // from `valid_rows` on as zeros, then the proxy fence and this thread's arrival on `full`.
        auto widen_rows = [&](unsigned from, unsigned tile, unsigned full, int valid_rows) {
#pragma unroll 2
          for (int j = 0; j < kWidenSteps; ++j) {
            const int n = threadIdx.x + kProducerThreads * j, r = n / kRowChunks, c = n % kRowChunks;
            unsigned raw[4];
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(raw[0]), "=r"(raw[1]), "=r"(raw[2]), "=r"(raw[3])
                         : "r"(from + 16 * n));
            Bf16x8 v[2];
#pragma unroll
            for (int w = 0; w < 8; ++w) {
              v[w / 4].w[w % 4] = r < valid_rows ? e4m3x2_to_pair<T>(static_cast<unsigned short>(raw[w / 2] >> (16 * (w % 2)))) : 0u;
            }
            store16_shared(tile + swizzle128_tile_offset(r, 2 * c, kKAtomBytes), v[0]);
            store16_shared(tile + swizzle128_tile_offset(r, 2 * c + 1, kKAtomBytes), v[1]);
          }
          fence_async_shared();
          mbarrier_arrive(full);
        };
        // Block i + 1's K is widened before block i's V: its stage frees as soon as the consumers'
        // Q K^T of block i - 1 has read it, V's only once their P V of block i - 2 has, so the
        // consumers' next Q K^T need not wait for this block's V.
        if (issuing_warp && num_blocks > 0) {
          pages.load(p, blk, block_start, lane);
          stage_boxes(0);
          if (num_blocks > 1) {
            pages.load(p, blk, block_start + 1, lane);
            stage_boxes(1);
            if (num_blocks > 2) pages.load(p, blk, block_start + 2, lane);
          }
        }
        auto widen_k = [&](int i) {
          mbarrier_wait(staging_full(i & 1), (i >> 1) & 1);
          mbarrier_wait(k_empty(i % kStages), ((i / kStages) & 1) ^ 1);
          widen_rows(staging + (i & 1) * kStagingBytes, shared_address(k_tiles + (i % kStages) * kTileBytes), k_full(i % kStages),
                     blk.len_k - (block_start + i) * kBlockK);
        };
        if (num_blocks > 0) widen_k(0);
        for (int i = 0; i < num_blocks; ++i) {
          if (i + 1 < num_blocks) widen_k(i + 1);
          mbarrier_wait(v_empty(i % kStages), ((i / kStages) & 1) ^ 1);
          widen_rows(staging + (i & 1) * kStagingBytes + kStagingBytes / 2, shared_address(v_tiles + (i % kStages) * kTileBytes),
                     v_full(i % kStages), blk.len_k - (block_start + i) * kBlockK);
          named_barrier_sync(kProducerBarrier, kProducerThreads);  // slot i % 2 read: block i + 2 may land there
          if (issuing_warp && i + 2 < num_blocks) {
            stage_boxes(i + 2);
            if (i + 3 < num_blocks) pages.load(p, blk, block_start + i + 3, lane);
          }
        }
        return;
      }
      // e4m3 pages TMA cannot copy: each thread copies chunk `chunk` of rows row0 + j kRowStep (8
      // bytes, K and V of a row together; zeros past the sequence) into its own 8-byte slots of a
      // staging slot by cp.async, block i + 1's while block i's are widened into the stage. A
      // thread reads only the staging it copied, so its own cp.async wait orders them.
      enum : int { kRowStep = kProducerThreads / kChunks, kCopies = kBlockK / kRowStep };
      static_assert(2 * kCopies * kProducerThreads * 8 == kStagingBytes, "a staging slot holds a thread's copies of a block");
      const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks, lane = threadIdx.x & 31;
      const unsigned copy_offset = swizzle128_tile_offset(row0, chunk, kKAtomBytes);
      static_assert(kRowStep % 8 == 0, "copy steps of whole swizzle groups");
      const Cache* k_thread = static_cast<const Cache*>(p.k) + blk.kv_head * p.k_head_stride + chunk * 8;
      const Cache* v_thread = static_cast<const Cache*>(p.v) + blk.kv_head * p.v_head_stride + chunk * 8;
      // Copy j of K in a slot at j * 1024 + 8 threadIdx.x, of V kCopies * 1024 further.
      const unsigned own_staging = staging + 8 * threadIdx.x;
      WarpBlockPages<kBlockK> pages;
      auto stage_copies = [&](int i) {
        const unsigned slot = own_staging + (i & 1) * kStagingBytes;
        const int first = (block_start + i) * kBlockK + row0;
#pragma unroll 4
        for (int j = 0; j < kCopies; ++j) {
          const int key = first + j * kRowStep;
          const long long page = pages.of(p, key), row = key & (p.page_size - 1);
          const bool valid = key < blk.len_k;
          copy8_async_or_zero(slot + j * 1024, k_thread + page * p.k_page_stride + row * p.k_row_stride, valid);
          copy8_async_or_zero(slot + (kCopies + j) * 1024, v_thread + page * p.v_page_stride + row * p.v_row_stride, valid);
        }
        commit_copies();
      };
      // Copies `from` .. + kCopies of a slot widened into the tile at `tile`, then a fence for the
      // async proxy (wgmma reads them) and this thread's arrival on `full`.
      auto widen = [&](unsigned from, unsigned tile, unsigned full) {
#pragma unroll 4
        for (int j = 0; j < kCopies; ++j) {
          unsigned raw[2];
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(raw[0]), "=r"(raw[1]) : "r"(from + j * 1024));
          store16_shared(tile + j * kRowStep * 128, e4m3x8_to_pairs<T>(raw[0], raw[1]));
        }
        fence_async_shared();
        mbarrier_arrive(full);
      };
      if (num_blocks > 0) {
        pages.load(p, blk, block_start, lane);
        stage_copies(0);
      }
      if (num_blocks > 1) pages.load(p, blk, block_start + 1, lane);
      for (int i = 0; i < num_blocks; ++i) {
        const int stage = i % kStages;
        const unsigned phase = (i / kStages) & 1;
        if (i + 1 < num_blocks) {
          stage_copies(i + 1);
          if (i + 2 < num_blocks) pages.load(p, blk, block_start + i + 2, lane);
          wait_copies<1>();  // block i's
        } else {
          wait_copies<0>();
        }
        const unsigned slot = own_staging + (i & 1) * kStagingBytes;
        mbarrier_wait(k_empty(stage), phase ^ 1);
        widen(slot, shared_address(k_tiles + stage * kTileBytes) + copy_offset, k_full(stage));
        mbarrier_wait(v_empty(stage), phase ^ 1);
        widen(slot + kCopies * 1024, shared_address(v_tiles + stage * kTileBytes) + copy_offset, v_full(stage));
      }
    } else if (kPaged && !page_boxes) {
      // Pages TMA cannot copy: each thread copies chunk `chunk` of rows row0 + j kRowStep, K and V
      // of a row together. Rows past the sequence are zero-filled. The next block's page-table
      // entries load while this block copies.
      enum : int { kRowStep = kProducerThreads / kChunks, kCopies = kBlockK / kRowStep };
      const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks, lane = threadIdx.x & 31;
      const unsigned copy_offset = swizzle128_tile_offset(row0, chunk, kKAtomBytes);
      // Row j's offset from row0's: a multiple of 8 rows keeps the swizzle, so it moves by whole
      // rows; at head_dim 256 (4 rows a step) odd j sit in the other half of an 8-row group.
      static_assert(kRowStep % 8 == 0 || kRowStep == 4, "copy steps of whole or half swizzle groups");
      const unsigned odd_delta = swizzle128_tile_offset(row0 + 4, chunk, kKAtomBytes) - copy_offset;
      auto row_delta = [&](int j) -> unsigned {
        if (kRowStep % 8 == 0) return j * kRowStep * 128;
        return ((j & 1) ? odd_delta : 0u) + (j >> 1) * 8 * 128;
      };
      const T* k_thread = static_cast<const T*>(p.k) + blk.kv_head * p.k_head_stride + chunk * 8;
      const T* v_thread = static_cast<const T*>(p.v) + blk.kv_head * p.v_head_stride + chunk * 8;
      WarpBlockPages<kBlockK> pages, next_pages;
      pages.load(p, blk, block_start, lane);
      for (int i = 0; i < num_blocks; ++i) {
        const int stage = i % kStages;
        const unsigned phase = (i / kStages) & 1;
        const int first = (block_start + i) * kBlockK + row0;
        if (i + 1 < num_blocks) next_pages.load(p, blk, block_start + i + 1, lane);
        mbarrier_wait(k_empty(stage), phase ^ 1);
        mbarrier_wait(v_empty(stage), phase ^ 1);
        const unsigned k_tile = shared_address(k_tiles + stage * kTileBytes) + copy_offset;
        const unsigned v_tile = shared_address(v_tiles + stage * kTileBytes) + copy_offset;
#pragma unroll 4
        for (int j = 0; j < kCopies; ++j) {
          const int key = first + j * kRowStep;
          const long long page = pages.of(p, key), row = key & (p.page_size - 1);
          const bool valid = key < blk.len_k;
          copy16_async_or_zero(k_tile + row_delta(j), k_thread + page * p.k_page_stride + row * p.k_row_stride, valid);
          copy16_async_or_zero(v_tile + row_delta(j), v_thread + page * p.v_page_stride + row * p.v_row_stride, valid);
        }
        copies_arrive_on(k_full(stage));
        copies_arrive_on(v_full(stage));
        pages = next_pages;
      }
      wait_copies<0>();
    } else {
      // By TMA: a tile of contiguous keys is one box per 64 columns; a tile of paged keys one per
      // page (lane l's page l of the block, up to the sequence's last), lane l of warp
      // l % tma_issuers issuing it. Each issuing warp waits for the stage to empty and arms the
      // full barrier with its own boxes' bytes (an arrival each: tma_issuers of them a phase).
      const int issuer = threadIdx.x >> 5, lane = threadIdx.x & 31;
      if (issuer >= tma_issuers) return;
      WarpBlockPages<kBlockK> pages, next_pages;
      if (kPaged) pages.load(p, blk, block_start, lane);
      const int box_rows = kPaged ? min(p.page_size, kBlockK) : kBlockK;
      for (int i = 0; i < num_blocks; ++i) {
        const int stage = i % kStages;
        const unsigned phase = (i / kStages) & 1;
        const int key0 = (block_start + i) * kBlockK;
        if (kPaged && i + 1 < num_blocks) next_pages.load(p, blk, block_start + i + 1, lane);
        const int boxes = kPaged ? min(kBlockK / box_rows, ((blk.len_k - 1) >> p.page_shift) - (key0 >> p.page_shift) + 1) : 1;
        const bool issues = lane < boxes && (lane & (tma_issuers - 1)) == issuer;
        const int issued_boxes = boxes > issuer ? ((boxes - 1 - issuer) >> tma_issuer_shift) + 1 : 0;  // by this warp
        const unsigned bytes = issued_boxes * box_rows * 128 * kAtoms;
        auto copy_tile = [&](unsigned tile, const KilnTensorMap* map, unsigned barrier) {
          if (!issues) return;
          // Key row of the box in the tensor the map spans: packed keys, or the caches' rows.
          const int row = kPaged ? pages.page[0] * p.page_size + (key0 & (p.page_size - 1)) : blk.k_begin + key0;
#pragma unroll
          for (int atom = 0; atom < kAtoms; ++atom)
            tma_load_3d(tile + atom * kKAtomBytes + lane * box_rows * 128, map, barrier, atom * 64, blk.kv_head, row);
        };
        const unsigned k_tile = shared_address(k_tiles + stage * kTileBytes), v_tile = shared_address(v_tiles + stage * kTileBytes);
        if (lane == 0) {
          mbarrier_wait(k_empty(stage), phase ^ 1);
          mbarrier_arrive_expect_tx(k_full(stage), bytes);
        }
        __syncwarp();
        copy_tile(k_tile, &p.tensor_maps[kPrefillMapK], k_full(stage));
        const int valid_rows = blk.len_k - key0;  // warp-uniform
        const unsigned v_barrier = valid_rows >= kBlockK ? v_full(stage) : tail_full;
        if (lane == 0) {
          mbarrier_wait(v_empty(stage), phase ^ 1);
          mbarrier_arrive_expect_tx(v_barrier, bytes);
        }
        __syncwarp();
        copy_tile(v_tile, &p.tensor_maps[kPrefillMapV], v_barrier);
        if (issuer == 0 && valid_rows < kBlockK) {  // the sequence's last block, once per CTA: phase 0 of tail_full
          mbarrier_wait(tail_full, 0);
          for (int r = 8 * (valid_rows / 8) + lane / 16; r < kBlockK; r += 2) {
            if (r < valid_rows) continue;
#pragma unroll
            for (int atom = 0; atom < kAtoms; ++atom) {
              const unsigned at = v_tile + atom * kKAtomBytes + r * 128 + (lane % 16) * 8;
              asm volatile("st.shared.v2.u32 [%0], {%1, %1};" ::"r"(at), "r"(0) : "memory");
            }
          }
          fence_async_shared();  // the zeros, written through the generic proxy, before wgmma reads them
          __syncwarp();
          if (lane < tma_issuers) mbarrier_arrive(v_full(stage));  // for every issuing warp
        }
        if (kPaged) pages = next_pages;
      }
    }
    return;
  }

  // A consumer.
  warpgroup_registers_claim<Shape::kConsumerRegisters>();
  const int consumer = warpgroup - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int warp_row0 = blk.q0 + consumer * 64 + warp * 16;  // this warp's first row
  const int row_lo = warp_row0 + g;                          // this thread's rows: row_lo, row_lo + 8
  const unsigned q_address = shared_address(q_tile) + consumer * 64 * 128;
  // Turns: a consumer waits for its own barrier before issuing MMAs, and passes the turn on after.
  auto take_turn = [&] {
    if (kConsumers > 1) named_barrier_sync(kTurnBarrier + consumer, 256);
  };
  auto pass_turn = [&] {
    if (kConsumers > 1) named_barrier_arrive(kTurnBarrier + (consumer + 1) % kConsumers, 256);
  };
  auto release = [&](unsigned barrier) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(barrier);
  };

  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float s[kKeyTiles][4];
  wgmma_define_operands(s);
  unsigned pa[kBlockK / 16][4];
  float m_row[2] = {neg_inf(), neg_inf()}, l_row[2] = {0.0f, 0.0f};  // rows g, g + 8; log2 domain
  float factor[2];
  bool rescale = false;  // O must take `factor` before the next P V (online_softmax_probabilities<kLazy>)
  // With an e4m3 cache k_scale joins the scores' scale (a lambda, so 16-bit caches keep the plain one).
  const auto logit_scale = [&] { return kFp8 ? pending_logit_scale<kSoftcap>(p) * p.k_scale : pending_logit_scale<kSoftcap>(p); };

  auto issue_qk = [&](int i) {
    wgmma_ss_k_major<T, kBlockK, kHeadDim>(s, q_address, kQAtomBytes, shared_address(k_tiles + (i % kStages) * kTileBytes), kKAtomBytes);
    wgmma_commit();
  };
  // V is N-major: 8 keys per 1024-byte atom row group, the next 64 columns one atom column on.
  auto issue_pv = [&](int i) {
    wgmma_rs_pv<T, kHeadDim, kBlockK>(o, pa, wgmma_descriptor(shared_address(v_tiles + (i % kStages) * kTileBytes), kKAtomBytes, 1024));
    wgmma_commit();
  };
  // Cap and mask (masks only where the warp's rows cross a band edge or the end), then the
  // softmax; O's rescale is left to the caller.
  auto softmax = [&](int i) {
    const int key0 = (block_start + i) * kBlockK;
    const bool edge = key0 + kBlockK > blk.len_k || (blk.upper_bound && key0 + kBlockK - 1 > warp_row0 + blk.shift) ||
                      (p.window_left >= 0 && key0 < warp_row0 + 15 + blk.shift - p.window_left);
    cap_and_mask_scores<kSoftcap>(s, p, edge, row_lo, blk.shift, blk.len_k, key0 + 2 * c);
    rescale = online_softmax_probabilities<true, true>(s, m_row, l_row, logit_scale(), factor);
  };

  // Under causal masking this consumer's rows may end before the CTA's last key block starts (the
  // CTA's last row is up to kBlockQ - 64 rows on): the consumer skips such blocks, taking its turns
  // without MMAs, and releases no stage for them, since no later block of the CTA reuses theirs.
  // Rows wholly past the sequence (never stored) keep every block, rows that see no key one.
  static_assert((kBlockQ - 64 + kBlockK - 1) / kBlockK < kStages, "a skipped block's stage is never refilled");
  int consumer_blocks = num_blocks;
  if (blk.upper_bound && blk.q0 + consumer * 64 < blk.len_q) {
    const int consumer_key_end = min(blk.len_k, min(blk.q0 + consumer * 64 + 63, blk.len_q - 1) + blk.shift + 1);
    consumer_blocks = min(num_blocks, max(1, (consumer_key_end + kBlockK - 1) / kBlockK - block_start));
  }

  // Without causal masking or a window every CTA walks keys [0, len_k). Where the last block holds
  // at most kNarrowK of them (S = 4096 at head_dim 128: 48 of 176), it is issued kNarrowK wide, in
  // a last iteration of its own (a branch between two wgmmas of one loop would make ptxas fence
  // every wgmma): the MMAs and the softmax of the 128 keys past the end cost 3% of such a call.
  constexpr int kNarrowK = 48;
  constexpr bool kNarrowTail = !kPaged && kBlockK > 2 * kNarrowK;
  const bool narrow_last = kNarrowTail && !blk.upper_bound && p.window_left < 0 && num_blocks > 1 &&
                           blk.len_k - (block_start + num_blocks - 1) * kBlockK <= kNarrowK;
  const int wide_blocks = narrow_last ? consumer_blocks - 1 : consumer_blocks;

  if (consumer == kConsumers - 1) pass_turn();  // consumer 0 goes first
  mbarrier_wait(q_full, 0);
  if (num_blocks > 0) {
    mbarrier_wait(k_full(0), 0);
    take_turn();
    wgmma_fence();
    issue_qk(0);
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(s);
    release(k_empty(0));
    softmax(0);  // O is still zero: no rescale
    pack_p_fragments<T>(s, pa);
    for (int i = 1; i < wide_blocks; ++i) {
      const unsigned phase = (i / kStages) & 1, previous_phase = ((i - 1) / kStages) & 1;
      mbarrier_wait(k_full(i % kStages), phase);
      mbarrier_wait(v_full((i - 1) % kStages), previous_phase);
      take_turn();
      wgmma_fence();
      issue_qk(i);
      issue_pv(i - 1);
      pass_turn();
      wgmma_wait<1>();  // S_i landed; P V of the block before still runs
      wgmma_fence_operands(s);
      release(k_empty(i % kStages));
      softmax(i);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      release(v_empty((i - 1) % kStages));
      if (rescale) rescale_rows(o, factor);
      pack_p_fragments<T>(s, pa);
    }
    const int last = consumer_blocks - 1;
    if (kNarrowTail && narrow_last) {  // the loop's step at kNarrowK keys (NVRTC rejects the generic lambda that would share it)
      float s_narrow[kNarrowK / 8][4];
      unsigned pa_narrow[kNarrowK / 16][4];
      wgmma_define_operands(s_narrow);
      mbarrier_wait(k_full(last % kStages), (last / kStages) & 1);
      mbarrier_wait(v_full((last - 1) % kStages), ((last - 1) / kStages) & 1);
      take_turn();
      wgmma_fence();
      wgmma_ss_k_major<T, kNarrowK, kHeadDim>(s_narrow, q_address, kQAtomBytes, shared_address(k_tiles + (last % kStages) * kTileBytes),
                                              kKAtomBytes);
      wgmma_commit();
      issue_pv(last - 1);
      pass_turn();
      wgmma_wait<1>();
      wgmma_fence_operands(s_narrow);
      release(k_empty(last % kStages));
      const int key0 = (block_start + last) * kBlockK;
      cap_and_mask_scores<kSoftcap>(s_narrow, p, key0 + kNarrowK > blk.len_k, row_lo, blk.shift, blk.len_k, key0 + 2 * c);
      rescale = online_softmax_probabilities<true, true>(s_narrow, m_row, l_row, logit_scale(), factor);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      release(v_empty((last - 1) % kStages));
      if (rescale) rescale_rows(o, factor);
      pack_p_fragments<T>(s_narrow, pa_narrow);
      mbarrier_wait(v_full(last % kStages), (last / kStages) & 1);
      take_turn();
      wgmma_fence();
      wgmma_rs_pv<T, kHeadDim, kNarrowK>(o, pa_narrow,
                                         wgmma_descriptor(shared_address(v_tiles + (last % kStages) * kTileBytes), kKAtomBytes, 1024));
      wgmma_commit();
    } else {
      mbarrier_wait(v_full(last % kStages), (last / kStages) & 1);
      take_turn();
      wgmma_fence();
      issue_pv(last);
    }
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(o);
    release(v_empty(last % kStages));
    for (int i = consumer_blocks; i < num_blocks; ++i) {  // the skipped blocks' turns
      take_turn();
      pass_turn();
    }
  }
  if (consumer == 0) take_turn();  // the last consumer's final pass: every arrival is matched

  // Out through the warp's own 16 Q rows in shared memory (its last Q K^T has read them), so each
  // store writes whole rows: straight from the accumulators a warp instruction writes 4-byte
  // pieces of 16 rows.
  unsigned char* const out_tile = q_tile + (consumer * 64 + warp * 16) * 128;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    float m_nat, l, scale_o;
    finish_prefill_row(p, m_row, l_row, half, blk.head, m_nat, l, scale_o);
    const float inv = row_inverse(l, scale_o) * (kFp8 ? p.v_scale : 1.0f);
    if (p.lse != nullptr && c == 0 && row_lo + 8 * half < blk.len_q) {
      p.lse[(blk.q_begin + row_lo + 8 * half) * p.lse_row_stride + blk.head] = row_lse(m_nat, l);
    }
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      *reinterpret_cast<unsigned*>(out_tile + swizzle128_tile_offset(r, n, kQAtomBytes) + 4 * c) =
          pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
  }
  __syncwarp();
  T* const out_rows = static_cast<T*>(p.out) + (blk.q_begin + warp_row0) * p.out_row_stride + blk.head * p.out_head_stride;
#pragma unroll
  for (int j = 0; j < 16 * kChunks / 32; ++j) {
    const int i = lane + 32 * j, r = i / kChunks, chunk = i % kChunks;
    if (warp_row0 + r < blk.len_q) {
      *reinterpret_cast<uint4*>(out_rows + r * p.out_row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(out_tile + swizzle128_tile_offset(r, chunk, kQAtomBytes));
    }
  }
}

}  // namespace kiln
