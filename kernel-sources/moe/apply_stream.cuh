// MoE layer for decode-sized token counts, bound by reading the weights. One cooperative launch:
// a CTA of 16 warps (MXFP4 weights) or 12 (bf16) per SM, all resident. Five phases are split by grid-wide barriers, and what
// passes between them lives in the workspace (moe/stream_workspace.h):
//   route    a warp per token: top-k by warp arg-max (ties go to the lower expert, as in the
//            reference), the weights, and a count per expert;
//   group    every (token, slot) pair listed under its expert;
//            (with at most 16 tokens on the streaming phases, every CTA routes and groups all
//            tokens itself in shared memory, and neither needs a grid barrier);
//   up       tile (expert, chunk of up to 8 of its pairs, 8 intermediate units): the gate and up
//            rows of the units against the chunk's tokens on mma.sync, then the activation: act;
//   down     tile (expert, chunk, 16 hidden rows of W2) against the chunk's act rows: y, bias
//            included;
//   combine  out[t] = sum over slots j of weight[t][j] * y[t, j], in slot order (deterministic).
// An expert's weights are read once per chunk of 8 tokens routed to it: exactly once at decode
// sizes. On sm_90a, from a token count on (src/kernels/moe_apply_stream.cpp), up and down are grouped
// GEMMs on wgmma instead (moe/apply_stream_gemm_sm90.cuh), with MXFP4 weights converted to bf16 in
// shared memory on the way; route, group and combine stay.
// Weights are read 16 bytes per lane: 8 bf16 one step ahead into registers, or 32 e2m1 values that
// share one e8m0 scale into a per-warp ring in shared memory, two steps ahead. act is stored as
// bf16 on both paths (the down GEMM's operand), y as f32 here and bf16 on the GEMMs.
// Device-resident topk_ids outside [0, E) contribute nothing (the host cannot check them).
// Launch: grid (SMs), block 32 kiln_moe_stream_warps(mxfp4), cooperative, workspace kiln_moe_stream_workspace(T, k, E, H, I);
// dynamic shared memory KILN_MOE_GEMM_SHARED_BYTES selects the GEMM phases (with MXFP4 weights,
// kiln_moe_gemm_mxfp4_shared_bytes and kiln_moe_mxfp4_gemm_pays),
// kiln_moe_ring_bytes the streaming ones with MXFP4 weights.
#pragma once

#include "common/atomics.cuh"
#include "common/cp_async.cuh"
#include "common/grid_barrier.cuh"
#include "common/mma_sm80.cuh"
#include "common/vector_memory.cuh"
#include "moe/moe_common.cuh"
#include "moe/mxfp4_decode.cuh"
#include "moe/routing.cuh"
#include "moe/stream_workspace.h"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // sm_90a: the grouped-GEMM phases on wgmma
#include "moe/apply_stream_gemm_sm90.cuh"
#endif

namespace kiln {

// Every expert's (token, slot) pairs in the workspace's list in pair order, a warp per expert
// reading all the routed ids 32 at a time: the same list, and so the same bits out, on every call
// (slots handed out by atomics ordered an expert's pairs differently from call to call, and the
// tiles and chunks that hold them with them).
__device__ __forceinline__ void list_pairs_in_order(const int* ids, int num_pairs, int experts, const int* pair_start, int* pairs, int warp,
                                                    int warps, int lane) {
  for (int e = warp; e < experts; e += warps) {
    int at = pair_start[e];
    const int end = pair_start[e + 1];
    for (int q0 = 0; q0 < num_pairs && at < end; q0 += kWarp) {
      const int q = q0 + lane;
      const bool mine = q < num_pairs && *reinterpret_cast<const volatile int*>(&ids[q]) == e;  // routed by other CTAs
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (mine) pairs[at + __popc(ballot & ((1u << lane) - 1u))] = q;
      at += __popc(ballot);
    }
  }
}

__device__ __forceinline__ u32 byte_permute(u32 a, u32 b, u32 selector) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// Eight bf16 in the MXFP4 path's k order: (x0, x4) (x1, x5) (x2, x6) (x3, x7).
__device__ __forceinline__ Bf16x8 mxfp4_k_order(const Bf16x8& v) {
  Bf16x8 r;
  r.w[0] = byte_permute(v.w[0], v.w[2], 0x5410u);
  r.w[1] = byte_permute(v.w[0], v.w[2], 0x7632u);
  r.w[2] = byte_permute(v.w[1], v.w[3], 0x5410u);
  r.w[3] = byte_permute(v.w[1], v.w[3], 0x7632u);
  return r;
}

// ---- up and down on mma.sync: every format and GPU, except bf16 from 16 routed pairs on sm_90a ----
// A tile is 16 weight rows of one expert against a chunk of up to 8 of its routed pairs: the
// m16n8k16 MMA's M and N. up: rows g and g + 8 of the tile are the gate and up rows of intermediate
// unit 8 j + g, so a lane's accumulators hold both halves of its units' activations; down: 16
// consecutive hidden rows. A step covers 4 pieces of each row: each lane loads 16 bytes of a weight
// row at a time (a "piece": 8 bf16, or 32 e2m1 values and their one scale), lane (g, t) piece
// 4 s + t of rows g and g + 8 in step s. An MMA sums over whatever k its four lanes t hold, so the
// pieces need not be adjacent in K: a lane's 8 A values of MMA i are values 4 i .. 4 i + 3 of its
// two pieces, and its B values the same k of token column g.
// MXFP4 values become bf16 in a few integer operations and are multiplied by their scale in bf16,
// exactly (an e2m1 value times a power of two is a bf16 unless it overflows, which f32 would too).
// The decode pairs values i and i + 4 of each 8 (see e2m1x8_to_tiny_bf16x2), so the MMA's k order
// within every 8 values is 0 4 1 5 2 6 3 7 for MXFP4: x is copied once in that order (into each
// CTA's shared memory when it routes locally, else into the workspace's x_reordered) and act is
// written in it.
enum { kMoeTileRows = 16 };

// A lane's weights of one step: 16 bytes of rows g and g + 8, and (MXFP4) their e8m0 scale bits.
struct MoeStepWeights {
  Bf16x8 lo, hi;
  u32 scale_lo, scale_hi;
};
// A lane's activations of one step: the k of its weights, of token column g.
template <int kFormat>
struct MoeStepActivations {
  enum { kPieceValues = kFormat != kWeightsBf16 ? 32 : 8 };
  u32 b[kPieceValues / 2];
};

// MXFP4 weights reach shared memory through cp.async, KILN_MOE_RING_STAGES - 1 steps ahead of the
// MMAs: loading one step ahead into registers left too few bytes in flight (on an H200, T = 1 took
// 58 us that way, 53 with the ring). Every warp has its own ring and every lane reads back only
// what it copied, so no barrier is needed. A stage holds the warp's 2 x 32 x 16 bytes of rows, then
// per lane the aligned words holding its two scale bytes (cp.async copies 4, 8 or 16 bytes). bf16
// weights are loaded one step ahead into registers: through the ring they were slower (T = 1 on
// an H200: 0.096 ms against 0.089).
enum { kMoeRingRowBytes = 2 * kWarp * 16, kMoeRingStages = KILN_MOE_RING_STAGES, kMoeRingStageBytes = kMoeRingRowBytes + kWarp * 8 };
enum { kMoeL2PrefetchUnits = 32 };

// Where one lane reads a tile's operands, and where its results go. The tile's second weight row
// (and its scales) sits a fixed distance after the first, the same for every tile of a phase
// (MoeRowDistance).
struct MoeMmaTile {
  const u8* row_lo;    // weight row g (bytes)
  const u8* scale_lo;  // its e8m0 scales (MXFP4)
  const bf16* b_row;   // activations of token column g (column 0's when g >= count)
  int out_pair[2];     // pairs of result columns 2t and 2t + 1, -1 past the chunk
  int expert, row_block;
  bool lo_valid, hi_valid;  // false past the matrix or past the tiles: read as zeros
};
struct MoeRowDistance {
  long long bytes, scales;
};

// The 4-byte-aligned word holding the byte at p (never crosses a page: it shares p's aligned word).
__device__ __forceinline__ const void* aligned_word(const u8* p) {
  return reinterpret_cast<const void*>(reinterpret_cast<unsigned long long>(p) & ~3ull);
}
__device__ __forceinline__ u32 byte_of_word(u32 word, const u8* p) {
  return (word >> (8 * (reinterpret_cast<unsigned long long>(p) & 3))) & 0xFFu;
}

// copy16_async_or_zero under an L2 cache policy, or with `prefetch` its form that has L2 fetch the
// whole aligned 256-byte block (the next three steps' bytes of a weight row).
__device__ __forceinline__ void copy16_async_or_zero_maybe_l2_256(unsigned smem, const void* global, bool valid, bool prefetch,
                                                                  unsigned long long policy) {
  if (prefetch) {
    copy16_async_or_zero_l2_256(smem, global, valid, policy);
  } else {
    copy16_async_or_zero(smem, global, valid, policy);
  }
}
// Copies one step's MXFP4 weights of `tile` (piece `piece` of rows g and g + 8, and their scales)
// into a ring stage (its shared-window address), under the L2 `policy`.
__device__ __forceinline__ void copy_step_weights(unsigned stage, int lane, const MoeMmaTile& tile, MoeRowDistance hi, int piece,
                                                  int pieces, bool l2_prefetch, unsigned long long policy) {
  const bool valid = piece < pieces;
  copy16_async_or_zero_maybe_l2_256(stage + 16 * lane, tile.row_lo + 16 * piece, valid && tile.lo_valid, l2_prefetch, policy);
  copy16_async_or_zero_maybe_l2_256(stage + kWarp * 16 + 16 * lane, tile.row_lo + hi.bytes + 16 * piece, valid && tile.hi_valid,
                                    l2_prefetch, policy);
  const u8* scale = tile.scale_lo + piece;
  copy4_async_or_zero(stage + kMoeRingRowBytes + 8 * lane, aligned_word(scale), valid && tile.lo_valid, policy);
  copy4_async_or_zero(stage + kMoeRingRowBytes + 8 * lane + 4, aligned_word(scale + hi.scales), valid && tile.hi_valid, policy);
}
// bf16 weights of one step straight into registers. A step reads 64 bytes of each row and the next
// three steps the rest, so L2 fetches each row's 256 bytes at once (on an H200 at T = 1 the
// streaming phases took 0.081 ms against 0.089 without the hint).
__device__ __forceinline__ MoeStepWeights load_step_weights(const MoeMmaTile& tile, MoeRowDistance hi, int piece, int pieces,
                                                            unsigned long long policy) {
  MoeStepWeights w;
  const bool valid = piece < pieces;
  w.lo = load16_l2_256(tile.row_lo + 16 * piece, valid && tile.lo_valid, policy);
  w.hi = load16_l2_256(tile.row_lo + hi.bytes + 16 * piece, valid && tile.hi_valid, policy);
  w.scale_lo = w.scale_hi = 0u;
  return w;
}
// The MXFP4 weights of one step back from this lane's ring slot.
__device__ __forceinline__ MoeStepWeights read_step_weights(unsigned stage, int lane, const MoeMmaTile& tile, MoeRowDistance hi,
                                                            int piece) {
  MoeStepWeights w;
  w.lo = load16_shared(stage + 16 * lane);
  w.hi = load16_shared(stage + kWarp * 16 + 16 * lane);
  u32 words[2];
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(words[0]), "=r"(words[1]) : "r"(stage + kMoeRingRowBytes + 8 * lane));
  const u8* scale = tile.scale_lo + piece;
  w.scale_lo = byte_of_word(words[0], scale);
  w.scale_hi = byte_of_word(words[1], scale + hi.scales);
  return w;
}

// B of a piece past K pairs with zero A: read the last piece again, which is in bounds. bf16's up
// reads the caller's x (read-only: the non-coherent path); MXFP4's up the reordered copy (a
// generic load: this CTA's shared memory or the workspace), and down act, both written earlier in
// this launch: plain weak loads, ordered by the barrier since, which the L1 may serve (every lane
// of a warp reads the same few rows).
template <int kFormat, bool kUp, bool kActMxfp8>
__device__ __forceinline__ MoeStepActivations<kFormat> load_step_activations(const MoeMmaTile& tile, int piece, int pieces) {
  static_assert(!kActMxfp8 || kFormat != kWeightsBf16, "W4A8 takes MXFP4 weights: a piece is one 32-value block");
  using Acts = MoeStepActivations<kFormat>;
  Acts a;
  const bf16* b = tile.b_row + Acts::kPieceValues * min(piece, pieces - 1);
#pragma unroll
  for (int q = 0; q < Acts::kPieceValues / 8; ++q) {
    Bf16x8 v;
    if (kUp && kFormat == kWeightsBf16) {
      v = load16(b + 8 * q);
    } else if (kUp) {  // generic: this CTA's shared copy of x, or the workspace's
      asm volatile("ld.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
                   : "l"(b + 8 * q)
                   : "memory");
    } else {
      asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
                   : "l"(b + 8 * q)
                   : "memory");
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) a.b[4 * q + i] = v.w[i];
  }
  if constexpr (kActMxfp8 && !kUp) quantize_mxfp8_block(a.b);  // up's x was quantized as it was copied
  return a;
}

// Where value v of each 8 sits in the MXFP4 path's k order (0 4 1 5 2 6 3 7): x's copy and act.
__device__ __forceinline__ int mxfp4_k_slot(int v) { return (v & ~7) | ((v & 3) << 1) | ((v >> 2) & 1); }

// One step's MMAs. MXFP4 scales above 2 (none in released checkpoints) take kLargeScales: a
// multiply by 2^126, then by the scale; the caller branches for the whole warp.
template <int kFormat, bool kLargeScales>
__device__ __forceinline__ void mma_step(float (&acc)[4], const MoeStepWeights& w, const MoeStepActivations<kFormat>& a) {
  if (kFormat == kWeightsBf16) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const unsigned regs[4] = {w.lo.w[2 * i], w.hi.w[2 * i], w.lo.w[2 * i + 1], w.hi.w[2 * i + 1]};
      mma_16816<bf16>(acc, regs, a.b[2 * i], a.b[2 * i + 1]);
    }
  } else {
    const u32 scale_lo = mxfp4_scale_bf16x2<kLargeScales>(w.scale_lo), scale_hi = mxfp4_scale_bf16x2<kLargeScales>(w.scale_hi);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // word j: values 8 j .. 8 j + 7 in pairs (i, i + 4), MMAs 2 j and 2 j + 1
      u32 lo[4], hi[4];
      mxfp4_word_to_bf16x2<kFormat, kLargeScales>(w.lo.w[j], scale_lo, lo);
      mxfp4_word_to_bf16x2<kFormat, kLargeScales>(w.hi.w[j], scale_hi, hi);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const unsigned regs[4] = {lo[2 * i], hi[2 * i], lo[2 * i + 1], hi[2 * i + 1]};
        mma_16816<bf16>(acc, regs, a.b[4 * j + 2 * i], a.b[4 * j + 2 * i + 1]);
      }
    }
  }
}

// up (kUp) or down for every routed pair of the chunked list, as described above. CTA c takes tiles
// c, c + C, c + 2 C, ... of the C CTAs (so the grid works on neighbouring tiles at any moment: on an
// H200 at T = 8 with MXFP4 weights, 0.188 ms against 0.201 for consecutive shares), and its warps
// split that share's (tile, step) units evenly, so every warp has work and none has more than one
// unit above another (before, a warp or a group of warps took whole tiles, and at T = 1 a third of
// the warps had none). A tile may thus be split between neighbouring warps, whose sums meet in
// `partials` (its first warp's in [1], each later warp's in [0]) after a CTA barrier; the first
// warp applies the epilogue. `ring` is this warp's weight ring. With `barrier_after_first_copies`
// (down), the phase takes the grid barrier once its first weight copies are issued. up's B is `x` (rows
// of H: the caller's x, or for MXFP4 its reordered copy); act is bf16 (one row of I per pair, in
// MXFP4's k order for MXFP4), y f32 (one row of H per pair).
template <bool kUp, int kFormat, int kActivation, int kLayout, int kBias13, int kBias2, bool kActMxfp8,
          int kWarps = kiln_moe_stream_warps(kFormat)>
__device__ void moe_mma_phase(const KilnMoeParams& p, const int* chunk_start, const MoeChunk* chunk_table, const int* pair_start,
                              const int* pairs, bool local_pairs, const bf16* x, long long x_row_stride, bf16* act, float* y,
                              float (*partials)[kWarps][kWarp][4], unsigned ring, bool barrier_after_first_copies) {
  using Acts = MoeStepActivations<kFormat>;
  constexpr bool kRing = kFormat != kWeightsBf16;
  constexpr int kStages = kMoeRingStages, kStageBytes = kMoeRingStageBytes;
  const int experts = p.num_experts, k = p.top_k;
  const int rows_k = kUp ? p.hidden : p.intermediate;  // K
  const int pieces = rows_k / Acts::kPieceValues;
  const int steps = (pieces + 3) / 4;  // per tile: a step covers 4 pieces of each row, one per lane t
  const int row_blocks = kUp ? p.intermediate / 8 : (p.hidden + kMoeTileRows - 1) / kMoeTileRows;
  const int tiles = chunk_start[experts] * row_blocks;               // at most (T k / 8 + E) x 360 for GPT-OSS
  if (chunk_start[experts] > kMoeChunkTable) chunk_table = nullptr;  // not listed: searched
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  // This CTA's tiles (its i-th is global_tile(i)), then warp w's units [unit_start(w),
  // unit_start(w + 1)): unit u is step u % steps of the CTA's tile u / steps.
  const int cta_tiles = tiles > static_cast<int>(blockIdx.x) ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  auto global_tile = [&](int i) { return static_cast<int>(blockIdx.x + i * gridDim.x); };
  const long long cta_units = static_cast<long long>(cta_tiles) * steps;
  auto unit_start = [&](int w) { return cta_units * w / kWarps; };
  const long long unit_begin = unit_start(warp), unit_end = unit_start(warp + 1);
  const long long expert_stride = kUp ? p.w13_expert_stride : p.w2_expert_stride;
  const long long row_stride = kUp ? p.w13_row_stride : p.w2_row_stride;
  const long long row_bytes = kFormat != kWeightsBf16 ? 1 : 2;  // bytes per stored element
  const u8* weights = static_cast<const u8*>(kUp ? p.w13 : p.w2);
  const u8* scales = kUp ? p.w13_scale : p.w2_scale;
  const long long scale_expert_stride = kUp ? p.w13_scale_expert_stride : p.w2_scale_expert_stride;
  const long long scale_row_stride = kUp ? p.w13_scale_row_stride : p.w2_scale_row_stride;

  const int row_distance = kUp ? gate_up_rows<kLayout>(0, p.intermediate).up : 8;  // rows g + 8 and g of a tile
  const MoeRowDistance hi{row_distance * row_stride * row_bytes, row_distance * scale_row_stride};
  // This lane's view of tile `tile`: its weight rows, then (with_pairs) its activation row and
  // result columns (the pair list: see read_pair).
  auto make_tile = [&](int tile, bool with_pairs) {
    MoeMmaTile v;
    v.row_lo = weights;
    v.scale_lo = scales;
    v.lo_valid = v.hi_valid = false;
    v.b_row = kUp ? x : act;
    v.out_pair[0] = v.out_pair[1] = -1;
    v.expert = v.row_block = 0;
    if (tile >= tiles) return v;
    const MoeChunk c = find_chunk(chunk_start, chunk_table, pair_start, experts, tile / row_blocks);
    v.expert = c.expert;
    v.row_block = tile % row_blocks;
    int rows[2];
    if (kUp) {
      const GateUpRows unit_rows = gate_up_rows<kLayout>(8 * v.row_block + g, p.intermediate);
      rows[0] = unit_rows.gate;
      rows[1] = unit_rows.up;
    } else {
      rows[0] = kMoeTileRows * v.row_block + g;
      rows[1] = rows[0] + 8;
    }
    v.row_lo = weights + (c.expert * expert_stride + rows[0] * row_stride) * row_bytes;
    if (kFormat != kWeightsBf16) v.scale_lo = scales + c.expert * scale_expert_stride + rows[0] * scale_row_stride;
    v.lo_valid = kUp || rows[0] < p.hidden;
    v.hi_valid = kUp || rows[1] < p.hidden;
    if (!with_pairs) return v;
    const int b_pair = read_pair(pairs, c.first + (g < c.count ? g : 0), local_pairs);
    v.b_row += kUp ? static_cast<long long>(b_pair / k) * x_row_stride : static_cast<long long>(b_pair) * p.intermediate;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (2 * t + e < c.count) v.out_pair[e] = read_pair(pairs, c.first + 2 * t + e, local_pairs);
    }
    return v;
  };
  // The tile's results from its full sums: the activation into act (up), or y with its bias (down).
  auto epilogue = [&](const MoeMmaTile& tile, const float(&acc)[4]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int pair = tile.out_pair[e];
      if (pair < 0) continue;
      if (kUp) {
        const int unit = 8 * tile.row_block + g;
        const GateUpRows rows = gate_up_rows<kLayout>(unit, p.intermediate);
        const long long bias = tile.expert * p.w13_bias_expert_stride;
        act[static_cast<long long>(pair) * p.intermediate + (kFormat != kWeightsBf16 ? mxfp4_k_slot(unit) : unit)] =
            from_float<bf16>(glu_activation<kActivation>(acc[e] + moe_bias<kBias13>(p.w13_bias, bias + rows.gate),
                                                         acc[2 + e] + moe_bias<kBias13>(p.w13_bias, bias + rows.up)));
      } else {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int h = kMoeTileRows * tile.row_block + 8 * half + g;
          if (h < p.hidden) {
            y[static_cast<long long>(pair) * p.hidden + h] =
                acc[2 * half + e] + moe_bias<kBias2>(p.w2_bias, tile.expert * p.w2_bias_expert_stride + h);
          }
        }
      }
    }
  };

  // The copy cursor runs kStages - 1 units ahead of the MMAs, across tiles; each unit commits one
  // group of copies (an empty one past the warp's last unit) so that waiting for all but the
  // newest kStages - 1 groups waits for exactly the unit about to compute. A warp with many units
  // asks L2 for 256-byte blocks: on an H200, GPT-OSS MXFP4 at T = 8 (about 110 units a warp in up)
  // took 0.179 ms against 0.185, at T = 64 0.645 against 0.656; at T = 1 (about 16) the hint cost
  // 2% (0.0500 against 0.0492), so few units go without.
  const bool l2_prefetch = unit_end - unit_begin >= kMoeL2PrefetchUnits;
  // The weights are read once per launch: evicted first from L2, they leave the kernel's code and
  // workspace there (on an H200, GPT-OSS MXFP4 at T = 1 0.0452 ms against 0.0467 without).
  const unsigned long long weight_policy = l2_evict_first_policy();
  // The warp's first tile: the copy cursor starts from its weight rows, and (MXFP4) its pairs are
  // read once the first copies are in flight (make_tile reads only the pair list, not act, so down
  // may take both before its barrier). On an H200, GPT-OSS MXFP4 at T = 1 took 0.0408 ms against
  // 0.0423 with a view of the cursor's own, and 0.0400 against 0.0407 with the pairs read after
  // the copies.
  // down: this CTA's act is written. It arrives at the grid barrier before issuing the first copies
  // and waits once they are out, so that the arrival's fence orders none of them (on an H200,
  // GPT-OSS MXFP4 with bf16 biases at T = 1: 0.0397-0.0398 ms against 0.0403 with the whole barrier
  // after the copies).
  const unsigned barrier_arrival = barrier_after_first_copies ? grid_barrier_arrive() : 0u;
  int tile = static_cast<int>(unit_begin / steps), step = static_cast<int>(unit_begin % steps), stage = 0;
  MoeMmaTile current = make_tile(global_tile(tile), !kRing);
  long long copy_unit = unit_begin;
  int copy_tile = tile, copy_step = step, copy_stage = 0;
  MoeMmaTile copy_view = current;
  auto copy_ahead = [&]() {
    if (copy_unit < unit_end) {
      copy_step_weights(ring + copy_stage * kStageBytes, lane, copy_view, hi, 4 * copy_step + t, pieces, l2_prefetch, weight_policy);
      ++copy_unit;
      if (++copy_step == steps) {
        copy_step = 0;
        copy_view = make_tile(global_tile(++copy_tile), false);
      }
    }
    commit_copies();
    copy_stage = copy_stage + 1 == kStages ? 0 : copy_stage + 1;
  };
  if (kRing) {
#pragma unroll
    for (int i = 0; i + 1 < kStages; ++i) copy_ahead();
    current = make_tile(global_tile(tile), true);
  }
  // down waits for every CTA's act here, its first weight copies already in flight (they do not
  // depend on act): on an H200, GPT-OSS MXFP4 at T = 1 0.0467 ms against 0.0479 with the barrier
  // before them.
  if (barrier_after_first_copies) grid_barrier_wait(barrier_arrival);

  MoeMmaTile next = make_tile(global_tile(tile + 1), true);
  Acts acts = load_step_activations<kFormat, kUp, kActMxfp8>(current, 4 * step + t, pieces);
  MoeStepWeights loaded;  // bf16: this step's weights, loaded one step ahead
  if (!kRing) loaded = load_step_weights(current, hi, 4 * step + t, pieces, weight_policy);
  // One step: loads the following step's activations (and bf16 weights) from `ahead_tile` first.
  auto compute_step = [&](float(&acc)[4], int step, const MoeMmaTile& ahead_tile, int ahead_piece) {
    const Acts acts_ahead = load_step_activations<kFormat, kUp, kActMxfp8>(ahead_tile, ahead_piece, pieces);
    MoeStepWeights w;
    if (kRing) {
      copy_ahead();
      wait_copies<kStages - 1>();
      w = read_step_weights(ring + stage * kStageBytes, lane, current, hi, 4 * step + t);
      stage = stage + 1 == kStages ? 0 : stage + 1;
    } else {
      w = loaded;
      loaded = load_step_weights(ahead_tile, hi, ahead_piece, pieces, weight_policy);
    }
    if (kFormat != kWeightsBf16 && __any_sync(0xffffffffu, max(w.scale_lo, w.scale_hi) > 128u)) {
      mma_step<kFormat, true>(acc, w, acts);
    } else {
      mma_step<kFormat, false>(acc, w, acts);
    }
    acts = acts_ahead;
  };
  // Each pass covers this warp's steps [step, segment_end) of one tile; its last step loads the
  // next tile's first (unused when the warp's units end there).
  MoeMmaTile split_tile = current;  // the tile this warp began but did not finish (its sums in partials[1])
  int split_index = -1;
  for (long long at = unit_begin; at < unit_end;) {  // `at`: this warp's next unit
    const int first_step = step, segment_end = static_cast<int>(min(static_cast<long long>(steps), step + (unit_end - at)));
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // Unrolled twice, consecutive steps' activations need no register copies (on an H200 at T = 1:
    // MXFP4 0.049 ms against 0.050, bf16 0.076 against 0.081).
#pragma unroll 2
    for (; step + 1 < segment_end; ++step) compute_step(acc, step, current, 4 * (step + 1) + t);
    compute_step(acc, step, next, t);
    at += segment_end - first_step;
    if (first_step == 0 && segment_end == steps) {
      epilogue(current, acc);
    } else {
      float* slot = partials[first_step == 0 ? 1 : 0][warp][lane];
#pragma unroll
      for (int i = 0; i < 4; ++i) slot[i] = acc[i];
      if (first_step == 0) {
        split_tile = current;
        split_index = tile;
      }
    }
    ++tile;
    step = 0;
    current = next;
    next = make_tile(global_tile(tile + 1), true);
  }
  if (kRing) wait_copies<0>();  // only empty groups remain; the ring is reused by the next phase
  // A split tile's first warp adds the later warps' sums: those whose units begin inside it.
  __syncthreads();
  if (split_index >= 0) {
    float acc[4];
    const float* mine = partials[1][warp][lane];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = mine[i];
    const long long split_end = static_cast<long long>(split_index + 1) * steps;
    for (int w = warp + 1; w < kWarps && unit_start(w) < split_end; ++w) {
      if (unit_start(w + 1) == unit_start(w)) continue;  // no units
      const float* other = partials[0][w][lane];
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += other[i];
    }
    epilogue(split_tile, acc);
  }
}

template <int kFormat, int kActivation, int kLayout, int kRouting, bool kLogitsBf16, int kBias13, int kBias2, bool kActMxfp8>
__global__ void __launch_bounds__(kiln_moe_stream_warps(kFormat) * kWarp, 1) moe_apply_stream(const __grid_constant__ KilnMoeParams p) {
  constexpr int kWarps = kiln_moe_stream_warps(kFormat);
  __shared__ int pair_start[kMoeStreamMaxExperts + 1];   // first grouped pair of each expert
  __shared__ int chunk_start[kMoeStreamMaxExperts + 1];  // first chunk of each expert
  __shared__ MoeChunk chunk_table[kMoeChunkTable];       // each chunk, up to kMoeChunkTable chunks
  __shared__ int mtile_start[kMoeStreamMaxExperts + 1];  // first GEMM tile row (kGemmRows pairs) of each expert
  constexpr int kGemmRows = kFormat == kWeightsBf16 ? KILN_MOE_GEMM_ROWS : kiln_moe_mxfp4_rows(KILN_MOE_LARGE_BATCH);
  // The large-batch build keeps the streaming phases' split-tile sums after the rings.
  constexpr bool kPartialsAfterRings = kFormat != kWeightsBf16 && KILN_MOE_LARGE_BATCH;
  const KilnMoeStreamWorkspace layout = kiln_moe_stream_workspace(p.num_tokens, p.top_k, p.num_experts, p.hidden, p.intermediate);
  unsigned char* ws = static_cast<unsigned char*>(p.workspace);
  int* gemm_counters = reinterpret_cast<int*>(ws + layout.gemm_counters);
  int* counts = reinterpret_cast<int*>(ws + layout.counts);
  int* ids = reinterpret_cast<int*>(ws + layout.ids);
  float* weights = reinterpret_cast<float*>(ws + layout.weights);
  int* pairs = reinterpret_cast<int*>(ws + layout.pairs);
  bf16* x_reordered = reinterpret_cast<bf16*>(ws + layout.x_reordered);
  float* act = reinterpret_cast<float*>(ws + layout.act);
  float* y = reinterpret_cast<float*>(ws + layout.y);

  const int lane = threadIdx.x & (kWarp - 1);
  const int warp = blockIdx.x * kWarps + (threadIdx.x >> 5), warps = gridDim.x * kWarps;
  const int thread = blockIdx.x * blockDim.x + threadIdx.x, threads = gridDim.x * blockDim.x;
  const int k = p.top_k, experts = p.num_experts, num_pairs = p.num_tokens * p.top_k;

  // The launch gives the dynamic shared memory of the grouped GEMMs when the token count pays for
  // them (src/kernels/moe_apply_stream.cpp), else the weight rings of the streaming phases (smaller).
  unsigned dynamic_bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
  bool tensor_cores = false;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  tensor_cores = kFormat == kWeightsBf16 ? dynamic_bytes >= KILN_MOE_GEMM_SHARED_BYTES
                                         : kiln_moe_mxfp4_gemm_pays(p.num_tokens, p.top_k) &&
                                               dynamic_bytes >= kiln_moe_gemm_mxfp4_shared_bytes(KILN_MOE_LARGE_BATCH);
#endif
  // Local routing: with at most a token per warp and the streaming phases, every CTA routes every
  // token itself and keeps ids, weights, counts and the grouped pair list in its own shared
  // memory, so no grid barrier is left before up (the workspace's ids, weights and pairs are then
  // unused). MXFP4 also keeps its copy of x in the k order there, after the rings, when the launch
  // gave room for it (kiln_moe_local_x_bytes). On an H200, GPT-OSS-120B at T = 1: bf16 0.073 ms
  // against 0.075; MXFP4 0.047 against 0.050 (with a grid barrier kept for the copy of x in the
  // workspace, local routing had gained nothing).
  const bool local = moe_routes_locally<kFormat>(p, tensor_cores, dynamic_bytes);
  __shared__ int local_ids[KILN_MOE_LOCAL_MAX_TOKENS * kMoeMaxTopK], local_pairs[KILN_MOE_LOCAL_MAX_TOKENS * kMoeMaxTopK];
  __shared__ float local_weights[KILN_MOE_LOCAL_MAX_TOKENS * kMoeMaxTopK];
  __shared__ int local_counts[kMoeStreamMaxExperts];  // then each expert's next slot in local_pairs
  // At most a warp's worth of locally routed pairs (GPT-OSS up to T = 8) are grouped by
  // group_few_pairs, which needs no counts.
  const bool few_pairs = local && num_pairs <= kWarp;
  if (local && !few_pairs) {
    for (int e = threadIdx.x; e < experts; e += blockDim.x) local_counts[e] = 0;
    __syncthreads();
  }

  // route (and MXFP4's copy of x in its k order, 8 values per thread at a time)
  {  // local: warp w of every CTA routes token w
    int* route_ids = local ? local_ids : ids;
    float* route_weights = local ? local_weights : weights;
    int* route_counts = few_pairs ? nullptr : local ? local_counts : counts;
    for (int t = local ? static_cast<int>(threadIdx.x >> 5) : warp; t < p.num_tokens; t += local ? kWarps : warps) {
      route_token_warp<kRouting, kLogitsBf16>(p, t, lane, route_ids, route_weights, route_counts, local);
    }
  }
  // Dynamic shared memory: the grouped GEMMs' stages, or the MXFP4 rings and split-tile sums, then
  // (local) x.
  extern __shared__ __align__(16) unsigned char moe_dynamic[];
  constexpr int kRingsBytes = kWarps * kMoeRingStages * kMoeRingStageBytes;
  bf16* x_local =
      reinterpret_cast<bf16*>(align_shared<128>(moe_dynamic) + kRingsBytes + (kPartialsAfterRings ? KILN_MOE_PARTIALS_BYTES : 0));
  if (kFormat != kWeightsBf16 && !tensor_cores) {  // this CTA's copy (local) or the workspace's, by the whole grid
    bf16* x_ordered = local ? x_local : x_reordered;
    // A thread copies 8 values, or with W4A8 a block of 32, quantized here once rather than by every
    // tile that reads it (load_step_activations quantizes act, which up writes in pieces).
    constexpr int kCopyValues = kActMxfp8 ? 32 : 8;
    const int per_row = p.hidden / kCopyValues;
    // Local: the last warps copy first, so that the routing warps (the first) have the least to
    // copy after routing (on an H200, GPT-OSS MXFP4 at T = 1 0.0447 ms against 0.0451).
    for (long long i = local ? blockDim.x - 1 - threadIdx.x : thread; i < static_cast<long long>(p.num_tokens) * per_row;
         i += local ? blockDim.x : threads) {
      const long long t = i / per_row, c = i % per_row;
      const bf16* from = static_cast<const bf16*>(p.x) + t * p.x_row_stride + kCopyValues * c;
      bf16* into = x_ordered + t * p.hidden + kCopyValues * c;
      if constexpr (kActMxfp8) {
        u32 block[16];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const Bf16x8 v = mxfp4_k_order(load16(from + 8 * q));
#pragma unroll
          for (int w = 0; w < 4; ++w) block[4 * q + w] = v.w[w];
        }
        quantize_mxfp8_block(block);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          Bf16x8 v;
#pragma unroll
          for (int w = 0; w < 4; ++w) v.w[w] = block[4 * q + w];
          *reinterpret_cast<Bf16x8*>(into + 8 * q) = v;
        }
      } else {
        *reinterpret_cast<Bf16x8*>(into) = mxfp4_k_order(load16(from));
      }
    }
  }
  if (local)
    __syncthreads();
  else
    grid_barrier();

  // group: every CTA derives the same offsets from the counts (warp 0: 8 experts per lane, then a
  // scan over the lanes), or from the routed experts alone when there are few pairs.
  if (few_pairs) {
    if (threadIdx.x < kWarp) group_few_pairs(local_ids, num_pairs, experts, lane, chunk_start, chunk_table, local_pairs);
  } else if (threadIdx.x < kWarp) {
    constexpr int kPerLane = kMoeStreamMaxExperts / kWarp;
    int n[kPerLane], lane_pairs = 0, lane_chunks = 0, lane_mtiles = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane * kPerLane + i;
      n[i] = e >= experts ? 0 : local ? local_counts[e] : *reinterpret_cast<volatile int*>(&counts[e]);
      lane_pairs += n[i];
      lane_chunks += (n[i] + kMoeStreamChunk - 1) / kMoeStreamChunk;
      lane_mtiles += (n[i] + kGemmRows - 1) / kGemmRows;
    }
    int pairs_through = lane_pairs, chunks_through = lane_chunks, mtiles_through = lane_mtiles;  // inclusive scan over lanes
#pragma unroll
    for (int offset = 1; offset < kWarp; offset <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, pairs_through, offset), b = __shfl_up_sync(0xffffffffu, chunks_through, offset);
      const int m = __shfl_up_sync(0xffffffffu, mtiles_through, offset);
      if (lane >= offset) {
        pairs_through += a;
        chunks_through += b;
        mtiles_through += m;
      }
    }
    int pair_at = pairs_through - lane_pairs, chunk_at = chunks_through - lane_chunks, mtile_at = mtiles_through - lane_mtiles;
    const bool listed = __shfl_sync(0xffffffffu, chunks_through, kWarp - 1) <= kMoeChunkTable;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane * kPerLane + i;
      if (e < experts) {
        pair_start[e] = pair_at;
        chunk_start[e] = chunk_at;
        mtile_start[e] = mtile_at;
      }
      const int chunks = (n[i] + kMoeStreamChunk - 1) / kMoeStreamChunk;
      if (listed) list_chunks(chunk_table, chunk_at, e, pair_at, n[i]);
      pair_at += n[i];
      chunk_at += chunks;
      mtile_at += (n[i] + kGemmRows - 1) / kGemmRows;
    }
    if (lane == kWarp - 1) {
      pair_start[experts] = pairs_through;
      chunk_start[experts] = chunks_through;
      mtile_start[experts] = mtiles_through;
    }
  }
  __syncthreads();
  if (few_pairs) {
    // listed by group_few_pairs
  } else if (local) {
    // Every CTA must list an expert's pairs in the same order (their chunks are split between
    // CTAs): pair order, 32 at a time by warp 0, each lane ranked among the lanes of its expert.
    if (threadIdx.x < kWarp) {
      for (int e = lane; e < experts; e += kWarp) local_counts[e] = pair_start[e];
      __syncwarp();
      for (int base = 0; base < num_pairs; base += kWarp) {
        const int q = base + lane;
        const int e = q < num_pairs ? local_ids[q] : -1;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const int rank = __popc(same & ((1u << lane) - 1u));
        if (e >= 0) local_pairs[local_counts[e] + rank] = q;
        __syncwarp();
        if (e >= 0 && rank == 0) local_counts[e] += __popc(same);
        __syncwarp();
      }
    }
    __syncthreads();
  } else {  // the list in the workspace, awaited at barrier 1
    list_pairs_in_order(ids, num_pairs, experts, pair_start, pairs, warp, warps, lane);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (tensor_cores) {
      grid_barrier();  // the whole list, before x is copied in its order
      moe_gemm_group_x<kFormat != kWeightsBf16, kActMxfp8>(p, pairs, pair_start[experts], reinterpret_cast<bf16*>(ws + layout.x_grouped),
                                                           warp, warps, lane);
    }
#endif
  }

  // The streaming phases' split-tile sums: in static shared memory, where the bf16 grouped GEMMs'
  // epilogues also stage their 16-byte stores (1 KB per math warp) and their bf16 biases (512
  // bytes); in the large-batch build with MXFP4 weights after the rings, so that its GEMMs' stages
  // (whose epilogues stage nothing) have the 16 KB.
  using Partials = float[2][kWarps][kWarp][4];
  static_assert(sizeof(Partials) == KILN_MOE_PARTIALS_BYTES || kFormat == kWeightsBf16, "moe/stream_workspace.h sizes the sums");
  __shared__ __align__(128) float partials_static[kPartialsAfterRings ? 1 : sizeof(Partials) / sizeof(float)];
  Partials& partials = *reinterpret_cast<Partials*>(kPartialsAfterRings ? align_shared<128>(moe_dynamic) + kRingsBytes
                                                                        : reinterpret_cast<unsigned char*>(partials_static));
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (tensor_cores) {
    static_assert(kFormat != kWeightsBf16 || sizeof(Partials) >= kMoeMathThreads / kWarp * (kMoeStagingBytes + kMoeBiasStagingBytes),
                  "the bf16 GEMM epilogues' staging fits in partials");
    using Pipe = MoeGemmPipelineOf<kFormat>;
    __shared__ __align__(8) unsigned long long gemm_barriers[3 * Pipe::kStages];
    __shared__ int tile_of_stage[Pipe::kStages];
    __shared__ int slice_after;
    __shared__ int tile_claims[2];
    Pipe pipe;
    pipe.full = shared_address(&gemm_barriers[0]);
    pipe.empty = shared_address(&gemm_barriers[Pipe::kStages]);
    pipe.told = shared_address(&gemm_barriers[2 * Pipe::kStages]);
    pipe.tile_of_stage = tile_of_stage;
    pipe.slice_after = &slice_after;
    pipe.claims = tile_claims;
    pipe.stage_base = shared_address(align_shared<1024>(moe_dynamic));  // the swizzle atoms' alignment
    pipe.stage_bytes = kFormat == kWeightsBf16 ? kMoeStageBytes : kMoeMxfp4StageBytes;
    if (threadIdx.x == 0) moe_gemm_init_barriers(pipe, kFormat != kWeightsBf16);
    bf16* act16 = reinterpret_cast<bf16*>(act);
    bf16* y16 = reinterpret_cast<bf16*>(y);
    int slice = 0;
    grid_barrier();
    moe_gemm_phase<kFormat, true, kActivation, kLayout, kBias13, kBias2>(p, pipe, slice, mtile_start, pair_start, pairs, act16, y16,
                                                                         shared_address(partials), &gemm_counters[0]);
    grid_barrier();
    if constexpr (kActMxfp8) {  // W4A8: act quantized in place, read by down's copies after the barrier
      moe_gemm_quantize_act(p, act16, pair_start, thread, threads);
      grid_barrier();
    }
    moe_gemm_phase<kFormat, false, kActivation, kLayout, kBias13, kBias2>(p, pipe, slice, mtile_start, pair_start, pairs, act16, y16,
                                                                          shared_address(partials), &gemm_counters[1]);
  }
#endif
  if (!tensor_cores) {
    bf16* act16 = reinterpret_cast<bf16*>(act);
    const bf16* x = kFormat != kWeightsBf16 ? (local ? x_local : x_reordered) : static_cast<const bf16*>(p.x);
    const long long x_row_stride = kFormat != kWeightsBf16 ? p.hidden : p.x_row_stride;
    // The MXFP4 rings start on a 128-byte boundary (the launch gives 128 bytes of slack): dynamic
    // shared memory follows the static arrays, 16 bytes past a boundary here, and the decode
    // kernel's rings ran 11% slower 80 bytes past one than at 0, 32, 64 or 96.
    const unsigned ring = shared_address(align_shared<128>(moe_dynamic)) + (threadIdx.x / kWarp) * kMoeRingStages * kMoeRingStageBytes;
    if (!local) grid_barrier();
    moe_mma_phase<true, kFormat, kActivation, kLayout, kBias13, kBias2, kActMxfp8>(
        p, chunk_start, chunk_table, pair_start, local ? local_pairs : pairs, local, x, x_row_stride, act16, y, partials, ring, false);
    moe_mma_phase<false, kFormat, kActivation, kLayout, kBias13, kBias2, kActMxfp8>(
        p, chunk_start, chunk_table, pair_start, local ? local_pairs : pairs, local, x, x_row_stride, act16, y, partials, ring, true);
  }
  grid_barrier();

  // combine, in slot order. Each thread owns 4 consecutive hidden units of a token (one when H is
  // not a multiple of 4). ids, weights (unless routed here, in shared memory) and y were written by
  // other CTAs before the last barrier: they are read through L2 (ld.global.cg), which this SM's L1
  // cannot hold stale. y is bf16 when the grouped GEMMs wrote it (H is then a multiple of 64), else
  // f32. Slots go four at a time, their ids, weights and y values all in flight before any is
  // used: a slot's y row does not depend on its id, so its load goes out with the id's, and the y
  // of a slot whose id is -1 (never written) is read but not used.
  // `local`, recomputed: kept live through the grouped GEMMs it made ptxas spill there.
  const bool routed_here = moe_routes_locally<kFormat>(p, tensor_cores, dynamic_bytes);
  const int width = p.hidden % 4 == 0 ? 4 : 1, per_token = p.hidden / width;
  const long long items = static_cast<long long>(p.num_tokens) * per_token;
  for (long long i = thread; i < items; i += threads) {
    const int t = static_cast<int>(i / per_token), h = static_cast<int>(i % per_token) * width;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j0 = 0; j0 < k; j0 += 4) {
      int id[4];
      float w[4], v[4][4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int q = t * k + j0 + u;
        id[u] = j0 + u >= k ? -1 : routed_here ? local_ids[q] : load_l2(&ids[q]);
        w[u] = j0 + u >= k ? 0.0f : routed_here ? local_weights[q] : load_l2(&weights[q]);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (j0 + u >= k) continue;
        const long long row = static_cast<long long>(t * k + j0 + u) * p.hidden + h;
        if (tensor_cores)
          load_l2_bf16x4(reinterpret_cast<const bf16*>(y) + row, v[u]);
        else if (width == 4)
          load_l2_4(y + row, v[u]);
        else
          v[u][0] = load_l2(y + row);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (id[u] < 0) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (e < width) sum[e] += w[u] * v[u][e];
        }
      }
    }
    bf16* out = static_cast<bf16*>(p.out) + t * p.out_row_stride + h;
    for (int e = 0; e < width; ++e) out[e] = from_float<bf16>(sum[e]);
  }
}

}  // namespace kiln
