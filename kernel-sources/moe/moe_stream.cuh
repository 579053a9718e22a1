// MoE layer for decode-sized token counts, bound by reading the weights. One cooperative launch:
// a CTA of 16 warps per SM, all resident. Five phases are split by grid-wide barriers, and what
// passes between them lives in the workspace (moe/stream_workspace.h):
//   route    a warp per token: top-k by warp arg-max (ties go to the lower expert, as in the
//            reference), the weights, and a count per expert;
//   group    every (token, slot) pair listed under its expert;
//   up       item (expert, chunk of up to 4 of its pairs, intermediate unit r): a warp reads the
//            gate and up rows of r once, dots them with the chunk's tokens and applies the
//            activation: act;
//   down     item (expert, chunk, hidden row h): a warp reads row h of W2 once and dots it with
//            the chunk's act rows: y, bias included;
//   combine  out[t] = sum over slots j of weight[t][j] * y[t, j], in slot order (deterministic).
// An expert's weights are read once per chunk of 4 tokens routed to it: exactly once at decode
// sizes. On sm_90a with bf16 weights, from a token count on (src/kernels/moe_stream.cpp), up and
// down are grouped GEMMs on wgmma instead (moe/moe_gemm_sm90.cuh); route, group and combine stay.
// Weights are read 16 bytes per lane: 8 bf16, or 32 e2m1 values that share one e8m0 scale.
// Device-resident topk_ids outside [0, E) contribute nothing (the host cannot check them).
// Launch: grid (SMs), block 512, cooperative, workspace kiln_moe_stream_workspace(T, k, E, H, I);
// dynamic shared memory KILN_MOE_GEMM_SHARED_BYTES selects the GEMM phases, none the streaming ones.
#pragma once

#include "moe/moe_common.cuh"
#include "moe/stream_workspace.h"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // sm_90a: the grouped-GEMM phases on wgmma
#include "moe/moe_gemm_sm90.cuh"
#endif

namespace kiln {

enum { kMoeStreamWarps = 16, kMoeStreamChunk = 4, kMoeStreamMaxExperts = 256, kMoeGemmRows = KILN_MOE_GEMM_ROWS };

struct Words4 {
  u32 w[4];
};

// 16 bytes of data that no kernel writes during the launch (weights, x), through the
// non-coherent path.
__device__ __forceinline__ Words4 load_readonly16(const void* p) {
  Words4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
  return v;
}
// 4 floats of the workspace, written by other CTAs before the last barrier: a coherent load.
__device__ __forceinline__ void load_workspace4(const float* p, float* v) {
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(p) : "memory");
}
// Workspace values written by other CTAs before the last barrier, read from L2 (not L1, which may
// hold an older copy of the line): weak loads, ordered by the barrier.
__device__ __forceinline__ int load_l2(const int* p) {
  int v;
  asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float load_l2(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void load_l2_4(const float* p, float* v) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(p) : "memory");
}
__device__ __forceinline__ int atomic_add_global(int* p, int v) {
  int old;
  asm volatile("atom.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// All CTAs of the (cooperative) grid arrive before any leaves; each counter is used once per
// launch and starts at zero (the workspace is zero-filled).
__device__ __forceinline__ void grid_barrier(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    unsigned seen = 0;
    while (seen < gridDim.x) asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  }
  __syncthreads();
}

// Two bf16 in a word to floats.
__device__ __forceinline__ void bf16x2_to_float(u32 w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
// 4 bf16 of the workspace (see load_l2) to floats.
__device__ __forceinline__ void load_l2_bf16x4(const bf16* p, float* v) {
  unsigned w[2];
  asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p) : "memory");
  bf16x2_to_float(w[0], v[0], v[1]);
  bf16x2_to_float(w[1], v[2], v[3]);
}
__device__ __forceinline__ u32 byte_permute(u32 a, u32 b, u32 selector) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}
// Eight e2m1 values (a word, low nibble first) to floats, exactly, on the integer pipe: every e2m1
// value is a bf16 whose two bytes a byte permute looks up by the 3-bit magnitude (four at a time),
// then the sign bit is moved into place. (f16 conversions measured 0.108 ms for the GPT-OSS layer
// at T=1: the conversion pipe, not memory, was the limit.)
__device__ __forceinline__ void e2m1x8_to_float(u32 w, float (&v)[8]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const u32 nibbles = half ? w >> 16 : w;
    const u32 magnitudes = nibbles & 0x77777777u;
    // bf16 of 0, 0.5, 1, 1.5, 2, 3, 4, 6: low bytes 00 00 80 C0 00 40 80 C0, high 00 3F 3F 3F 40 40 40 40
    const u32 low = byte_permute(0xC0800000u, 0xC0804000u, magnitudes);
    const u32 high = byte_permute(0x3F3F3F00u, 0x40404040u, magnitudes);
    const u32 pair01 = byte_permute(low, high, 0x5140u) | ((nibbles << 12) & 0x8000u) | ((nibbles << 24) & 0x80000000u);
    const u32 pair23 = byte_permute(low, high, 0x7362u) | ((nibbles << 4) & 0x8000u) | ((nibbles << 16) & 0x80000000u);
    bf16x2_to_float(pair01, v[4 * half], v[4 * half + 1]);
    bf16x2_to_float(pair23, v[4 * half + 2], v[4 * half + 3]);
  }
}

// One routed token, by one warp: lane j < top_k ends with slot j's expert (-1 when a precomputed
// id is outside [0, E)) and weight, written to the workspace, and the expert's count raised.
template <int kRouting, bool kLogitsBf16>
__device__ void route_token_warp(const KilnMoeParams& p, int t, int lane, int* ids, float* weights, int* counts) {
  const int k = p.top_k, experts = p.num_experts;
  int id = -1;
  float w = 0.0f;
  if (kRouting == kRoutingPrecomputed) {
    if (lane < k) {
      id = p.topk_ids[t * p.topk_row_stride + lane];
      w = p.topk_weights[t * p.topk_row_stride + lane];
    }
  } else {
    constexpr int kPerLane = kMoeStreamMaxExperts / kWarp;
    float l[kPerLane];
    float max_logit = neg_inf();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + kWarp * i;
      l[i] = e < experts ? logit<kLogitsBf16>(p, t, e) : neg_inf();
      max_logit = fmaxf(max_logit, l[i]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffffu, max_logit, offset));
    float total = 0.0f;
    if (kRouting == kRoutingSoftmaxTopk) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) total += lane + kWarp * i < experts ? expf(l[i] - max_logit) : 0.0f;
      total = warp_sum(total);
    }
    u32 taken = 0;  // bit i: expert lane + 32 i is chosen
    for (int j = 0; j < k; ++j) {
      float best = neg_inf();
      int best_e = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + kWarp * i;
        if (e < experts && !((taken >> i) & 1u) && (best_e == 0x7fffffff || l[i] > best)) {
          best = l[i];
          best_e = e;
        }
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, best, offset);
        const int other_e = __shfl_xor_sync(0xffffffffu, best_e, offset);
        if (other_e != 0x7fffffff && (best_e == 0x7fffffff || other > best || (other == best && other_e < best_e))) {
          best = other;
          best_e = other_e;
        }
      }
      if ((best_e & (kWarp - 1)) == lane) taken |= 1u << (best_e / kWarp);
      if (lane == j) {
        id = best_e;
        w = expf(best - max_logit);  // the max over all experts is also the max over the chosen
      }
    }
    const float chosen = warp_sum(lane < k ? w : 0.0f);
    w /= (kRouting == kRoutingTopkSoftmax || p.renormalize) ? chosen : total;
  }
  if (lane < k) {
    if (id < 0 || id >= experts) id = -1;
    ids[t * k + lane] = id;
    weights[t * k + lane] = w;
    if (id >= 0) atomic_add_global(&counts[id], 1);
  }
}

// The pairs of one work item: chunk `chunk` (over all experts, in expert order) is expert
// `expert`'s pairs [first, first + count) of the grouped list.
struct MoeChunk {
  int expert, first, count;
};
__device__ __forceinline__ MoeChunk find_chunk(const int* chunk_start, const int* pair_start, int experts, int chunk) {
  MoeChunk c;
  c.expert = find_expert(chunk_start, experts, chunk, 1);
  c.first = pair_start[c.expert] + (chunk - chunk_start[c.expert]) * kMoeStreamChunk;
  c.count = min(kMoeStreamChunk, pair_start[c.expert + 1] - c.first);
  return c;
}

// pair[lane] without indexing a register array by a run-time value (which would put it on the stack).
__device__ __forceinline__ int select_lane(const int (&pair)[kMoeStreamChunk], int lane) {
  int mine = 0;
#pragma unroll
  for (int m = 0; m < kMoeStreamChunk; ++m) mine = lane == m ? pair[m] : mine;
  return mine;
}

// Sums each of the chunk's accumulators over the warp; lane m (< count) gets sum m.
__device__ __forceinline__ float reduce_to_lane(float (&acc)[kMoeStreamChunk], int count, int lane) {
  float mine = 0.0f;
#pragma unroll
  for (int m = 0; m < kMoeStreamChunk; ++m) {
    if (m < count) {
      const float s = warp_sum(acc[m]);
      if (lane == m) mine = s;
    }
  }
  return mine;
}

// Gate and up dot products of one intermediate unit for the chunk's tokens (lane-partial sums).
template <int kFormat>
__device__ __forceinline__ void up_dots(const KilnMoeParams& p, int expert, int gate_row, int up_row, const int (&token)[kMoeStreamChunk],
                                        int count, int lane, float (&gate)[kMoeStreamChunk], float (&up)[kMoeStreamChunk]) {
  const bf16* x = static_cast<const bf16*>(p.x);
  if (kFormat == kWeightsBf16) {
    const bf16* g_row = static_cast<const bf16*>(p.w13) + expert * p.w13_expert_stride + gate_row * p.w13_row_stride;
    const bf16* u_row = static_cast<const bf16*>(p.w13) + expert * p.w13_expert_stride + up_row * p.w13_row_stride;
    const int chunks = p.hidden / 8;
    constexpr int kBatch = 4;  // 16-byte chunks per lane in flight for each row
    for (int c0 = lane; c0 < chunks; c0 += kWarp * kBatch) {
      Words4 gw[kBatch], uw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = c0 + kWarp * b;
        if (c < chunks) {
          gw[b] = load_readonly16(g_row + 8 * c);
          uw[b] = load_readonly16(u_row + 8 * c);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = c0 + kWarp * b;
        if (c >= chunks) break;
        float gf[8], uf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          bf16x2_to_float(gw[b].w[i], gf[2 * i], gf[2 * i + 1]);
          bf16x2_to_float(uw[b].w[i], uf[2 * i], uf[2 * i + 1]);
        }
#pragma unroll
        for (int m = 0; m < kMoeStreamChunk; ++m) {
          if (m < count) {
            const Words4 xw = load_readonly16(x + token[m] * p.x_row_stride + 8 * c);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              float x0, x1;
              bf16x2_to_float(xw.w[i], x0, x1);
              gate[m] += gf[2 * i] * x0 + gf[2 * i + 1] * x1;
              up[m] += uf[2 * i] * x0 + uf[2 * i + 1] * x1;
            }
          }
        }
      }
    }
  } else {
    const u8* g_row = static_cast<const u8*>(p.w13) + expert * p.w13_expert_stride + gate_row * p.w13_row_stride;
    const u8* u_row = static_cast<const u8*>(p.w13) + expert * p.w13_expert_stride + up_row * p.w13_row_stride;
    const u8* g_scales = p.w13_scale + expert * p.w13_scale_expert_stride + gate_row * p.w13_scale_row_stride;
    const u8* u_scales = p.w13_scale + expert * p.w13_scale_expert_stride + up_row * p.w13_scale_row_stride;
    const int blocks = p.hidden / 32;  // 16 bytes and one scale each
    // Software-pipelined: the next block's words and scales load while this one computes.
    Words4 g_next = {{0u, 0u, 0u, 0u}}, u_next = {{0u, 0u, 0u, 0u}};
    u8 gs_next = 0, us_next = 0;
    if (lane < blocks) {
      g_next = load_readonly16(g_row + 16 * lane);
      u_next = load_readonly16(u_row + 16 * lane);
      gs_next = g_scales[lane];
      us_next = u_scales[lane];
    }
    for (int c = lane; c < blocks; c += kWarp) {
      const Words4 gw = g_next, uw = u_next;
      const float g_scale = e8m0_to_float(gs_next), u_scale = e8m0_to_float(us_next);
      if (c + kWarp < blocks) {
        g_next = load_readonly16(g_row + 16 * (c + kWarp));
        u_next = load_readonly16(u_row + 16 * (c + kWarp));
        gs_next = g_scales[c + kWarp];
        us_next = u_scales[c + kWarp];
      }
      float g_part[kMoeStreamChunk], u_part[kMoeStreamChunk];
#pragma unroll
      for (int m = 0; m < kMoeStreamChunk; ++m) g_part[m] = u_part[m] = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // 8 values per word
        float gf[8], uf[8];
        e2m1x8_to_float(gw.w[i], gf);
        e2m1x8_to_float(uw.w[i], uf);
#pragma unroll
        for (int m = 0; m < kMoeStreamChunk; ++m) {
          if (m < count) {
            const Words4 xw = load_readonly16(x + token[m] * p.x_row_stride + 32 * c + 8 * i);
#pragma unroll
            for (int v = 0; v < 4; ++v) {
              float x0, x1;
              bf16x2_to_float(xw.w[v], x0, x1);
              g_part[m] += gf[2 * v] * x0 + gf[2 * v + 1] * x1;
              u_part[m] += uf[2 * v] * x0 + uf[2 * v + 1] * x1;
            }
          }
        }
      }
#pragma unroll
      for (int m = 0; m < kMoeStreamChunk; ++m) {
        gate[m] += g_part[m] * g_scale;
        up[m] += u_part[m] * u_scale;
      }
    }
  }
}

// W2 row h of one expert dotted with the chunk's act rows (lane-partial sums).
template <int kFormat>
__device__ __forceinline__ void down_dots(const KilnMoeParams& p, int expert, int h, const float* act, const int (&pair)[kMoeStreamChunk],
                                          int count, int lane, float (&acc)[kMoeStreamChunk]) {
  const long long inter = p.intermediate;
  if (kFormat == kWeightsBf16) {
    const bf16* row = static_cast<const bf16*>(p.w2) + expert * p.w2_expert_stride + h * p.w2_row_stride;
    const int chunks = p.intermediate / 8;
    constexpr int kBatch = 4;
    for (int c0 = lane; c0 < chunks; c0 += kWarp * kBatch) {
      Words4 ww[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (c0 + kWarp * b < chunks) ww[b] = load_readonly16(row + 8 * (c0 + kWarp * b));
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int c = c0 + kWarp * b;
        if (c >= chunks) break;
        float wf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) bf16x2_to_float(ww[b].w[i], wf[2 * i], wf[2 * i + 1]);
#pragma unroll
        for (int m = 0; m < kMoeStreamChunk; ++m) {
          if (m < count) {
            float a[8];
            load_workspace4(act + pair[m] * inter + 8 * c, a);
            load_workspace4(act + pair[m] * inter + 8 * c + 4, a + 4);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[m] += wf[i] * a[i];
          }
        }
      }
    }
  } else {
    const u8* row = static_cast<const u8*>(p.w2) + expert * p.w2_expert_stride + h * p.w2_row_stride;
    const u8* scales = p.w2_scale + expert * p.w2_scale_expert_stride + h * p.w2_scale_row_stride;
    const int blocks = p.intermediate / 32;
    Words4 next = {{0u, 0u, 0u, 0u}};  // software-pipelined as in up_dots
    u8 scale_next = 0;
    if (lane < blocks) {
      next = load_readonly16(row + 16 * lane);
      scale_next = scales[lane];
    }
    for (int c = lane; c < blocks; c += kWarp) {
      const Words4 ww = next;
      const float scale = e8m0_to_float(scale_next);
      if (c + kWarp < blocks) {
        next = load_readonly16(row + 16 * (c + kWarp));
        scale_next = scales[c + kWarp];
      }
      float part[kMoeStreamChunk];
#pragma unroll
      for (int m = 0; m < kMoeStreamChunk; ++m) part[m] = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float wf[8];
        e2m1x8_to_float(ww.w[i], wf);
#pragma unroll
        for (int m = 0; m < kMoeStreamChunk; ++m) {
          if (m < count) {
            float a[8];
            load_workspace4(act + pair[m] * inter + 32 * c + 8 * i, a);
            load_workspace4(act + pair[m] * inter + 32 * c + 8 * i + 4, a + 4);
#pragma unroll
            for (int v = 0; v < 8; ++v) part[m] += wf[v] * a[v];
          }
        }
      }
#pragma unroll
      for (int m = 0; m < kMoeStreamChunk; ++m) acc[m] += part[m] * scale;
    }
  }
}

template <int kFormat, int kActivation, int kLayout, int kRouting, bool kLogitsBf16, int kBias13, int kBias2>
__global__ void __launch_bounds__(kMoeStreamWarps * kWarp, 1) moe_stream(const KilnMoeParams p) {
  __shared__ int pair_start[kMoeStreamMaxExperts + 1];   // first grouped pair of each expert
  __shared__ int chunk_start[kMoeStreamMaxExperts + 1];  // first chunk of each expert
  __shared__ int mtile_start[kMoeStreamMaxExperts + 1];  // first 128-pair GEMM tile row of each expert
  const KilnMoeStreamWorkspace layout = kiln_moe_stream_workspace(p.num_tokens, p.top_k, p.num_experts, p.hidden, p.intermediate);
  unsigned char* ws = static_cast<unsigned char*>(p.workspace);
  unsigned* barriers = reinterpret_cast<unsigned*>(ws + layout.barriers);
  int* counts = reinterpret_cast<int*>(ws + layout.counts);
  int* fill = reinterpret_cast<int*>(ws + layout.fill);
  int* ids = reinterpret_cast<int*>(ws + layout.ids);
  float* weights = reinterpret_cast<float*>(ws + layout.weights);
  int* pairs = reinterpret_cast<int*>(ws + layout.pairs);
  float* act = reinterpret_cast<float*>(ws + layout.act);
  float* y = reinterpret_cast<float*>(ws + layout.y);

  const int lane = threadIdx.x & (kWarp - 1);
  const int warp = blockIdx.x * kMoeStreamWarps + (threadIdx.x >> 5), warps = gridDim.x * kMoeStreamWarps;
  const int thread = blockIdx.x * blockDim.x + threadIdx.x, threads = gridDim.x * blockDim.x;
  const int k = p.top_k, experts = p.num_experts, num_pairs = p.num_tokens * p.top_k;

  // route
  for (int t = warp; t < p.num_tokens; t += warps) route_token_warp<kRouting, kLogitsBf16>(p, t, lane, ids, weights, counts);
  grid_barrier(&barriers[0]);

  // group: every CTA derives the same offsets from the counts (warp 0: 8 experts per lane, then a
  // scan over the lanes).
  if (threadIdx.x < kWarp) {
    constexpr int kPerLane = kMoeStreamMaxExperts / kWarp;
    int n[kPerLane], lane_pairs = 0, lane_chunks = 0, lane_mtiles = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane * kPerLane + i;
      n[i] = e < experts ? *reinterpret_cast<volatile int*>(&counts[e]) : 0;
      lane_pairs += n[i];
      lane_chunks += (n[i] + kMoeStreamChunk - 1) / kMoeStreamChunk;
      lane_mtiles += (n[i] + kMoeGemmRows - 1) / kMoeGemmRows;
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
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane * kPerLane + i;
      if (e < experts) {
        pair_start[e] = pair_at;
        chunk_start[e] = chunk_at;
        mtile_start[e] = mtile_at;
      }
      pair_at += n[i];
      chunk_at += (n[i] + kMoeStreamChunk - 1) / kMoeStreamChunk;
      mtile_at += (n[i] + kMoeGemmRows - 1) / kMoeGemmRows;
    }
    if (lane == kWarp - 1) {
      pair_start[experts] = pairs_through;
      chunk_start[experts] = chunks_through;
      mtile_start[experts] = mtiles_through;
    }
  }
  __syncthreads();
  for (int q = thread; q < num_pairs; q += threads) {
    const int e = *reinterpret_cast<volatile int*>(&ids[q]);
    if (e >= 0) pairs[pair_start[e] + atomic_add_global(&fill[e], 1)] = q;
  }
  grid_barrier(&barriers[1]);
  const int total_chunks = chunk_start[experts];

  bool tensor_cores = false;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The launch gives the dynamic shared memory of the grouped GEMMs when the token count pays for
  // them (src/kernels/moe_stream.cpp); the pipelined tiles need 128-byte-aligned rows of K.
  unsigned dynamic_bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
  tensor_cores = kFormat == kWeightsBf16 && dynamic_bytes >= KILN_MOE_GEMM_SHARED_BYTES;
  if (tensor_cores) {
    extern __shared__ unsigned char moe_dynamic[];
    unsigned char* stages = moe_dynamic + ((1024 - (shared_address(moe_dynamic) & 1023)) & 1023);
    bf16* act16 = reinterpret_cast<bf16*>(act);
    bf16* y16 = reinterpret_cast<bf16*>(y);
    moe_gemm_phase<true, kActivation, kLayout, kBias13, kBias2>(p, stages, mtile_start, pair_start, pairs, act16, y16);
    grid_barrier(&barriers[2]);
    moe_gemm_phase<false, kActivation, kLayout, kBias13, kBias2>(p, stages, mtile_start, pair_start, pairs, act16, y16);
  }
#endif
  if (!tensor_cores) {
    // up: act[pair][r] for every routed pair and intermediate unit r.
    const long long up_items = static_cast<long long>(total_chunks) * p.intermediate;
    for (long long item = warp; item < up_items; item += warps) {
      const int chunk = static_cast<int>(item / p.intermediate), r = static_cast<int>(item % p.intermediate);
      const MoeChunk c = find_chunk(chunk_start, pair_start, experts, chunk);
      int pair[kMoeStreamChunk], token[kMoeStreamChunk];
#pragma unroll
      for (int m = 0; m < kMoeStreamChunk; ++m) {
        pair[m] = m < c.count ? *reinterpret_cast<volatile int*>(&pairs[c.first + m]) : 0;
        token[m] = pair[m] / k;
      }
      const int gate_row = kLayout == kGateUpInterleaved ? 2 * r : r;
      const int up_row = kLayout == kGateUpInterleaved ? 2 * r + 1 : p.intermediate + r;
      float gate[kMoeStreamChunk], up[kMoeStreamChunk];
#pragma unroll
      for (int m = 0; m < kMoeStreamChunk; ++m) gate[m] = up[m] = 0.0f;
      up_dots<kFormat>(p, c.expert, gate_row, up_row, token, c.count, lane, gate, up);
      const float g = reduce_to_lane(gate, c.count, lane), u = reduce_to_lane(up, c.count, lane);
      if (lane < c.count) {
        const long long bias = c.expert * p.w13_bias_expert_stride;
        act[static_cast<long long>(select_lane(pair, lane)) * p.intermediate + r] =
            glu_activation<kActivation>(g + moe_bias<kBias13>(p.w13_bias, bias + gate_row), u + moe_bias<kBias13>(p.w13_bias, bias + up_row));
      }
    }
    grid_barrier(&barriers[2]);

    // down: y[pair][h] for every routed pair and hidden row h.
    const long long down_items = static_cast<long long>(total_chunks) * p.hidden;
    for (long long item = warp; item < down_items; item += warps) {
      const int chunk = static_cast<int>(item / p.hidden), h = static_cast<int>(item % p.hidden);
      const MoeChunk c = find_chunk(chunk_start, pair_start, experts, chunk);
      int pair[kMoeStreamChunk];
#pragma unroll
      for (int m = 0; m < kMoeStreamChunk; ++m) pair[m] = m < c.count ? *reinterpret_cast<volatile int*>(&pairs[c.first + m]) : 0;
      float acc[kMoeStreamChunk];
#pragma unroll
      for (int m = 0; m < kMoeStreamChunk; ++m) acc[m] = 0.0f;
      down_dots<kFormat>(p, c.expert, h, act, pair, c.count, lane, acc);
      const float s = reduce_to_lane(acc, c.count, lane);
      if (lane < c.count) {
        y[static_cast<long long>(select_lane(pair, lane)) * p.hidden + h] = s + moe_bias<kBias2>(p.w2_bias, c.expert * p.w2_bias_expert_stride + h);
      }
    }
  }
  grid_barrier(&barriers[3]);

  // combine, in slot order. Each thread owns 4 consecutive hidden units of a token (one when H is
  // not a multiple of 4). ids, weights and y were written by other CTAs before the last barrier:
  // they are read through L2 (ld.global.cg), which this SM's L1 cannot hold stale. y is bf16 when
  // the grouped GEMMs wrote it (H is then a multiple of 64), else f32.
  const int width = p.hidden % 4 == 0 ? 4 : 1, per_token = p.hidden / width;
  const long long items = static_cast<long long>(p.num_tokens) * per_token;
  for (long long i = thread; i < items; i += threads) {
    const int t = static_cast<int>(i / per_token), h = static_cast<int>(i % per_token) * width;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < k; ++j) {
      const int q = t * k + j;
      if (load_l2(&ids[q]) < 0) continue;
      const float w = load_l2(&weights[q]);
      const float* row = &y[static_cast<long long>(q) * p.hidden + h];
      if (tensor_cores) {
        float v[4];
        load_l2_bf16x4(reinterpret_cast<const bf16*>(y) + static_cast<long long>(q) * p.hidden + h, v);
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e] += w * v[e];
      } else if (width == 4) {
        float v[4];
        load_l2_4(row, v);
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e] += w * v[e];
      } else {
        sum[0] += w * load_l2(row);
      }
    }
    bf16* out = static_cast<bf16*>(p.out) + t * p.out_row_stride + h;
    for (int e = 0; e < width; ++e) out[e] = from_float<bf16>(sum[e]);
  }
}

}  // namespace kiln
