// The tensor-core phases of moe_stream (moe/moe_stream.cuh) for bf16 weights on sm_90a: the up
// and down projections as grouped GEMMs on wgmma, when the launch gives the kernel the shared
// memory for them (src/kernels/moe_stream.cpp decides by token count). Each is a persistent loop
// over tiles (expert, 256 output columns, 128 of the expert's routed pairs), the pairs' rows
// fastest, so the CTAs that share an expert's weight tile run at the same time. A tile's rows are
// gathered: x rows of the pairs' tokens (up) or their act rows (down). Operands stream through
// four shared-memory stages of 64-deep K slices by cp.async, in the 128-byte swizzle, two slices
// ahead across tile boundaries; four warpgroups each own 64 rows x 128 columns of the tile
// (m64n128k16), or, for an expert's last tile when it holds at most 64 pairs, 64 x 64 of a
// 64 x 256 tile (m64n64k16, half the MMA work).
//   up    act[pair][u] = activation(gate, up) + biases, bf16, for intermediate units u. Tile
//         column q holds gate (q even) and up (q odd) of unit (n0 + q) / 2 in both layouts: for
//         concatenated weights the B tile's rows are interleaved as they are loaded.
//   down  y[pair][h] = act[pair] . W2[e][h] + bias, rounded to bf16.
#pragma once

#include "common/mma_sm80.cuh"
#include "common/wgmma_sm90.cuh"
#include "moe/moe_common.cuh"
#include "moe/stream_workspace.h"

namespace kiln {

enum {
  kMoeTileM = KILN_MOE_GEMM_ROWS,  // routed pairs per tile
  kMoeTileN = 256,  // output columns per tile
  kMoeTileK = 64,   // one 128-byte swizzle atom of 16-bit values
  kMoeStages = 4,
  kMoeStageBytes = (kMoeTileM + kMoeTileN) * kMoeTileK * 2,
};
static_assert(kMoeStages * kMoeStageBytes + 1024 == KILN_MOE_GEMM_SHARED_BYTES, "moe/stream_workspace.h sizes these stages");

// One tile: expert, first pair (index into the grouped pair list), pairs in it, first column.
struct MoeGemmTile {
  int expert, first, count, n0;
};

// Tile `tile` of the order (expert, column block, pair block) with pair blocks fastest.
__device__ __forceinline__ MoeGemmTile find_gemm_tile(const int* mtile_start, const int* pair_start, int experts, int n_tiles, int tile) {
  const int e = find_expert(mtile_start, experts, tile, n_tiles);
  const int m_tiles = mtile_start[e + 1] - mtile_start[e], local = tile - mtile_start[e] * n_tiles;
  MoeGemmTile t;
  t.expert = e;
  t.first = pair_start[e] + (local % m_tiles) * kMoeTileM;
  t.count = min(kMoeTileM, pair_start[e + 1] - t.first);
  t.n0 = (local / m_tiles) * kMoeTileN;
  return t;
}

// What one projection's tiles share, from the parameters and the group phase's offsets.
template <bool kUp>
struct MoeGemmShape {
  const int *mtile_start, *pair_start, *pairs;
  int n_total, n_tiles, total_tiles, k_steps;
  __device__ MoeGemmShape(const KilnMoeParams& p, const int* mtile_start_, const int* pair_start_, const int* pairs_)
      : mtile_start(mtile_start_), pair_start(pair_start_), pairs(pairs_) {
    n_total = kUp ? 2 * p.intermediate : p.hidden;  // a multiple of 64
    n_tiles = (n_total + kMoeTileN - 1) / kMoeTileN;
    total_tiles = mtile_start[p.num_experts] * n_tiles;
    k_steps = (kUp ? p.hidden : p.intermediate) / kMoeTileK;
  }
  __device__ MoeGemmTile tile(const KilnMoeParams& p, int index) const {
    return find_gemm_tile(mtile_start, pair_start, p.num_experts, n_tiles, index);
  }
};

// Feeds one projection's K slices into the stages two slices ahead of the MMAs, over the CTA's
// whole sequence of tiles: the next tile's first slices load under this tile's last MMAs and its
// epilogue. Each thread copies 16-byte chunk tid % 8 of tile rows tid / 8 + 64 j (A: j < 2; B:
// j < 4). Rows past the tile's pairs or past the projection's columns are not loaded: they only
// feed accumulator rows and columns that the epilogue drops.
template <bool kUp, int kLayout>
struct MoeGemmProducer {
  // This thread's rows of one tile: A rows as token (up) or pair (down) indices (-1: not loaded),
  // the first B row (B row j is b + j * b_step()), and the B row groups (of 64) in the columns.
  struct Rows {
    int a[2];
    const bf16* b;
    int b_rows;
  };
  Rows rows, next;  // of the tile being loaded, and of the CTA's tile after it
  int ks;           // the K step to load next, of `rows`' tile
  bool more;        // a tile is being loaded; `has_next`: `next` holds one
  bool has_next;

  static __device__ __forceinline__ bool concat() { return kUp && kLayout != kGateUpInterleaved; }
  static __device__ __forceinline__ long long b_step(const KilnMoeParams& p) {
    // Tile column q of the up projection is gate (q even) or up (q odd) of unit (n0 + q) / 2: for
    // concatenated weights rows q and q + 64 are 32 weight rows apart.
    return (concat() ? 32 : 64) * (kUp ? p.w13_row_stride : p.w2_row_stride);
  }

  static __device__ Rows rows_of(const KilnMoeParams& p, const MoeGemmShape<kUp>& s, const MoeGemmTile& t) {
    const int row0 = threadIdx.x >> 3;
    Rows r;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int m = row0 + 64 * j;
      const int pair = m < t.count ? *reinterpret_cast<const volatile int*>(&s.pairs[t.first + m]) : -1;
      r.a[j] = kUp && pair >= 0 ? pair / p.top_k : pair;
    }
    const int n = t.n0 + row0;
    const int w_row = concat() ? ((n & 1) ? p.intermediate + (n >> 1) : n >> 1) : n;
    r.b = kUp ? static_cast<const bf16*>(p.w13) + t.expert * p.w13_expert_stride + w_row * p.w13_row_stride
              : static_cast<const bf16*>(p.w2) + t.expert * p.w2_expert_stride + w_row * p.w2_row_stride;
    r.b_rows = min(4, (s.n_total - t.n0) / 64);
    return r;
  }

  // Looks up the CTA's tile after the one being consumed (`after`; none past the last tile).
  __device__ void look_ahead(const KilnMoeParams& p, const MoeGemmShape<kUp>& s, int after) {
    has_next = after < s.total_tiles;
    if (has_next) next = rows_of(p, s, s.tile(p, after));
  }

  // Loads the next slice into stage `slice` % kMoeStages (`slice`: the CTA's running count), or
  // past the CTA's last tile commits an empty group, which keeps the consumer's wait count uniform.
  // `first_stage`: stage 0's shared address plus this thread's swizzled chunk offset.
  __device__ void issue(const KilnMoeParams& p, const MoeGemmShape<kUp>& s, const bf16* act, unsigned first_stage, int slice) {
    if (more) {
      const unsigned a_tile = first_stage + (slice % kMoeStages) * kMoeStageBytes, b_tile = a_tile + kMoeTileM * 128;
      const int k0 = ks * kMoeTileK + (threadIdx.x & 7) * 8;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (rows.a[j] < 0) continue;
        const bf16* row = kUp ? static_cast<const bf16*>(p.x) + rows.a[j] * p.x_row_stride : act + static_cast<long long>(rows.a[j]) * p.intermediate;
        copy16_async_or_zero(a_tile + j * 64 * 128, row + k0, true);
      }
      const long long step = b_step(p);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j < rows.b_rows) copy16_async_or_zero(b_tile + j * 64 * 128, rows.b + j * step + k0, true);
      }
      if (++ks == s.k_steps) {
        ks = 0;
        more = has_next;
        rows = next;
        has_next = false;
      }
    }
    commit_copies();
  }
};

// The MMAs and epilogue of one tile. kN: columns per warpgroup. 128: a 128 x 256 tile, warpgroups
// 2 (rows) x 2 (columns), m64n128k16. 64: a tile of at most 64 pairs (an expert's last), 64 x 256,
// warpgroups 1 x 4, m64n64k16, at half the MMA work. `slice`: the CTA's running slice count at the
// tile's first K step.
template <int kN, bool kUp, int kActivation, int kLayout, int kBias13, int kBias2>
__device__ __forceinline__ void moe_gemm_tile(const KilnMoeParams& p, const MoeGemmShape<kUp>& s, MoeGemmProducer<kUp, kLayout>& producer,
                                              const MoeGemmTile& t, unsigned stage_base, unsigned first_stage, int slice,
                                              int warpgroup, bf16* act, bf16* y, float (&acc128)[16][4], const volatile int* next_tile) {
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int m_off = kN == 128 ? (warpgroup & 1) * 64 : 0, n_off = kN == 128 ? (warpgroup >> 1) * 128 : warpgroup * 64;
  // Warpgroup-uniform (the tile and warpgroup went through shuffles): column blocks wholly past the
  // projection's columns skip their MMAs.
  const bool live = t.n0 + n_off < s.n_total;
  // Both tile shapes accumulate in the same registers (separate arrays made ptxas spill).
  float(&acc)[kN / 8][4] = *reinterpret_cast<float(*)[kN / 8][4]>(&acc128[0][0]);
  for (int ks = 0; ks < s.k_steps; ++ks, ++slice) {
    wait_copies<1>();
    fence_async_shared();
    __syncthreads();  // slice `slice` landed for every thread; slice - 2's MMAs are done (waited below)
    if (ks == 0) producer.look_ahead(p, s, *next_tile);  // claimed before the barrier (moe_gemm_phase)
    producer.issue(p, s, act, first_stage, slice + 2);
    const unsigned stage = stage_base + (slice % kMoeStages) * kMoeStageBytes;
    const unsigned a_address = stage + m_off * 128, b_address = stage + kMoeTileM * 128 + n_off * 128;
    if (live) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMoeTileK / 16; ++kk) {
        wgmma_ss<bf16, kN>(acc, wgmma_descriptor(a_address + kk * 32, 16, 1024), wgmma_descriptor(b_address + kk * 32, 16, 1024),
                           ks > 0 || kk > 0);
      }
      wgmma_commit();
    }
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  if (!live) return;
  wgmma_fence_operands(acc);

  // Epilogue: this thread's rows m_off + 16 warp + g (+ 8), columns n_off + 8 j + 2 c (+ 1).
  const int inter = p.intermediate, hidden = p.hidden;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = m_off + warp * 16 + g + 8 * half;
    if (r >= t.count) continue;
    const int pair = *reinterpret_cast<const volatile int*>(&s.pairs[t.first + r]);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const int n = t.n0 + n_off + 8 * j + 2 * c;
      if (n >= s.n_total) continue;
      const float v0 = acc[j][2 * half], v1 = acc[j][2 * half + 1];
      if (kUp) {
        const int u = n >> 1;
        const GateUpRows rows = gate_up_rows<kLayout>(u, inter);
        const long long bias = t.expert * p.w13_bias_expert_stride;
        act[static_cast<long long>(pair) * inter + u] = from_float<bf16>(
            glu_activation<kActivation>(v0 + moe_bias<kBias13>(p.w13_bias, bias + rows.gate), v1 + moe_bias<kBias13>(p.w13_bias, bias + rows.up)));
      } else {
        const long long bias = t.expert * p.w2_bias_expert_stride + n;
        // n is even and H a multiple of 64: one aligned bf16 pair.
        *reinterpret_cast<u32*>(y + static_cast<long long>(pair) * hidden + n) =
            pack2<bf16>(v0 + moe_bias<kBias2>(p.w2_bias, bias), v1 + moe_bias<kBias2>(p.w2_bias, bias + 1));
      }
    }
  }
}

// One projection over all tiles. kUp: A = x rows of the pairs' tokens (K = H), B = W13 rows, out
// act (bf16); else A = act rows (K = I), B = W2 rows, out y (bf16). `act` and `y` are bf16 here.
// CTA c starts with tile c; each later tile is claimed from `tile_counter` (zeroed) while the one
// before it starts, so tiles go out in order as CTAs free up: the pair blocks that share a weight
// tile run at the same time whatever each tile costs, and no CTA is left with a queue at the end.
template <bool kUp, int kActivation, int kLayout, int kBias13, int kBias2>
__device__ void moe_gemm_phase(const KilnMoeParams& p, unsigned char* stages, const int* mtile_start, const int* pair_start,
                               const int* pairs, bf16* act, bf16* y, int* tile_counter) {
  __shared__ int claimed[2];  // the CTA's next tile, double-buffered by tile parity
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  const MoeGemmShape<kUp> s(p, mtile_start, pair_start, pairs);
  const unsigned stage_base = shared_address(stages);
  const unsigned first_stage = stage_base + swizzle128_offset(threadIdx.x >> 3, threadIdx.x & 7);  // rows step by 64: the swizzle repeats
  MoeGemmProducer<kUp, kLayout> producer;
  producer.more = blockIdx.x < s.total_tiles;
  if (producer.more) producer.rows = producer.rows_of(p, s, s.tile(p, blockIdx.x));
  producer.has_next = false;
  producer.ks = 0;
  producer.issue(p, s, act, first_stage, 0);
  producer.issue(p, s, act, first_stage, 1);

  int slice = 0, parity = 0;
  float acc[16][4];
  for (int tile = blockIdx.x; tile < s.total_tiles; slice += s.k_steps, parity ^= 1) {
    // Read after the tile's first barrier; the slot is rewritten two tiles on, after another.
    if (threadIdx.x == 0) claimed[parity] = gridDim.x + atomic_add_global(tile_counter, 1);
    MoeGemmTile t = s.tile(p, tile);
    t.count = __shfl_sync(0xffffffffu, t.count, 0);  // provably uniform: ptxas keeps the wgmmas unserialized
    t.n0 = __shfl_sync(0xffffffffu, t.n0, 0);
    if (t.count <= 64) moe_gemm_tile<64, kUp, kActivation, kLayout, kBias13, kBias2>(p, s, producer, t, stage_base, first_stage, slice, warpgroup, act, y, acc, &claimed[parity]);
    else moe_gemm_tile<128, kUp, kActivation, kLayout, kBias13, kBias2>(p, s, producer, t, stage_base, first_stage, slice, warpgroup, act, y, acc, &claimed[parity]);
    tile = *reinterpret_cast<volatile int*>(&claimed[parity]);
  }
  // Past the last tile only empty groups are pending; the grid barrier after the phase orders the
  // stages' reuse.
  wait_copies<0>();
}

}  // namespace kiln
