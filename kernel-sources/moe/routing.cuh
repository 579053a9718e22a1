// MoE routing and grouping: top-k of a token's router logits by one warp, and the (token, slot)
// pairs listed under their experts in chunks of up to kMoeStreamChunk (moe.apply.stream).
#pragma once

#include "common/atomics.cuh"
#include "common/grid_barrier.cuh"
#include "common/shared_address.cuh"
#include "moe/moe_common.cuh"
#include "moe/stream_workspace.h"

namespace kiln {

enum { kMoeStreamChunk = 8, kMoeStreamMaxExperts = 256 };

// The arg-max of routing, by redux.sync (sm_80+) on keys ordered as the logits: a larger logit has
// a larger key, -0 and +0 share one, and a NaN takes 1, below every number (NaN logits are chosen
// last, by expert, as in the reference kernel); 0 marks an expert out of the running.
__device__ __forceinline__ u32 logit_key(float v) {
  if (v != v) return 1u;
  const u32 bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}
__device__ __forceinline__ float key_logit(u32 key) { return __uint_as_float((key & 0x80000000u) ? key & 0x7FFFFFFFu : ~key); }
__device__ __forceinline__ u32 warp_max_u32(u32 v) {
  u32 r;
  asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ u32 warp_min_u32(u32 v) {
  u32 r;
  asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
  return r;
}
// One routed token, by one warp: lane j < top_k ends with slot j's expert (-1 when a precomputed
// id is outside [0, E)) and weight, written to `ids` and `weights` (the workspace, or this CTA's
// shared memory when it routes every token itself), and the expert's count raised (in `counts`,
// shared memory when `shared_counts`; none when `counts` is null).
template <int kRouting, bool kLogitsBf16>
__device__ void route_token_warp(const KilnMoeParams& p, int t, int lane, int* ids, float* weights, int* counts, bool shared_counts) {
  const int k = p.top_k, experts = p.num_experts;
  int id = -1;
  float w = 0.0f;
  if (kRouting == kRoutingPrecomputed) {
    if (lane < k) {
      id = p.topk_ids[t * p.topk_row_stride + lane];
      w = p.topk_weights[t * p.topk_row_stride + lane];
    }
  } else {
    // Lane l holds experts l + 32 i as logits and as keys (logit_key; 0 once taken or past E).
    // Every load is issued before any is used: past E a lane reads expert E - 1 again, so no load
    // sits behind a branch (loaded under `e < E`, each load waited for the one before it; on an
    // H200, GPT-OSS MXFP4 at T = 1 took 0.0423 ms against 0.0428).
    constexpr int kPerLane = kMoeStreamMaxExperts / kWarp;
    float l[kPerLane];
    u32 key[kPerLane], lane_max = 0u;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) l[i] = logit<kLogitsBf16>(p, t, min(lane + kWarp * i, experts - 1));
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + kWarp * i;
      key[i] = e < experts ? logit_key(l[i]) : 0u;
      lane_max = max(lane_max, key[i]);
    }
    const float max_logit = key_logit(warp_max_u32(lane_max));
    float total = 0.0f;
    if (kRouting == kRoutingSoftmaxTopk) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) total += lane + kWarp * i < experts ? expf(l[i] - max_logit) : 0.0f;
      total = warp_sum(total);
    }
    // Arg-max k times: the largest key in the warp, then the lowest expert holding it (two
    // redux.sync). On an H200 at GPT-OSS's T = 1 the 4 rounds took 0.7 us, against 1.6 for the
    // shuffle tree they replace (bench/RESULTS.md).
    for (int j = 0; j < k; ++j) {
      u32 best = 0u, best_e = 0xFFFFFFFFu;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        if (key[i] > best) {  // strictly: the lowest of the lane's equal keys stays
          best = key[i];
          best_e = static_cast<u32>(lane + kWarp * i);
        }
      }
      const u32 top = warp_max_u32(best);
      const u32 chosen_e = warp_min_u32(best == top ? best_e : 0xFFFFFFFFu);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        if (static_cast<u32>(lane + kWarp * i) == chosen_e) key[i] = 0u;
      }
      if (lane == j) {
        id = top == 0u ? -1 : static_cast<int>(chosen_e);  // top 0: fewer than k experts
        w = expf(key_logit(top) - max_logit);              // the max over all experts is also the max over the chosen
      }
    }
    const float chosen = warp_sum(lane < k ? w : 0.0f);
    w /= (kRouting == kRoutingTopkSoftmax || p.renormalize) ? chosen : total;
  }
  if (lane < k) {
    id = moe_known_expert(id, experts);
    ids[t * k + lane] = id;
    weights[t * k + lane] = w;
    if (id >= 0 && counts != nullptr) {
      if (shared_counts)
        atomic_add_shared(shared_address(&counts[id]), 1);
      else
        atomic_add_global(&counts[id], 1);
    }
  }
}

// Whether every CTA routes all tokens itself (see the kernel and kiln_moe_routes_locally).
template <int kFormat>
__device__ __forceinline__ bool moe_routes_locally(const KilnMoeParams& p, bool tensor_cores, unsigned dynamic_bytes) {
  return kiln_moe_routes_locally(p.num_tokens, p.hidden, kFormat != kWeightsBf16, tensor_cores, KILN_MOE_LARGE_BATCH, dynamic_bytes);
}

// A pair index of the grouped list: from this CTA's shared memory (local routing), or from the
// workspace, written by other CTAs before the last grid barrier (through L2, see load_l2).
__device__ __forceinline__ int read_pair(const int* pairs, int i, bool local) { return local ? pairs[i] : load_l2(&pairs[i]); }

// The pairs of one work item: chunk `chunk` (over all experts, in expert order) is expert
// `expert`'s pairs [first, first + count) of the grouped list.
struct MoeChunk {
  int expert, first, count;
};
// Up to this many chunks, the group phase also lists each chunk (chunk_table), so that a tile
// finds its chunk in shared loads rather than a search over all experts (7 dependent loads at 128
// experts; on an H200, GPT-OSS at T = 1: MXFP4 0.0405 ms against 0.0408, bf16 0.0680 against
// 0.0694). Past it (null table) the chunk is found from chunk_start and pair_start.
enum { kMoeChunkTable = 256 };
__device__ __forceinline__ MoeChunk find_chunk(const int* chunk_start, const MoeChunk* chunk_table, const int* pair_start, int experts,
                                               int chunk) {
  if (chunk_table != nullptr) return chunk_table[chunk];
  MoeChunk c;
  c.expert = find_expert(chunk_start, experts, chunk, 1);
  c.first = pair_start[c.expert] + (chunk - chunk_start[c.expert]) * kMoeStreamChunk;
  c.count = min(kMoeStreamChunk, pair_start[c.expert + 1] - c.first);
  return c;
}
// The chunks of `count` pairs of `expert` from grouped pair `first` on, into the table from chunk
// `at` on.
__device__ __forceinline__ void list_chunks(MoeChunk* chunk_table, int at, int expert, int first, int count) {
  for (int c = 0; c * kMoeStreamChunk < count; ++c) {
    chunk_table[at + c] = MoeChunk{expert, first + c * kMoeStreamChunk, min(kMoeStreamChunk, count - c * kMoeStreamChunk)};
  }
}
// Grouping at most a warp's worth of locally routed pairs, by one warp and without a pass over
// every expert: lane q holds pair q's expert (-1: none), and its place in the grouped list is the
// number of pairs of lower experts plus its rank among its expert's pairs (pair order, as the
// general path lists them). Fills the chunk table, chunk_start[experts] (the number of chunks)
// and the grouped list. (The general path's scan over 256 expert slots and its pair listing took
// about 1.7 us of warp 0 at GPT-OSS's T = 1 on an H200; with this, MXFP4 with biases took 0.0385 ms
// against 0.0399, bf16 0.0701 against 0.0715.)
__device__ void group_few_pairs(const int* ids, int num_pairs, int experts, int lane, int* chunk_start, MoeChunk* chunk_table, int* pairs) {
  const int e = lane < num_pairs ? ids[lane] : -1;
  const unsigned same = __match_any_sync(0xffffffffu, e);
  const int rank = __popc(same & ((1u << lane) - 1u)), n = __popc(same);
  const bool leader = e >= 0 && rank == 0;
  const int chunks = leader ? (n + kMoeStreamChunk - 1) / kMoeStreamChunk : 0;
  int pairs_before = 0, chunks_before = 0;
  for (int j = 0; j < kWarp; ++j) {
    const int ej = __shfl_sync(0xffffffffu, e, j), cj = __shfl_sync(0xffffffffu, chunks, j);
    if (ej >= 0 && ej < e) {
      ++pairs_before;
      chunks_before += cj;
    }
  }
  if (e >= 0) pairs[pairs_before + rank] = lane;
  if (leader) list_chunks(chunk_table, chunks_before, e, pairs_before, n);
  const int total = __reduce_add_sync(0xffffffffu, chunks);
  if (lane == 0) chunk_start[experts] = total;
}

}  // namespace kiln
