// The tensor-core phases of moe_stream (moe/moe_stream.cuh) for bf16 weights on sm_90a: the up
// and down projections as grouped GEMMs on wgmma, when the launch gives the kernel the shared
// memory for them (src/kernels/moe_stream.cpp decides by token count). Each is a persistent loop
// over tiles (expert, 256 output columns, 128 of the expert's routed pairs), the pairs' rows
// fastest, so the CTAs that share an expert's weight tile run at the same time. A tile's rows are
// gathered: x rows of the pairs' tokens (up) or their act rows (down). Operands stream through
// four shared-memory stages of 64-deep K slices by cp.async, in the 128-byte swizzle, two slices
// ahead; four warpgroups each own 64 rows x 128 columns of the tile (m64n128k16).
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

// One projection over all tiles. kUp: A = x rows of the pairs' tokens (K = H), B = W13 rows, out
// act (bf16); else A = act rows (K = I), B = W2 rows, out y (bf16). `act` and `y` are bf16 here.
template <bool kUp, int kActivation, int kLayout, int kBias13, int kBias2>
__device__ void moe_gemm_phase(const KilnMoeParams& p, unsigned char* stages, const int* mtile_start, const int* pair_start,
                               const int* pairs, bf16* act, bf16* y) {
  const int tid = threadIdx.x, warpgroup = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int inter = p.intermediate, hidden = p.hidden, experts = p.num_experts;
  const int k_total = kUp ? hidden : inter, n_total = kUp ? 2 * inter : hidden;
  const int n_tiles = (n_total + kMoeTileN - 1) / kMoeTileN, k_steps = k_total / kMoeTileK;
  const int total_tiles = mtile_start[experts] * n_tiles;
  // Each thread copies 16-byte chunk `chunk` of tile rows row0 + 64 j: 2 A rows, 4 B rows per slice.
  const int chunk = tid & 7, row0 = tid >> 3;
  const unsigned swizzled = swizzle128_offset(row0, chunk);  // rows step by 64: the swizzle repeats
  const unsigned stage_base = shared_address(stages);
  const int m_off = (warpgroup & 1) * 64, n_off = (warpgroup >> 1) * 128;

  for (int tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    const MoeGemmTile t = find_gemm_tile(mtile_start, pair_start, experts, n_tiles, tile);
    const bf16* a_row[2];
    const bf16* b_row[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = row0 + 64 * j;
      const int pair = r < t.count ? *reinterpret_cast<const volatile int*>(&pairs[t.first + r]) : -1;
      a_row[j] = pair < 0 ? nullptr
                 : kUp    ? static_cast<const bf16*>(p.x) + (pair / p.top_k) * p.x_row_stride
                          : act + static_cast<long long>(pair) * inter;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = t.n0 + row0 + 64 * j;
      const int w_row = !kUp || kLayout == kGateUpInterleaved ? n : ((n & 1) ? inter + (n >> 1) : n >> 1);
      b_row[j] = n >= n_total ? nullptr
                 : kUp        ? static_cast<const bf16*>(p.w13) + t.expert * p.w13_expert_stride + w_row * p.w13_row_stride
                              : static_cast<const bf16*>(p.w2) + t.expert * p.w2_expert_stride + w_row * p.w2_row_stride;
    }
    // K slice `ks` into `stage`: A rows at the stage's start, B rows after them; rows past the
    // pairs or the columns zero-filled.
    auto issue = [&](int ks, int stage) {
      unsigned char* a_tile = stages + stage * kMoeStageBytes + swizzled;
      unsigned char* b_tile = a_tile + kMoeTileM * 128;
      const int k0 = ks * kMoeTileK + chunk * 8;
#pragma unroll
      for (int j = 0; j < 2; ++j) copy16_async_or_zero(a_tile + j * 64 * 128, a_row[j] ? a_row[j] + k0 : static_cast<const bf16*>(p.x), a_row[j] != nullptr);
#pragma unroll
      for (int j = 0; j < 4; ++j) copy16_async_or_zero(b_tile + j * 64 * 128, b_row[j] ? b_row[j] + k0 : static_cast<const bf16*>(p.x), b_row[j] != nullptr);
      commit_copies();
    };
    issue(0, 0);
    if (k_steps > 1) issue(1, 1);
    else commit_copies();

    float acc[16][4];
    for (int ks = 0; ks < k_steps; ++ks) {
      const int stage = ks % kMoeStages;
      wait_copies<1>();
      fence_async_shared();
      __syncthreads();  // slice ks landed for every thread; slice ks - 2's MMAs are done (waited below)
      if (ks + 2 < k_steps) issue(ks + 2, (ks + 2) % kMoeStages);
      else commit_copies();  // an empty group keeps the wait count above uniform
      const unsigned a_address = stage_base + stage * kMoeStageBytes + m_off * 128;
      const unsigned b_address = stage_base + stage * kMoeStageBytes + kMoeTileM * 128 + n_off * 128;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMoeTileK / 16; ++kk) {
        wgmma_ss<bf16, 128>(acc, wgmma_descriptor(a_address + kk * 32, 16, 1024), wgmma_descriptor(b_address + kk * 32, 16, 1024),
                            ks > 0 || kk > 0);
      }
      wgmma_commit();
      wgmma_wait<1>();
    }
    wgmma_wait<0>();
    wgmma_fence_operands(acc);

    // Epilogue: this thread's rows m_off + 16 warp + g (+ 8), columns n_off + 8 j + 2 c (+ 1).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m_off + warp * 16 + g + 8 * half;
      if (r >= t.count) continue;
      const int pair = *reinterpret_cast<const volatile int*>(&pairs[t.first + r]);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int n = t.n0 + n_off + 8 * j + 2 * c;
        if (n >= n_total) continue;
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
    __syncthreads();  // every warpgroup is done with the stages before the next tile refills them
  }
}

}  // namespace kiln
