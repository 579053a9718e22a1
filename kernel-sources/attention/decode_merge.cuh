// For decode kernels that split a sequence over several CTAs: the merge of per-warp softmax states
// across the CTA, then across the CTAs of one (sequence, KV head) through the workspace.
//
// Each split CTA writes its state to the workspace (layout: attention/decode_workspace.h) and takes
// a ticket; the CTA that draws the last ticket merges all states and writes out. No CTA waits for
// another, so the grid needs no co-residency and no cluster.
#pragma once

#include "attention/decode_workspace.h"
#include "attention/merge_states.cuh"
#include "attention/params.h"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"

namespace kiln {

// Merges the states of the first `warps` warps (warp_acc[w][row][d], warp_m[w][row], warp_l[w][row]; rows
// r = j * kGroup + g) over the warps of the CTA, then over the `splits` CTAs of (b, kv_head), adds
// the sink, and writes out (and lse). `scratch` is shared memory the caller no longer needs, at
// least 2 * splits * kRows floats (warp_acc's, once the warps are merged).
template <typename T, int kHeadDim, int kQLen, int kGroup, int kMaxWarps>
__device__ void merge_and_store(const KilnDecodeParams& p, float (&warp_acc)[kMaxWarps][kQLen * kGroup][kHeadDim],
                                float (&warp_m)[kMaxWarps][kQLen * kGroup], float (&warp_l)[kMaxWarps][kQLen * kGroup],
                                int warps, int b, int kv_head, int split, int splits) {
  constexpr int kRows = kQLen * kGroup;
  constexpr int kStateFloats = static_cast<int>(kiln_decode_state_floats(kRows, kHeadDim));
  __shared__ float cta_m[kRows], cta_l[kRows];
  __shared__ int is_last;
  __syncthreads();

  // Merge the warps of the CTA: thread i owns (row, dim) pairs i, i + blockDim.x, ... An unsplit
  // CTA writes out directly; a split one writes its state to the workspace.
  const int pair = b * p.num_heads_kv + kv_head;
  float* const states = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kiln_decode_states_offset(p.batch * p.num_heads_kv));
  float* const mine = splits > 1 ? states + (static_cast<long long>(pair) * splits + split) * kStateFloats : nullptr;
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
    const int r = i / kHeadDim, d = i % kHeadDim;
    const MergedState s = merge_parts(warp_acc, warp_m, warp_l, warps, r, d);
    if (splits == 1) {
      store_decode_row<T, kQLen, kGroup>(p, b, kv_head, r, d, s);
      continue;
    }
    mine[2 * kRows + i] = s.acc;
    if (d == 0) {
      mine[r] = s.m;
      mine[kRows + r] = s.l;
    }
  }
  if (splits == 1) return;

  // The ticket: release this CTA's state, and the last CTA acquires everyone's.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomic_add_global(static_cast<int*>(p.workspace) + pair, 1) == splits - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  // Per split and row, the weight exp(m_split - m) of its state; per row, the merged m and l.
  // Other CTAs' states are read from L2 (__ldcg): L1 is not coherent.
  float* const split_weight = &warp_acc[0][0][0];  // [splits][kRows]; the warp states are merged
  float* const split_l = split_weight + splits * kRows;
  const float* const first = states + static_cast<long long>(pair) * splits * kStateFloats;
  for (int i = threadIdx.x; i < splits * kRows; i += blockDim.x) {
    const float* state = first + (i / kRows) * kStateFloats;
    split_weight[i] = __ldcg(state + i % kRows);
    split_l[i] = __ldcg(state + kRows + i % kRows);
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float m = neg_inf(), l = 0.0f;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, split_weight[s * kRows + r]);
    for (int s = 0; s < splits; ++s) {
      const float w = rescale(split_weight[s * kRows + r], m);
      l += split_l[s * kRows + r] * w;
      split_weight[s * kRows + r] = w;
    }
    cta_m[r] = m;
    cta_l[r] = l;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
    const int r = i / kHeadDim, d = i % kHeadDim;
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) acc += __ldcg(first + s * kStateFloats + 2 * kRows + i) * split_weight[s * kRows + r];
    store_decode_row<T, kQLen, kGroup>(p, b, kv_head, r, d, MergedState{cta_m[r], cta_l[r], acc});
  }
}

}  // namespace kiln
