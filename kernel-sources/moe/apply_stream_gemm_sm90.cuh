// The tensor-core phases of moe_apply_stream (moe/apply_stream.cuh) on sm_90a: the up
// and down projections as grouped GEMMs on wgmma, when the launch gives the kernel the shared
// memory for them (src/kernels/moe_apply_stream.cpp decides by token count). Each is a persistent loop
// over tiles (expert, 256 output columns, 128 of the expert's routed pairs), the pairs' rows
// fastest and claimed in order from a counter, so the CTAs that share an expert's weight tile run
// at the same time. A tile's rows are consecutive rows of the grouped pair list: x_grouped (x rows
// copied in grouped order by the group phase) for up, act (written in grouped order by up) for
// down. Operands reach four shared-memory stages of 64-deep K slices by TMA (tensor maps in the
// parameter block), in the 128-byte swizzle: the first thread of warpgroup 2 issues a stage's
// copies once every math thread has released it (its `empty` mbarrier) and they land on its
// `full` mbarrier, up to four slices ahead across tile boundaries. There is no CTA-wide barrier
// per K step, and no other thread copies. Warpgroups 0 and 1 each own 64 rows x 256 columns of
// the tile (m64n256k16; 64 x 128 in a projection's last column block when no more are live), or,
// for an expert's last tile when it holds at most 64 pairs, 64 x 128 of a 64 x 256 tile (half the
// MMA work). The CTA has 12 warps (stream_workspace.h).
// MXFP4 weights (standard or prepared) take the same pipeline in their 16-warp CTA, with eight
// stages and the operands swapped (moe_gemm_tile_mxfp4): tiles of 192 weight rows (64 a math
// warpgroup), decoded from the stage into the register A operand of m64n128k16 (within 128
// registers a thread; each slice's decode runs under the previous slice's MMAs), against the
// routed pairs' rows as B; warpgroup 3 copies the weights as stored by cp.async and the x or act
// rows by TMA (moe_gemm_copy_mxfp4). Large batches (stream_workspace.h) run a build whose tiles
// hold up to 144 pairs (m64n144k16), decoded half a slice at a time.
//   up    act[slot][u] = activation(gate, up) + biases, bf16, for intermediate units u and grouped
//         slots. Interleaved weights: tile column q is gate (q even) or up (q odd) of unit
//         (n0 + q) / 2. Concatenated: a warpgroup's columns are the gate rows of its units, then
//         their up rows (the copies place them so).
//   down  y[pair][h] = act[slot] . W2[e][h] + bias, rounded to bf16.
#pragma once

#include "common/atomics.cuh"
#include "common/cp_async.cuh"
#include "common/fast_math.cuh"
#include "common/grid_barrier.cuh"
#include "common/mma_sm80.cuh"
#include "common/tma_sm90.cuh"
#include "common/vector_memory.cuh"
#include "common/warp_specialization_sm90.cuh"
#include "common/wgmma_sm90.cuh"
#include "moe/moe_common.cuh"
#include "moe/mxfp4_decode.cuh"
#include "moe/stream_workspace.h"

namespace kiln {

enum {
  kMoeTileM = KILN_MOE_GEMM_ROWS,                              // routed pairs per tile (bf16 weights)
  kMoeMxfp4TileM = kiln_moe_mxfp4_rows(KILN_MOE_LARGE_BATCH),  // ... with MXFP4 weights (128 or 144)
  kMoeTileN = 256,                                             // output columns per tile (bf16 weights)
  kMoeMxfp4TileN = 192,                                        // ... with MXFP4 weights (weight rows, 64 a math warpgroup)
  kMoeTileK = 64,                                              // one 128-byte swizzle atom of 16-bit values
  kMoeStages = 4,                                              // with bf16 weights
  kMoeStageBytes = (kMoeTileM + kMoeTileN) * kMoeTileK * 2,
  // MXFP4: a stage holds a slice's 128 x or act rows (bf16, 128-byte swizzle, in TMA boxes of 64
  // rows; 144 rows in boxes of 48 in the large-batch build), then its 192 weight rows as stored
  // (32 bytes each), then the 4-byte scale word of each 16-byte copy (padded to a swizzle atom).
  kMoeMxfp4Stages = 8,
  kMoeMxfp4XBoxRows = kiln_moe_mxfp4_box_rows(KILN_MOE_LARGE_BATCH),
  kMoeMxfp4XBytes = kMoeMxfp4TileM * kMoeTileK * 2,
  kMoeMxfp4RawBytes = kMoeMxfp4TileN * kMoeTileK / 2,
  kMoeMxfp4Copies = kMoeMxfp4TileN * 2,  // 16-byte weight copies a slice: two halves a row
  kMoeMxfp4StageBytes = kMoeMxfp4XBytes + kMoeMxfp4RawBytes + (kMoeMxfp4Copies * 4 + 1023) / 1024 * 1024,
  kMoeMathThreads = 256,       // bf16 weights: warpgroups 0 and 1 run the MMAs and epilogues
  kMoeProducerThread = 256,    // ... and the first thread of warpgroup 2 every copy
  kMoeMxfp4MathThreads = 384,  // MXFP4: warpgroups 0 to 2 decode the weights and run the MMAs
  kMoeCopierThreads = 128,     // ... and warpgroup 3 copies the weights and x or act
  kMoeCopierBarrier = 1,       // the named barrier the copiers meet at between tiles
  kMoeMxfp4CopiesPerCopier = kMoeMxfp4Copies / kMoeCopierThreads,
  // Per math warp, in the shared memory the caller passes as `staging`: a 16 x 64-byte block of
  // the epilogue's output, then (after all warps' blocks) its warpgroup's bf16 biases.
  kMoeStagingBytes = 1024,
  kMoeBiasStagingBytes = 512,
};
static_assert(kiln_moe_stream_warps(0) == 12, "three warpgroups run the bf16 kernel");
static_assert(kMoeStages * kMoeStageBytes + 1024 == KILN_MOE_GEMM_SHARED_BYTES, "moe/stream_workspace.h sizes these stages");
static_assert(kMoeMxfp4Stages * kMoeMxfp4StageBytes + 1024 == kiln_moe_gemm_mxfp4_shared_bytes(KILN_MOE_LARGE_BATCH),
              "... and the MXFP4 ones");
static_assert(kMoeMxfp4StageBytes % 1024 == 0, "every stage's x rows start on a swizzle atom");
static_assert(kMoeMxfp4TileM % kMoeMxfp4XBoxRows == 0 && kMoeMxfp4XBoxRows % 8 == 0,
              "whole boxes of whole swizzle atoms fill a stage's x rows");
static_assert(kiln_moe_stream_warps(1) * 32 == kMoeMxfp4MathThreads + kMoeCopierThreads, "MXFP4: three math warpgroups, one copier");
static_assert(kMoeMxfp4TileN == 64 * (kMoeMxfp4MathThreads / 128), "MXFP4: 64 weight rows a math warpgroup");
static_assert(kMoeMxfp4Copies % kMoeCopierThreads == 0, "every copier makes the same copies");

// Output columns per tile: 256 with bf16 weights (m64n256 per math warpgroup, in the 12-warp CTA
// with 168 registers a thread), 192 with MXFP4 (the swapped tiles' weight rows, 64 a warpgroup).
template <int kFormat>
struct MoeGemmTileN {
  enum { value = kFormat == kWeightsBf16 ? kMoeTileN : kMoeMxfp4TileN };
};
// Threads that run the MMAs (the warpgroups from 0): two with bf16 weights, three with MXFP4.
__device__ __forceinline__ constexpr int moe_gemm_math_threads(bool mxfp4) { return mxfp4 ? kMoeMxfp4MathThreads : kMoeMathThreads; }

// The gated activation (moe_common.cuh) on MUFU approximations: the epilogue runs while no MMA
// does. sigmoid(a x) = 1 / (1 + 2^(-a x log2 e)).
template <int kActivation>
__device__ __forceinline__ float glu_activation_fast(float gate, float up) {
  if (kActivation == kSwigluClamped) {
    gate = fminf(gate, 7.0f);
    up = fminf(fmaxf(up, -7.0f), 7.0f);
    return gate * rcp_ftz(1.0f + exp2_ftz(gate * (-1.702f * 1.4426950408889634f))) * (up + 1.0f);
  }
  return gate * rcp_ftz(1.0f + exp2_ftz(gate * -1.4426950408889634f)) * up;
}

// One tile: expert, first pair (index into the grouped pair list), pairs in it, first column.
struct MoeGemmTile {
  int expert, first, count, n0;
};

// Tile `tile` of the order (expert, column block, pair block) with pair blocks fastest, pair
// blocks of tile_m pairs.
__device__ __forceinline__ MoeGemmTile find_gemm_tile(const int* mtile_start, const int* pair_start, int experts, int n_tiles, int tile,
                                                      int tile_m, int tile_n) {
  const int e = find_expert(mtile_start, experts, tile, n_tiles);
  const int m_tiles = mtile_start[e + 1] - mtile_start[e], local = tile - mtile_start[e] * n_tiles;
  MoeGemmTile t;
  t.expert = e;
  t.first = pair_start[e] + (local % m_tiles) * tile_m;
  t.count = min(tile_m, pair_start[e + 1] - t.first);
  t.n0 = (local / m_tiles) * tile_n;
  return t;
}

// What one projection's tiles share, from the parameters and the group phase's offsets.
template <bool kUp, int kTileN>
struct MoeGemmShape {
  const int *mtile_start, *pair_start, *pairs;
  int n_total, n_tiles, total_tiles, k_steps;
  __device__ MoeGemmShape(const KilnMoeParams& p, const int* mtile_start_, const int* pair_start_, const int* pairs_)
      : mtile_start(mtile_start_), pair_start(pair_start_), pairs(pairs_) {
    n_total = kUp ? 2 * p.intermediate : p.hidden;  // a multiple of 64
    n_tiles = (n_total + kTileN - 1) / kTileN;
    total_tiles = mtile_start[p.num_experts] * n_tiles;
    k_steps = (kUp ? p.hidden : p.intermediate) / kMoeTileK;
  }
  __device__ MoeGemmTile tile(const KilnMoeParams& p, int index) const {
    return find_gemm_tile(mtile_start, pair_start, p.num_experts, n_tiles, index, kTileN == kMoeTileN ? kMoeTileM : kMoeMxfp4TileM, kTileN);
  }
};

// The MXFP4 GEMMs' K order within each 64-deep slice. wgmma's A fragment gives thread c of a quad
// the values at k = 16 kk + 8 j + 2 c + e (k step kk, register pair j, e = 0, 1); the GEMMs put there
// the weight value at r = 16 c + 8 (q / 4) + q % 4 + 4 e (q = 2 kk + j). Each thread's 16 values are
// then its own 8 contiguous bytes of the e2m1 row, and each decoded pair (values i and i + 4 of a
// word) is one fragment register. x_grouped and act hold their K in the same order (the group
// phase and the up epilogue write them so): mxfp4_gemm_k_position(r) is where value r goes.
__device__ __forceinline__ int mxfp4_gemm_k_position(int r) {
  const int c = r >> 4, e = (r >> 2) & 1, q = 4 * ((r >> 3) & 1) + (r & 3);
  return 16 * (q >> 1) + 8 * (q & 1) + 2 * c + e;
}
// 64 consecutive bf16 values (32 words, K order) into that order: word 4 q + c of the result holds
// values 16 c + 8 (q / 4) + q % 4 and 4 further.
__device__ __forceinline__ void to_mxfp4_gemm_k_order(const u32 (&from)[32], u32 (&to)[32]) {
#pragma unroll
  for (int q = 0; q < 8; ++q) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int lo = 16 * c + 8 * (q >> 2) + (q & 3);  // lo and lo + 4 sit in the same half of their words
      to[4 * q + c] = __byte_perm(from[lo >> 1], from[(lo + 4) >> 1], (lo & 1) ? 0x7632 : 0x5410);
    }
  }
}

// One 64-deep slice of a row (64 bf16 in K order) from `from` into `into` in the MXFP4 GEMMs' K
// order; with W4A8 (kActMxfp8) quantized first (quantize_mxfp8_block, two blocks of 32).
template <bool kActMxfp8>
__device__ __forceinline__ void copy_slice_in_mxfp4_gemm_order(const bf16* from, bf16* into) {
  u32 k_order[32], gemm_order[32];
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    const Bf16x8 piece = load16(from + 8 * v);  // x: read-only
#pragma unroll
    for (int w = 0; w < 4; ++w) k_order[4 * v + w] = piece.w[w];
  }
  if constexpr (kActMxfp8) {
    quantize_mxfp8_block(*reinterpret_cast<u32(*)[16]>(&k_order[0]));
    quantize_mxfp8_block(*reinterpret_cast<u32(*)[16]>(&k_order[16]));
  }
  to_mxfp4_gemm_k_order(k_order, gemm_order);
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    Bf16x8 piece;
#pragma unroll
    for (int w = 0; w < 4; ++w) piece.w[w] = gemm_order[4 * v + w];
    store16(into + 8 * v, piece);
  }
}

// x_grouped for the up GEMM's copies, once the pair list is complete (after a grid barrier): the x
// row of each listed pair at its slot (in the second half of y's region, which bf16 y leaves
// free). Each warp takes an even share of the slots (lane j: slot j of a group of 32) and copies
// their rows together, 16 bytes per lane; with MXFP4 weights (kMxfp4Order) 128 bytes, a 64-deep
// slice, which it writes in the MXFP4 GEMMs' K order (with W4A8 quantized).
template <bool kMxfp4Order, bool kActMxfp8>
__device__ __forceinline__ void moe_gemm_group_x(const KilnMoeParams& p, const int* pairs, int listed, bf16* x_grouped, int warp, int warps,
                                                 int lane) {
  static_assert(kMxfp4Order || !kActMxfp8, "W4A8 takes MXFP4 weights");
  constexpr int kValues = kMxfp4Order ? kMoeTileK : 8;  // per lane and copy
  const int per_row = p.hidden / kValues;
  const int share = (listed + warps - 1) / warps, first = warp * share, last = min(listed, first + share);
  for (int s0 = first; s0 < last; s0 += 32) {
    const int rows = min(32, last - s0);
    const int q = s0 + lane < last ? *reinterpret_cast<const volatile int*>(&pairs[s0 + lane]) : 0;  // listed by other CTAs
    for (int base = 0; base < rows * per_row; base += 32) {
      const int i = base + lane, j = min(i / per_row, 31), chunk = i - j * per_row;
      const int from_pair = __shfl_sync(0xffffffffu, q, j);
      if (i < rows * per_row) {
        const bf16* from = static_cast<const bf16*>(p.x) + static_cast<long long>(from_pair / p.top_k) * p.x_row_stride + kValues * chunk;
        bf16* const into = x_grouped + static_cast<long long>(s0 + j) * p.hidden + kValues * chunk;
        if constexpr (kMxfp4Order) {
          copy_slice_in_mxfp4_gemm_order<kActMxfp8>(from, into);
        } else {
          store16(into, load16(from));
        }
      }
    }
  }
  fence_async_global();  // the writes above are read by TMA copies
}

// W4A8, between the up and down GEMMs (after a grid barrier, before another): every act row of a
// listed pair quantized to MXFP8 in place, a 64-deep slice a thread. act holds each slice in the
// MXFP4 GEMMs' K order, where the slice's first block of 32 (in K order) fills the words m with
// m & 2 == 0, and its second block the others.
__device__ __forceinline__ void moe_gemm_quantize_act(const KilnMoeParams& p, bf16* act, const int* pair_start, int thread, int threads) {
  const long long per_row = p.intermediate / kMoeTileK, slices = static_cast<long long>(pair_start[p.num_experts]) * per_row;
  for (long long b = thread; b < slices; b += threads) {
    bf16* const at = act + (b / per_row) * p.intermediate + kMoeTileK * (b % per_row);
    u32 words[32], block[2][16];
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      const Bf16x8 piece = load_l2_16(at + 8 * v);  // written by other CTAs before the barrier
#pragma unroll
      for (int w = 0; w < 4; ++w) words[4 * v + w] = piece.w[w];
    }
#pragma unroll
    for (int m = 0; m < 32; ++m) block[(m >> 1) & 1][(m >> 2) * 2 + (m & 1)] = words[m];
    quantize_mxfp8_block(block[0]);
    quantize_mxfp8_block(block[1]);
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      Bf16x8 piece;
#pragma unroll
      for (int w = 0; w < 4; ++w) piece.w[w] = block[((4 * v + w) >> 1) & 1][((4 * v + w) >> 2) * 2 + (w & 1)];
      store16(at + 8 * v, piece);
    }
  }
  fence_async_global();  // read by down's TMA copies after the grid barrier
}

// The stages' mbarriers and the tile each tile's first slice belongs to, in the kernel's static
// shared memory: both phases run on them, and a running count of slices gives every wait its phase.
template <int kStagesOfPipe>
struct MoeGemmPipeline {
  static constexpr int kStages = kStagesOfPipe;
  unsigned full, empty;  // shared-window addresses of kStages barriers each, 8 bytes apart
  unsigned told;         // likewise: tile_of_stage written (the producer arrives after every slice's write)
  int* tile_of_stage;    // written with a tile's first slice; -1: the phase's end marker
  int* slice_after;      // bf16: the running slice count after a phase, from the producer thread
  int* claims;           // MXFP4: two ints, the copiers' next tile (MoeWeightCursor)
  unsigned stage_base;   // stage 0, 1024-byte aligned
  unsigned stage_bytes;  // kMoeStageBytes, or kMoeMxfp4StageBytes
  // Slice counts are never negative: as unsigned, the stage and phase are a mask and a shift.
  __device__ unsigned full_barrier(int slice) const { return full + 8 * index(slice); }
  __device__ unsigned told_barrier(int slice) const { return told + 8 * index(slice); }
  __device__ unsigned empty_barrier(int slice) const { return empty + 8 * index(slice); }
  __device__ unsigned stage(int slice) const { return stage_base + index(slice) * stage_bytes; }
  static __device__ unsigned index(int slice) { return static_cast<unsigned>(slice) % kStages; }
  // Uses of a stage complete its barriers' phases in turn: slice s is use s / kStages.
  static __device__ unsigned parity(int slice) { return (static_cast<unsigned>(slice) / kStages) & 1; }
};
template <int kFormat>
using MoeGemmPipelineOf = MoeGemmPipeline<kFormat == kWeightsBf16 ? kMoeStages : kMoeMxfp4Stages>;

// Before the first phase, by thread 0: a stage is full once its copies land (one arrival, with
// their bytes) and, with MXFP4 weights, each copier's weight copies have landed (one arrival a
// copier); empty once each math thread has released it. `told` hands over the tile index by a plain
// arrival: thread to thread, without the copies' completion in between.
template <class Pipe>
__device__ __forceinline__ void moe_gemm_init_barriers(const Pipe& pipe, bool mxfp4) {
  for (int s = 0; s < Pipe::kStages; ++s) {
    mbarrier_init(pipe.full + 8 * s, mxfp4 ? 1 + kMoeCopierThreads : 1);
    mbarrier_init(pipe.empty + 8 * s, moe_gemm_math_threads(mxfp4));
    mbarrier_init(pipe.told + 8 * s, 1);
  }
  mbarrier_init_fence();
}

// Columns each math warpgroup computes of tile t. A tile of more than 64 pairs gives each
// warpgroup 64 of its rows and all 256 columns (m64n256k16), or only 128 where no more are live
// (a projection's last column block); a tile of at most 64 pairs gives each the 64 rows and half
// the columns (m64n128k16).
__device__ __forceinline__ int moe_gemm_warpgroup_columns(const MoeGemmTile& t, int n_total) {
  return t.count > 64 && n_total - t.n0 > 128 ? 256 : 128;
}

// The producer thread's copies of one projection: the CTA's tiles in claim order, one K slice per
// stage, then an end marker. A slice's stage is reused once its slice kMoeStages earlier is released.
template <bool kUp, int kLayout>
struct MoeGemmProducer {
  using Pipe = MoeGemmPipeline<kMoeStages>;
  MoeGemmTile t;  // of the tile being loaded
  int tile;       // >= total_tiles: past the CTA's last tile
  int ks;         // the K step to load next
  int claimed;    // the CTA's tile after `tile`
  bool finished;  // the end marker went out

  __device__ void start(const KilnMoeParams& p, const MoeGemmShape<kUp, kMoeTileN>& s, int* counter) {
    tile = blockIdx.x;
    ks = 0;
    finished = false;
    if (tile < s.total_tiles) t = s.tile(p, tile);
    claimed = tile < s.total_tiles ? gridDim.x + atomic_add_global(counter, 1) : s.total_tiles;
  }

  __device__ void load(const KilnMoeParams& p, const MoeGemmShape<kUp, kMoeTileN>& s, const Pipe& pipe, int slice, int* counter) {
    if (slice >= kMoeStages) {
      const int before = slice - kMoeStages;
      mbarrier_wait(pipe.empty_barrier(slice), Pipe::parity(before));
      // The phases this thread completed on the stage's full and told barriers for that slice
      // ended before its release: these waits return at once, and match each of its arrivals
      // with a wait of its own (compute-sanitizer's synccheck reports "missing wait" otherwise).
      mbarrier_wait(pipe.full_barrier(before), Pipe::parity(before));
      mbarrier_wait(pipe.told_barrier(before), Pipe::parity(before));
    }
    const unsigned full = pipe.full_barrier(slice);
    if (tile >= s.total_tiles) {
      pipe.tile_of_stage[Pipe::index(slice)] = -1;
      mbarrier_arrive(pipe.told_barrier(slice));
      mbarrier_arrive(full);
      finished = true;
      return;
    }
    if (ks == 0) pipe.tile_of_stage[Pipe::index(slice)] = tile;
    mbarrier_arrive(pipe.told_barrier(slice));
    // A: the tile's pairs in one or two boxes of 64 rows (the rows past them feed only
    // accumulator rows the epilogue drops, whatever the stage held); B: 256 weight rows. Fewer,
    // larger copies were faster (on an H200, bench/RESULTS.md).
    const bool two_a = t.count > 64;
    mbarrier_arrive_expect_tx(full, ((two_a ? 128 : 64) + kMoeTileN) * kMoeTileK * 2);
    const unsigned a = pipe.stage(slice), b = a + kMoeTileM * 128;
    const int k0 = ks * kMoeTileK;
    const void* a_map = &p.tensor_maps[kUp ? kMoeMapXGrouped : kMoeMapAct];
    tma_load_2d(a, a_map, full, k0, t.first);
    if (two_a) tma_load_2d(a + 64 * 128, a_map, full, k0, t.first + 64);
    // Weight rows past the expert's arrive as zeros; rows of the next column block feed only
    // columns the epilogue drops.
    if (kUp && kLayout != kGateUpInterleaved) {
      // 8 boxes of 32 rows: each warpgroup's columns are the gate rows of its units, then their up rows.
      const int group = moe_gemm_warpgroup_columns(t, s.n_total);
      const int boxes = group / 32, half_boxes = group / 64;
#pragma unroll
      for (int box = 0; box < 8; ++box) {
        const int within = box % boxes, unit = t.n0 / 2 + (box / boxes) * (group / 2) + (within % half_boxes) * 32;
        tma_load_3d(b + box * 32 * 128, &p.tensor_maps[kMoeMapW13By32], full, k0, within >= half_boxes ? p.intermediate + unit : unit,
                    t.expert);
      }
    } else {
      tma_load_3d(b, &p.tensor_maps[kUp ? kMoeMapW13 : kMoeMapW2], full, k0, t.n0, t.expert);
    }
    if (++ks == s.k_steps) {
      ks = 0;
      tile = claimed;
      if (tile < s.total_tiles) {
        t = s.tile(p, tile);
        claimed = gridDim.x + atomic_add_global(counter, 1);
      }
    }
  }
};

// The producer thread's whole phase, from the CTA's running slice count; returns the count after it.
template <bool kUp, int kLayout>
__device__ __forceinline__ int moe_gemm_produce(const KilnMoeParams& p, const MoeGemmShape<kUp, kMoeTileN>& s,
                                                const MoeGemmPipeline<kMoeStages>& pipe, int slice, int* counter) {
  tma_prefetch_map(&p.tensor_maps[kUp ? kMoeMapXGrouped : kMoeMapAct]);
  tma_prefetch_map(&p.tensor_maps[kUp ? kMoeMapW13 : kMoeMapW2]);
  MoeGemmProducer<kUp, kLayout> producer;
  producer.start(p, s, counter);
  while (!producer.finished) producer.load(p, s, pipe, slice++, counter);
  return slice;
}

// The MMAs and epilogue of one tile by one math warpgroup, whose first slice's stage is full
// (`slice`: the CTA's running slice count, advanced past the tile). kN: the warpgroup's columns
// (moe_gemm_warpgroup_columns); kSplitRows: the warpgroups take 64 rows each, else 64 rows and
// kN columns each. Each thread releases every stage once its warpgroup's MMAs on it are done: an
// mbarrier arrival orders only the arriving thread's accesses (with one arrival per warpgroup,
// compute-sanitizer's racecheck reported the other threads' reads of tile_of_stage against the
// producer's rewrite).
template <int kN, bool kSplitRows, bool kUp, int kActivation, int kLayout, int kBias13, int kBias2, int kTileN, class Pipe, int kAccRows>
__device__ __forceinline__ void moe_gemm_tile(const KilnMoeParams& p, const MoeGemmShape<kUp, kTileN>& s, const Pipe& pipe,
                                              const MoeGemmTile& t, int& slice, int warpgroup, bf16* act, bf16* y, unsigned staging,
                                              float (&acc256)[kAccRows][4]) {
  static_assert(kN / 8 <= kAccRows, "the accumulators hold the warpgroup's columns");
  const int math_warp = (threadIdx.x >> 5) & 7, warp = math_warp & 3, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int m_off = kSplitRows ? warpgroup * 64 : 0, n_off = kSplitRows ? 0 : warpgroup * kN;
  constexpr bool kConcat = kUp && kLayout != kGateUpInterleaved;
  // Warpgroup-uniform (the tile and warpgroup went through shuffles): column blocks wholly past the
  // projection's columns skip their MMAs.
  const bool live = t.n0 + n_off < s.n_total;
  // Every tile shape accumulates in the same registers. With concatenated weights the first half
  // of a warpgroup's columns is gate, the second up.
  float(&acc)[kN / 8][4] = *reinterpret_cast<float(*)[kN / 8][4]>(&acc256[0][0]);
  float(&gate_acc)[kN / 16][4] = *reinterpret_cast<float(*)[kN / 16][4]>(&acc256[0][0]);
  float(&up_acc)[kN / 16][4] = *reinterpret_cast<float(*)[kN / 16][4]>(&acc256[kN / 16][0]);
  // bf16 biases of the warpgroup's columns (down, interleaved up) go into the warp's 512 bytes
  // after its staging by cp.async as the tile starts, so their latency hides behind the MMAs
  // without holding registers; the epilogue reads them there. (Loaded in the epilogue, GPT-OSS's
  // biases cost the layer 3-4% at T = 8192 on an H200, bench/RESULTS.md.) f32 biases, twice the
  // bytes, are loaded in the epilogue.
  constexpr int kBias = kUp ? kBias13 : kBias2;
  const void* const bias_base = kUp ? p.w13_bias : p.w2_bias;
  constexpr bool kBiasStaged = kBias == kBiasBf16 && !kConcat;
  const unsigned warp_bias = staging + kMoeMathThreads / 32 * kMoeStagingBytes + math_warp * kMoeBiasStagingBytes;
  if (kBiasStaged && live) {
    const int first = t.n0 + n_off;  // the bias column of acc[0]'s column 0
    const bf16* from = static_cast<const bf16*>(bias_base) + t.expert * (kUp ? p.w13_bias_expert_stride : p.w2_bias_expert_stride) + first;
#pragma unroll
    for (int i = 0; i < kN / 64; ++i) {  // 2 columns a copy
      const int col = 2 * (32 * i + lane);
      copy4_async_or_zero(warp_bias + 2 * col, from + col, first + col < s.n_total);
    }
    commit_copies();
  }
  // Down writes y by pair: the two rows' pair ids are loaded before the MMAs, which hide their latency.
  int pair_of_row[2] = {0, 0};
  if (!kUp) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m_off + warp * 16 + g + 8 * half;
      if (r < t.count) pair_of_row[half] = *reinterpret_cast<const volatile int*>(&s.pairs[t.first + r]);
    }
  }
  for (int ks = 0; ks < s.k_steps; ++ks, ++slice) {
    if (ks > 0) mbarrier_wait(pipe.full_barrier(slice), Pipe::parity(slice));  // the first: waited by the caller
    const unsigned stage = pipe.stage(slice);
    const unsigned a_address = stage + m_off * 128, b_address = stage + kMoeTileM * 128;
    if (live) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMoeTileK / 16; ++kk) {
        wgmma_ss<bf16, kN>(acc, wgmma_descriptor(a_address + kk * 32, 16, 1024),
                           wgmma_descriptor(b_address + n_off * 128 + kk * 32, 16, 1024), ks > 0 || kk > 0);
      }
      wgmma_commit();
    }
    wgmma_wait<1>();
    if (ks > 0) mbarrier_arrive(pipe.empty_barrier(slice - 1));
  }
  wgmma_wait<0>();
  mbarrier_arrive(pipe.empty_barrier(slice - 1));
  if (!live) return;
  wgmma_fence_operands(acc);

  // Epilogue: this thread's rows m_off + 16 warp + g (+ 8), columns n_off + 8 j + 2 c (+ 1) of the
  // MMA (of each half with concatenated weights). Columns past the projection's end are skipped a
  // block at a time (32 columns for down, 64 otherwise; H and 2 I are multiples of 64 and 128, and
  // with concatenated weights a warpgroup's live units are then a multiple of 64), so no branch
  // sits between one column's math and the next's and ptxas can interleave them.
  const int live_j = min(kN, s.n_total - t.n0 - n_off) / 8;  // live j of acc, a multiple of 8
  const int inter = p.intermediate, hidden = p.hidden;
  // Down's y and interleaved up's act leave through the warp's 1 KB of `staging`, 16 rows x 64
  // bytes at a time: lane (g, c) then writes row g (and g + 8), bytes 16 c .. 16 c + 15 of the
  // block, in one 16-byte store, so each row gets 64 contiguous bytes (the accumulator layout's
  // 4-byte stores filled half of each 32-byte sector). The 16-byte pieces of a row are
  // XOR-swizzled by row / 2, so neither the writes into staging nor the reads conflict.
  const unsigned warp_staging = staging + math_warp * kMoeStagingBytes;
  auto piece = [&](int row, int block) { return warp_staging + row * 64 + (((block ^ (row >> 1)) & 3) << 4); };
  const int r0 = m_off + warp * 16 + g;  // this lane's rows r0 and r0 + 8
  if (kBiasStaged) {
    wait_copies<0>();
    __syncwarp();
  }
  // The biases of columns 8 j + 2 c and + 1 of acc (at `offset` in the bias tensor), as floats.
  auto bias_pair = [&](long long offset, int j) {
    if (kBiasStaged) {
      unsigned w;
      asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w) : "r"(warp_bias + 4 * (4 * j + c)));
      return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    }
    return make_float2(moe_bias<kBias>(bias_base, offset), moe_bias<kBias>(bias_base, offset + 1));
  };
  // Rows r0 and r0 + 8 of the staged block into global memory at `row_lo` and `row_hi`.
  auto write_staged = [&](bf16* row_lo, bf16* row_hi) {
    __syncwarp();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const Bf16x8 v = load16_shared(piece(g + 8 * half, c));
      if (r0 + 8 * half < t.count) store16((half ? row_hi : row_lo) + 8 * c, v);
    }
    __syncwarp();  // the reads are done before the next block is staged
  };
  if (!kUp) {
    // y rows by pair, 32 columns a block: stmatrix stages 16 x 16 of them at a time.
    const long long bias = t.expert * p.w2_bias_expert_stride + t.n0 + n_off + 2 * c;
    const int st_row = (lane & 7) + 8 * ((lane >> 3) & 1), st_block = lane >> 4;  // this lane's stmatrix row address
    bf16* const y_rows[2] = {y + static_cast<long long>(pair_of_row[0]) * hidden + t.n0 + n_off,
                             y + static_cast<long long>(pair_of_row[1]) * hidden + t.n0 + n_off};
#pragma unroll
    for (int j0 = 0; j0 < kN / 8; j0 += 4) {
      if (j0 >= live_j) break;
#pragma unroll
      for (int sub = 0; sub < 2; ++sub) {  // 16 columns each
        unsigned regs[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int j = j0 + 2 * sub + (m >> 1), half = m & 1;
          const float2 b = bias_pair(bias + 8 * j, j);
          regs[m] = pack2<bf16>(acc[j][2 * half] + b.x, acc[j][2 * half + 1] + b.y);
        }
        stmatrix_x4(piece(st_row, 2 * sub + st_block), regs);
      }
      write_staged(y_rows[0] + 8 * j0, y_rows[1] + 8 * j0);
    }
  } else if (!kConcat) {
    // Interleaved: acc[j] holds gate and up of unit u0 + 4 j, one unit per lane, 32 units a block.
    // Lanes c and c ^ 1 swap one result per two j, so each holds two adjacent units: of the 8
    // units of j and j + 1, c = 0 holds units 0-1, c = 2 units 2-3, c = 1 units 4-5, c = 3 units 6-7.
    const int unit_base = t.n0 / 2 + n_off / 2;
    const long long bias = t.expert * p.w13_bias_expert_stride + 2 * (unit_base + c);
    const int word = (c >> 1) | ((c & 1) << 1);
    bf16* const act_rows[2] = {act + (t.first + r0) * static_cast<long long>(inter) + unit_base,
                               act + (t.first + r0 + 8) * static_cast<long long>(inter) + unit_base};
#pragma unroll
    for (int j0 = 0; j0 < kN / 8; j0 += 8) {
      if (j0 >= live_j) break;
#pragma unroll
      for (int j = j0; j < j0 + 8; j += 2) {
        // Gate and up biases (.x, .y) of units u0 + 4 j and u0 + 4 (j + 1), for both rows.
        const float2 gate_up_bias[2] = {bias_pair(bias + 8 * j, j), bias_pair(bias + 8 * (j + 1), j + 1)};
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float v[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            v[i] = glu_activation_fast<kActivation>(acc[j + i][2 * half] + gate_up_bias[i].x, acc[j + i][2 * half + 1] + gate_up_bias[i].y);
          }
          const float other = __shfl_xor_sync(0xffffffffu, (c & 1) ? v[0] : v[1], 1);
          store4_shared(piece(g + 8 * half, (j - j0) / 2) + 4 * word, (c & 1) ? pack2<bf16>(other, v[1]) : pack2<bf16>(v[0], other));
        }
      }
      write_staged(act_rows[0] + 4 * j0, act_rows[1] + 4 * j0);
    }
  } else {
    // Concatenated: units u, u + 1 at j: gate_acc[j] and up_acc[j].
    const int u0 = t.n0 / 2 + n_off / 2 + 2 * c;
    const long long bias = t.expert * p.w13_bias_expert_stride;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (r0 + 8 * half >= t.count) continue;
      u32* out = reinterpret_cast<u32*>(act + (t.first + r0 + 8 * half) * static_cast<long long>(inter) + u0);
#pragma unroll
      for (int j0 = 0; j0 < kN / 16; j0 += 8) {
        if (2 * j0 >= live_j) break;
#pragma unroll
        for (int j = j0; j < j0 + 8; ++j) {
          float v[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const GateUpRows rows = gate_up_rows<kLayout>(u0 + 8 * j + i, inter);
            v[i] = glu_activation_fast<kActivation>(gate_acc[j][2 * half + i] + moe_bias<kBias13>(p.w13_bias, bias + rows.gate),
                                                    up_acc[j][2 * half + i] + moe_bias<kBias13>(p.w13_bias, bias + rows.up));
          }
          out[4 * j] = pack2<bf16>(v[0], v[1]);
        }
      }
    }
  }
}

// The weight row of tile column `column` (0..191) of an MXFP4 tile, and whether it exists: W13
// rows n0 + column with gate and up interleaved, and for down W2's; with gate and up concatenated,
// the gate rows of the tile's 96 units, then their up rows, as the epilogue reads them.
template <bool kUp, int kLayout>
__device__ __forceinline__ int mxfp4_tile_row(const KilnMoeParams& p, int n0, int column, int n_total, bool* valid) {
  if (kUp && kLayout != kGateUpInterleaved) {
    constexpr int kUnits = kMoeMxfp4TileN / 2;
    const int up = column >= kUnits, unit = n0 / 2 + column - (up ? kUnits : 0);
    *valid = unit < p.intermediate;
    return up ? p.intermediate + unit : unit;
  }
  *valid = n0 + column < n_total;
  return n0 + column;
}

// Where expert `expert`'s MXFP4 weight row `row` keeps its scale bytes, one per 32 values.
template <bool kUp>
__device__ __forceinline__ const unsigned char* mxfp4_scale_row(const KilnMoeParams& p, int expert, long long row) {
  return (kUp ? p.w13_scale : p.w2_scale) + expert * (kUp ? p.w13_scale_expert_stride : p.w2_scale_expert_stride) +
         row * (kUp ? p.w13_scale_row_stride : p.w2_scale_row_stride);
}

// Where one MXFP4 copier is in the CTA's tiles. CTA c starts with tile c and claims each later
// one from `counter` (zeroed) a tile ahead, as the bf16 producer does: tiles of at most 64 pairs
// run half the MMAs of full ones, so CTAs dealt a fixed share ended the phase apart. Copier 0
// claims and publishes the tile in `claims[turn % 2]`; the copiers meet at a named barrier at each
// tile's end and all take it. Copier i makes copies i, i + 128 and i + 256 of each slice (copy j:
// tile row j / 2, half j % 2 of its 64 K values); `packed_now[n]` and `scale_now[n]`: the 16 bytes
// of weights of its copy n at slice `ks` of the tile and their scale byte, null where the weight
// row does not exist or the phase is over.
template <bool kUp, int kLayout>
struct MoeWeightCursor {
  static constexpr int kCopies = kMoeMxfp4CopiesPerCopier;
  MoeGemmTile t;
  int tile, ks, turn;
  int *claims, *counter;  // shared (two ints), global
  const unsigned char *packed_now[kCopies], *scale_now[kCopies];

  static __device__ int copy_index(int copier, int n) { return copier + kMoeCopierThreads * n; }
  __device__ void start(const KilnMoeParams& p, const MoeGemmShape<kUp, kMoeMxfp4TileN>& s, int copier, int* claims_, int* counter_) {
    tile = blockIdx.x;
    ks = turn = 0;
    claims = claims_;
    counter = counter_;
    claim(s, copier);
    begin_tile(p, s, copier);
  }
  __device__ void advance(const KilnMoeParams& p, const MoeGemmShape<kUp, kMoeMxfp4TileN>& s, int copier) {
    if (++ks < s.k_steps) {
#pragma unroll
      for (int n = 0; n < kCopies; ++n) {
        if (packed_now[n] != nullptr) {  // 32 bytes and 2 scales further along the row per 64-deep slice
          packed_now[n] += 32;
          scale_now[n] += 2;
        }
      }
      return;
    }
    ks = 0;
    named_barrier_sync(kMoeCopierBarrier, kMoeCopierThreads);  // copier 0's claim is visible
    tile = claims[turn & 1];
    ++turn;
    claim(s, copier);
    begin_tile(p, s, copier);
  }
  __device__ bool done(const MoeGemmShape<kUp, kMoeMxfp4TileN>& s) const { return tile >= s.total_tiles; }

 private:
  // The tile after this one, into the slot the others read after the next barrier (they read the
  // other slot at the last one).
  __device__ void claim(const MoeGemmShape<kUp, kMoeMxfp4TileN>& s, int copier) {
    if (copier == 0 && tile < s.total_tiles) claims[turn & 1] = gridDim.x + atomic_add_global(counter, 1);
  }
  __device__ void begin_tile(const KilnMoeParams& p, const MoeGemmShape<kUp, kMoeMxfp4TileN>& s, int copier) {
#pragma unroll
    for (int n = 0; n < kCopies; ++n) packed_now[n] = scale_now[n] = nullptr;
    if (tile >= s.total_tiles) return;
    t = s.tile(p, tile);
#pragma unroll
    for (int n = 0; n < kCopies; ++n) {
      const int copy = copy_index(copier, n), half = copy & 1;
      bool valid = false;
      const long long row = mxfp4_tile_row<kUp, kLayout>(p, t.n0, copy >> 1, s.n_total, &valid);
      if (!valid) continue;
      packed_now[n] = static_cast<const unsigned char*>(kUp ? p.w13 : p.w2) + t.expert * (kUp ? p.w13_expert_stride : p.w2_expert_stride) +
                      row * (kUp ? p.w13_row_stride : p.w2_row_stride) + 16 * half;
      scale_now[n] = mxfp4_scale_row<kUp>(p, t.expert, row) + half;
    }
  }
};

// Where tile row `row`'s 16-byte half `half` of a slice's weights sits in the stage's raw
// weights: XOR-swizzled so that the copies (consecutive rows and halves) and the math threads'
// 8-byte reads (rows 2 g or g of a warp, in moe_gemm_mxfp4_fragments) each meet every bank
// group equally.
__device__ __forceinline__ unsigned mxfp4_raw_offset(int row, int half) {
  return 16u * static_cast<unsigned>((2 * row + half) ^ (((row >> 2) & 3) << 1));
}

// The MXFP4 copiers' whole phase, by warpgroup 3, from the CTA's running slice count;
// returns the count after it. Once a stage is released, every copier makes its three copies
// (MoeWeightCursor): 16 bytes of weights and the aligned word holding their scale byte each, into
// the stage by cp.async (zeros where the row does not exist), whose completion arrives on the
// stage's full barrier (cp.async.mbarrier.arrive); lane 0 of copier warp slice % 4 also names the
// slice's tile and copies its x or act rows by TMA, as the bf16 producer does. The
// copiers never wait for their copies, so they run as far ahead as the stages allow.
template <bool kUp, int kFormat, int kLayout>
__device__ __forceinline__ int moe_gemm_copy_mxfp4(const KilnMoeParams& p, const MoeGemmShape<kUp, kMoeMxfp4TileN>& s,
                                                   const MoeGemmPipelineOf<kFormat>& pipe, int slice, int* counter) {
  using Pipe = MoeGemmPipelineOf<kFormat>;
  constexpr int kWarps = kMoeCopierThreads / 32;
  const int copier = threadIdx.x - kMoeMxfp4MathThreads, warp = copier >> 5, lane = copier & 31;
  const void* const x_map = &p.tensor_maps[kUp ? kMoeMapXGrouped : kMoeMapAct];
  const void* const weights = kUp ? p.w13 : p.w2;
  if (copier == 0) tma_prefetch_map(x_map);
  MoeWeightCursor<kUp, kLayout> at;
  at.start(p, s, copier, pipe.claims, counter);
  for (;; ++slice) {
    const unsigned full = pipe.full_barrier(slice), stage = pipe.stage(slice);
    const bool end = at.done(s);
    if (slice >= Pipe::kStages) {
      const int before = slice - Pipe::kStages;
      mbarrier_wait(pipe.empty_barrier(slice), Pipe::parity(before));
      // Each arrival of this thread on a barrier is matched by a wait of its own (synccheck).
      mbarrier_wait(pipe.full_barrier(before), Pipe::parity(before));
    }
    if (lane == 0 && slice % kWarps == warp) {
      if (end || at.ks == 0) pipe.tile_of_stage[Pipe::index(slice)] = end ? -1 : at.tile;
      mbarrier_arrive(pipe.told_barrier(slice));
      mbarrier_wait(pipe.told_barrier(slice), Pipe::parity(slice));  // its one arrival completed the phase
      if (end) {
        mbarrier_arrive(full);
      } else {
        const int boxes = (at.t.count + kMoeMxfp4XBoxRows - 1) / kMoeMxfp4XBoxRows;
        mbarrier_arrive_expect_tx(full, boxes * kMoeMxfp4XBoxRows * kMoeTileK * 2);
        for (int box = 0; box < boxes; ++box)
          tma_load_2d(stage + box * kMoeMxfp4XBoxRows * 128, x_map, full, at.ks * kMoeTileK, at.t.first + box * kMoeMxfp4XBoxRows);
      }
    }
    if (end) {
      mbarrier_arrive(full);
      return slice + 1;
    }
    const unsigned raw = stage + kMoeMxfp4XBytes;
#pragma unroll
    for (int n = 0; n < MoeWeightCursor<kUp, kLayout>::kCopies; ++n) {
      const int copy = MoeWeightCursor<kUp, kLayout>::copy_index(copier, n);
      const bool valid = at.packed_now[n] != nullptr;
      copy16_async_or_zero(raw + mxfp4_raw_offset(copy >> 1, copy & 1), valid ? at.packed_now[n] : weights, valid);
      copy4_async_or_zero(raw + kMoeMxfp4RawBytes + 4 * copy,
                          valid ? reinterpret_cast<const void*>(reinterpret_cast<unsigned long long>(at.scale_now[n]) & ~3ull) : weights,
                          valid);
    }
    copies_arrive_on(full);
    at.advance(p, s, copier);
  }
}

// Two rows' 16 values each (two words a row) times their scales, as bf16 pairs (values i and
// i + 4 of word w in pair 4 w + i).
template <int kFormat, bool kLargeScales>
__device__ __forceinline__ void mxfp4_rows_to_bf16x2(const u32 (&words)[2][2], const u32 (&bits)[2], u32 (&pairs)[2][8]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const u32 scale = mxfp4_scale_bf16x2<kLargeScales>(bits[i]);
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      u32 four[4];
      mxfp4_word_to_bf16x2<kFormat, kLargeScales>(words[i][w], scale, four);
#pragma unroll
      for (int v = 0; v < 4; ++v) pairs[i][4 * w + v] = four[v];
    }
  }
}

// Where slice ks's scale byte of a row sits in the word its copier copied whole: `scale_low` is
// the low two bits of the slice-0 byte's address, and each slice is two bytes on.
__device__ __forceinline__ unsigned moe_gemm_mxfp4_scale_shift(unsigned scale_low, int ks) { return 8 * ((scale_low + 2 * ks) & 3); }

// The e8m0 scale of tile row `row` for thread c of a quad: byte `shift` of the word at copy
// 2 row + c / 2's scale slot.
__device__ __forceinline__ u32 moe_gemm_mxfp4_scale_bits(unsigned raw, int row, int c, unsigned shift) {
  u32 scale_word;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(scale_word) : "r"(raw + kMoeMxfp4RawBytes + 4 * (2 * row + (c >> 1))));
  return (scale_word >> shift) & 0xFFu;
}

// One slice's A fragments of a math thread: its rows g and g + 8 (tile rows row[0] and row[1] of
// the stage's raw weights), values r = 16 c .. 16 c + 15 of each, times their scales (bytes
// `scale_shift`, moe_gemm_mxfp4_scale_bits), as bf16 pairs in fragment order.
template <int kFormat>
__device__ __forceinline__ void moe_gemm_mxfp4_fragments(unsigned raw, const int (&row)[2], int c, const unsigned (&scale_shift)[2],
                                                         u32 (&a)[kMoeTileK / 16][4]) {
  u32 words[2][2], bits[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];"
                 : "=r"(words[i][0]), "=r"(words[i][1])
                 : "r"(raw + mxfp4_raw_offset(row[i], c >> 1) + 8 * (c & 1)));
    bits[i] = moe_gemm_mxfp4_scale_bits(raw, row[i], c, scale_shift[i]);
  }
  u32 pairs[2][8];
  if (__any_sync(0xffffffffu, bits[0] > 128u || bits[1] > 128u))
    mxfp4_rows_to_bf16x2<kFormat, true>(words, bits, pairs);
  else
    mxfp4_rows_to_bf16x2<kFormat, false>(words, bits, pairs);
#pragma unroll
  for (int kk = 0; kk < kMoeTileK / 16; ++kk) {
    a[kk][0] = pairs[0][2 * kk];
    a[kk][1] = pairs[1][2 * kk];
    a[kk][2] = pairs[0][2 * kk + 1];
    a[kk][3] = pairs[1][2 * kk + 1];
  }
}

// Slice ks's e8m0 scale bytes of a math thread's rows (tile rows row[0] and row[1], for thread c
// of a quad) from the stage at `raw`, read once for both halves of the slice; true when some lane
// of the warp has a scale above 2 (moe_gemm_mxfp4_fragments).
__device__ __forceinline__ bool moe_gemm_mxfp4_slice_scales(unsigned raw, const int (&row)[2], int c, const unsigned (&scale_low)[2],
                                                            int ks, u32 (&bits)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) bits[i] = moe_gemm_mxfp4_scale_bits(raw, row[i], c, moe_gemm_mxfp4_scale_shift(scale_low[i], ks));
  return __any_sync(0xffffffffu, bits[0] > 128u || bits[1] > 128u);
}

// Half `half` of a slice's raw weights of a math thread from the stage at `raw`: its rows g and
// g + 8 (tile rows row[0] and row[1]), values 16 c + 8 half .. + 7 of each, one word a row.
__device__ __forceinline__ void moe_gemm_mxfp4_half_words(unsigned raw, const int (&row)[2], int c, int half, u32 (&words)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(words[i]) : "r"(raw + mxfp4_raw_offset(row[i], c >> 1) + 8 * (c & 1) + 4 * half));
}

// Those words times their scales (`bits`, `large`: moe_gemm_mxfp4_slice_scales) as the half's A
// fragments (k steps 2 half and 2 half + 1), bf16 pairs in fragment order: pair v of a word holds
// values v and v + 4.
template <int kFormat>
__device__ __forceinline__ void moe_gemm_mxfp4_half_fragments(const u32 (&words)[2], const u32 (&bits)[2], bool large, u32 (&a)[2][4]) {
  u32 pairs[2][4];
  if (large) {
#pragma unroll
    for (int i = 0; i < 2; ++i) mxfp4_word_to_bf16x2<kFormat, true>(words[i], mxfp4_scale_bf16x2<true>(bits[i]), pairs[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) mxfp4_word_to_bf16x2<kFormat, false>(words[i], mxfp4_scale_bf16x2<false>(bits[i]), pairs[i]);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    a[j][0] = pairs[0][2 * j];
    a[j][1] = pairs[1][2 * j];
    a[j][2] = pairs[0][2 * j + 1];
    a[j][3] = pairs[1][2 * j + 1];
  }
}

// One MXFP4 tile by one math warpgroup, whose first slice's stage is full (`slice` is advanced
// past the tile), with the operands swapped: D [192 weight rows, kN pairs] = W x^T, the decoded
// weights the register A operand of m64nNk16 (no shared-memory copy of them, no proxy fence) and
// the x or act rows the TMA-copied B (kN = 64 for tiles of at most 64 pairs). Warpgroup w takes
// the tile's weight rows 64 w .. 64 w + 63; for up, thread (warp, g) holds the gate row of unit
// 32 w + 8 warp + g of the tile in its rows g and its up row in g + 8, so the activation needs no
// exchange. Epilogue: act at the unit's place in the MXFP4 GEMM K order (for down's copies), or y
// by pair, bf16.
template <int kN, bool kUp, int kFormat, int kActivation, int kLayout, int kBias13, int kBias2, class Pipe>
__device__ __forceinline__ void moe_gemm_tile_mxfp4(const KilnMoeParams& p, const MoeGemmShape<kUp, kMoeMxfp4TileN>& s, const Pipe& pipe,
                                                    const MoeGemmTile& t, int& slice, int warpgroup, bf16* act, bf16* y,
                                                    float (&acc_all)[kMoeMxfp4TileM / 8][4]) {
  float(&acc)[kN / 8][4] = *reinterpret_cast<float(*)[kN / 8][4]>(&acc_all[0][0]);
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  constexpr bool kConcat = kUp && kLayout != kGateUpInterleaved;
  const int unit_local = 32 * warpgroup + 8 * warp + g;  // up: this thread's unit of the tile's 96
  int row[2];                                            // tile rows (as the copiers place them) of fragment rows g, g + 8
  if (kUp) {
    row[0] = kConcat ? unit_local : 2 * unit_local;
    row[1] = kConcat ? kMoeMxfp4TileN / 2 + unit_local : 2 * unit_local + 1;
  } else {
    row[0] = 64 * warpgroup + 16 * warp + g;
    row[1] = row[0] + 8;
  }
  // Warpgroup-uniform: a warpgroup whose rows all lie past the projection's skips its MMAs.
  const bool live = kUp ? t.n0 / 2 + 32 * warpgroup < p.intermediate : t.n0 + 64 * warpgroup < p.hidden;
  // Where each row's scale byte sits in the word its copier copied: the byte address's low bits.
  unsigned scale_low[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    bool valid = false;
    const unsigned char* scale =
        mxfp4_scale_row<kUp>(p, t.expert, mxfp4_tile_row<kUp, kLayout>(p, t.n0, row[i], s.n_total, &valid)) + (c >> 1);
    scale_low[i] = static_cast<unsigned>(reinterpret_cast<unsigned long long>(scale)) & 3u;
  }
  if (!live) {  // release the tile's slices as they fill
    for (int ks = 0; ks < s.k_steps; ++ks, ++slice) {
      if (ks > 0) mbarrier_wait(pipe.full_barrier(slice), Pipe::parity(slice));  // the first: waited by the caller
      mbarrier_arrive(pipe.empty_barrier(slice));
    }
    return;
  }
  // The x or act rows' descriptors: stage 0's plus whole stages and 32-byte K steps, in the
  // address field's 16-byte units (shared addresses stay below its 256 KB reach).
  const unsigned long long x_descriptor = wgmma_descriptor(pipe.stage(0), 16, 1024);
  if constexpr (kMoeMxfp4TileM <= 128) {
    // A whole slice decoded ahead: fewer waits a slice than by halves (7% at T = 1024 and 2048 on an
    // H200, bench/RESULTS.md).
    const auto decode = [&](int ks, u32(&a)[kMoeTileK / 16][4]) {
      const unsigned scale_shift[2] = {moe_gemm_mxfp4_scale_shift(scale_low[0], ks), moe_gemm_mxfp4_scale_shift(scale_low[1], ks)};
      moe_gemm_mxfp4_fragments<kFormat>(pipe.stage(slice) + kMoeMxfp4XBytes, row, c, scale_shift, a);
    };
    // Slice ks's MMAs from `now` while slice ks + 1 is decoded into `next` (the caller has waited
    // for slice ks's stage; slice ks + 1's is waited here), then the stage is released. No branch
    // may separate the MMAs from the decode: ptxas would serialize the wgmmas.
    const auto step = [&](int ks, const u32(&now)[kMoeTileK / 16][4], u32(&next)[kMoeTileK / 16][4]) {
      const unsigned long long descriptor = x_descriptor + Pipe::index(slice) * (kMoeMxfp4StageBytes >> 4);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMoeTileK / 16; ++kk) wgmma_rs_k_major<bf16, kN>(acc, now[kk], descriptor + 2 * kk, ks > 0 || kk > 0);
      wgmma_commit();
      ++slice;
      if (ks + 1 < s.k_steps) {
        mbarrier_wait(pipe.full_barrier(slice), Pipe::parity(slice));
        decode(ks + 1, next);
      }
      wgmma_wait<0>();  // `now` is rewritten two slices on
      mbarrier_arrive(pipe.empty_barrier(slice - 1));
    };
    // Two fragment sets, named, not indexed, so they stay in registers.
    u32 a0[kMoeTileK / 16][4], a1[kMoeTileK / 16][4];
    decode(0, a0);
    for (int ks = 0; ks < s.k_steps; ks += 2) {
      step(ks, a0, a1);
      if (ks + 1 < s.k_steps) step(ks + 1, a1, a0);
    }
  } else {
    // The large-batch build: its 144-pair accumulators leave room for three half-slice fragment
    // sets only (two whole slices' spilled; so did the whole-slice decode inlined beside it for
    // the smaller tiles, and out of line, ptxas serialized every wgmma).
    // Slice ks's scale bytes and both halves' words, read together from stage `slice`'s.
    u32 bits[2], words[2][2];
    bool large = false;
    const auto load = [&](int ks) {
      const unsigned raw = pipe.stage(slice) + kMoeMxfp4XBytes;
      large = moe_gemm_mxfp4_slice_scales(raw, row, c, scale_low, ks, bits);
      moe_gemm_mxfp4_half_words(raw, row, c, 0, words[0]);
      moe_gemm_mxfp4_half_words(raw, row, c, 1, words[1]);
    };
    const auto decode = [&](int half, u32(&a)[2][4]) { moe_gemm_mxfp4_half_fragments<kFormat>(words[half], bits, large, a); };
    // Slice ks's MMAs from its two halves' fragments `lo` and `hi`, committed as two groups, while
    // slice ks + 1 is decoded (the caller has waited for slice ks's stage; slice ks + 1's is waited
    // here): its first half into `spare` once the group before these two (slice ks - 1's second half,
    // which read `spare`) is done, its second into `lo` once the first group is done. Slice ks's
    // second group is left in flight across the next slice's issue, so the tensor cores always hold
    // this warpgroup's next MMAs while it decodes; stage ks - 1 is released once its last group is
    // done. Three half-slice sets (24 registers, not two whole slices' 32) leave room for 144-pair
    // accumulators. No branch may separate the MMAs from the decode: ptxas would serialize the wgmmas.
    const auto step = [&](int ks, u32(&lo)[2][4], const u32(&hi)[2][4], u32(&spare)[2][4]) {
      const unsigned long long descriptor = wgmma_descriptor_advance(x_descriptor, Pipe::index(slice) * kMoeMxfp4StageBytes);
      wgmma_fence();
      wgmma_rs_k_major<bf16, kN>(acc, lo[0], descriptor, ks > 0);
      wgmma_rs_k_major<bf16, kN>(acc, lo[1], wgmma_descriptor_advance(descriptor, 32), 1);
      wgmma_commit();
      wgmma_rs_k_major<bf16, kN>(acc, hi[0], wgmma_descriptor_advance(descriptor, 64), 1);
      wgmma_rs_k_major<bf16, kN>(acc, hi[1], wgmma_descriptor_advance(descriptor, 96), 1);
      wgmma_commit();
      ++slice;
      wgmma_wait<2>();  // slice ks - 1 is done: `spare` is free
      if (ks > 0) mbarrier_arrive(pipe.empty_barrier(slice - 2));
      const bool more = ks + 1 < s.k_steps;
      if (more) {
        mbarrier_wait(pipe.full_barrier(slice), Pipe::parity(slice));
        load(ks + 1);
        decode(0, spare);
      }
      wgmma_wait<1>();  // `lo` is free
      if (more) decode(1, lo);
    };
    // The three sets, named, not indexed, so they stay in registers; their roles rotate every slice.
    u32 f0[2][4], f1[2][4], f2[2][4];
    load(0);
    decode(0, f0);
    decode(1, f1);
    for (int ks = 0; ks < s.k_steps; ks += 3) {
      step(ks, f0, f1, f2);
      if (ks + 1 < s.k_steps) step(ks + 1, f2, f0, f1);
      if (ks + 2 < s.k_steps) step(ks + 2, f1, f2, f0);
    }
    wgmma_wait<0>();
    mbarrier_arrive(pipe.empty_barrier(slice - 1));
  }
  wgmma_fence_operands(acc);
  if (kUp) {
    const int unit = t.n0 / 2 + unit_local;
    if (unit >= p.intermediate) return;
    const GateUpRows rows = gate_up_rows<kLayout>(unit, p.intermediate);
    const long long bias = t.expert * p.w13_bias_expert_stride;
    const float gate_bias = moe_bias<kBias13>(p.w13_bias, bias + rows.gate), up_bias = moe_bias<kBias13>(p.w13_bias, bias + rows.up);
    // The unit's place in its 64-deep slice of down's K, in the GEMMs' K order.
    bf16* const column = act + static_cast<long long>(t.first) * p.intermediate + (unit & ~63) + mxfp4_gemm_k_position(unit & 63);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * j + 2 * c + e;
        if (n < t.count)
          column[static_cast<long long>(n) * p.intermediate] =
              from_float<bf16>(glu_activation_fast<kActivation>(acc[j][e] + gate_bias, acc[j][2 + e] + up_bias));
      }
    }
  } else {
    // This thread's rows h (both or neither inside the projection: H is a multiple of 64).
    const int h = t.n0 + row[0];
    if (h >= p.hidden) return;
    const long long bias = t.expert * p.w2_bias_expert_stride + h;
    const float b0 = moe_bias<kBias2>(p.w2_bias, bias), b1 = moe_bias<kBias2>(p.w2_bias, bias + 8);
    // The tile's pair ids, listed by other CTAs: lane l loads pairs l, l + 32, ... in one round
    // trip, and each thread takes its columns' ids by shuffles. (Loaded one a column, each load
    // waited for the store before it: 36 round trips to L2 a tile.)
    int ids[(kN + 31) / 32];
#pragma unroll
    for (int i = 0; i < (kN + 31) / 32; ++i) {
      const int n = 32 * i + lane;
      ids[i] = n < t.count ? *reinterpret_cast<const volatile int*>(&s.pairs[t.first + n]) : 0;
    }
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * j + 2 * c + e;
        const int pair = __shfl_sync(0xffffffffu, ids[j / 4], 8 * (j % 4) + 2 * c + e);
        if (n >= t.count) continue;
        bf16* const out = y + static_cast<long long>(pair) * p.hidden + h;
        out[0] = from_float<bf16>(acc[j][e] + b0);
        out[8] = from_float<bf16>(acc[j][2 + e] + b1);
      }
    }
  }
}

// A math warpgroup's whole phase, from the CTA's running slice count, through the end marker;
// returns the count after it.
// MXFP4's tiles give each warpgroup 64 weight rows against all of the tile's pairs.
template <int kFormat, bool kUp, int kActivation, int kLayout, int kBias13, int kBias2>
__device__ __forceinline__ int moe_gemm_consume(const KilnMoeParams& p, const MoeGemmShape<kUp, MoeGemmTileN<kFormat>::value>& s,
                                                const MoeGemmPipelineOf<kFormat>& pipe, int slice, int warpgroup, bf16* act, bf16* y,
                                                unsigned staging) {
  using Pipe = MoeGemmPipelineOf<kFormat>;
  constexpr int kTileN = MoeGemmTileN<kFormat>::value;
  // A math thread's accumulators, in which every tile shape accumulates (ptxas spilled kilobytes
  // with an array per shape): m64n256 with bf16 weights, up to kMoeMxfp4TileM pairs with MXFP4.
  float acc[(kTileN == kMoeMxfp4TileN ? kMoeMxfp4TileM : kTileN) / 8][4];
  for (;;) {
    // `told` completes once per slice; it cannot run a phase ahead of this wait, since the stage
    // is refilled only after this slice is released.
    mbarrier_wait(pipe.told_barrier(slice), Pipe::parity(slice));
    mbarrier_wait(pipe.full_barrier(slice), Pipe::parity(slice));
    const int tile = *reinterpret_cast<volatile int*>(&pipe.tile_of_stage[Pipe::index(slice)]);
    if (tile < 0) {  // the end marker
      mbarrier_arrive(pipe.empty_barrier(slice));
      return slice + 1;
    }
    MoeGemmTile t = s.tile(p, tile);
    t.count = __shfl_sync(0xffffffffu, t.count, 0);  // provably uniform: ptxas keeps the wgmmas unserialized
    t.n0 = __shfl_sync(0xffffffffu, t.n0, 0);
    if constexpr (kTileN == kMoeMxfp4TileN) {
      if (t.count <= 64)
        moe_gemm_tile_mxfp4<64, kUp, kFormat, kActivation, kLayout, kBias13, kBias2>(p, s, pipe, t, slice, warpgroup, act, y, acc);
      else if (kMoeMxfp4TileM <= 128 || t.count <= 128)
        moe_gemm_tile_mxfp4<128, kUp, kFormat, kActivation, kLayout, kBias13, kBias2>(p, s, pipe, t, slice, warpgroup, act, y, acc);
      else if constexpr (kMoeMxfp4TileM > 128)
        moe_gemm_tile_mxfp4<144, kUp, kFormat, kActivation, kLayout, kBias13, kBias2>(p, s, pipe, t, slice, warpgroup, act, y, acc);
    } else {
      if (t.count <= 64)
        moe_gemm_tile<128, false, kUp, kActivation, kLayout, kBias13, kBias2>(p, s, pipe, t, slice, warpgroup, act, y, staging, acc);
      else if (moe_gemm_warpgroup_columns(t, s.n_total) == 128)
        moe_gemm_tile<128, true, kUp, kActivation, kLayout, kBias13, kBias2>(p, s, pipe, t, slice, warpgroup, act, y, staging, acc);
      else
        moe_gemm_tile<256, true, kUp, kActivation, kLayout, kBias13, kBias2>(p, s, pipe, t, slice, warpgroup, act, y, staging, acc);
    }
  }
}

// One projection over all tiles. kUp: A = x_grouped rows (K = H), B = W13 rows, out act (bf16,
// grouped order); else A = act rows (K = I), B = W2 rows, out y (bf16, by pair). `slice`: the
// CTA's running slice count over both phases (the barriers' phases follow it). CTA c starts with
// tile c; the producer (bf16 weights) or the first copier (MXFP4) claims each later one from
// `tile_counter` (zeroed) as it starts loading the one before, so tiles go out in order as CTAs
// free up: the pair blocks that share a weight tile run at the same time whatever each tile costs,
// and no CTA is left with a queue at the end.
// With bf16 weights warpgroups 0 and 1 run the MMAs and epilogues, the first thread of warpgroup 2
// issues every copy, and its other threads wait at the end; with MXFP4 warpgroups 0 to 2 decode
// and run the MMAs, and warpgroup 3 copies. (Moving registers from warpgroup 2 to the MMA
// warpgroups with setmaxnreg hung the kernel on an H200, bench/RESULTS.md; the MMA warpgroups keep
// the kernel's 168 registers a thread, enough for the m64n256 accumulators.)
template <int kFormat, bool kUp, int kActivation, int kLayout, int kBias13, int kBias2>
__device__ void moe_gemm_phase(const KilnMoeParams& p, const MoeGemmPipelineOf<kFormat>& pipe, int& slice, const int* mtile_start,
                               const int* pair_start, const int* pairs, bf16* act, bf16* y, unsigned staging, int* tile_counter) {
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  const MoeGemmShape<kUp, MoeGemmTileN<kFormat>::value> s(p, mtile_start, pair_start, pairs);
  // Every thread that takes part in the phase ends with the count after its end marker; the bf16
  // producer's idle warpgroup takes it from the producer after the barrier. The MXFP4 copiers pass
  // nothing through shared memory here: compute-sanitizer's racecheck reports a copier's write
  // before this barrier and a math thread's read after it as a hazard once the copiers have met at
  // their named barrier.
  bool counted = true;
  if (warpgroup < moe_gemm_math_threads(kFormat != kWeightsBf16) / 128) {
    slice = moe_gemm_consume<kFormat, kUp, kActivation, kLayout, kBias13, kBias2>(p, s, pipe, slice, warpgroup, act, y, staging);
    // act (up) is read by down's copies after the grid barrier that follows.
    if (kUp) fence_async_global();
  } else {
    if constexpr (kFormat != kWeightsBf16) {
      slice = moe_gemm_copy_mxfp4<kUp, kFormat, kLayout>(p, s, pipe, slice, tile_counter);
    } else {
      counted = false;
      if (threadIdx.x == kMoeProducerThread) *pipe.slice_after = moe_gemm_produce<kUp, kLayout>(p, s, pipe, slice, tile_counter);
      __syncwarp();
    }
  }
  __syncthreads();
  if (!counted) slice = *pipe.slice_after;
}

}  // namespace kiln
