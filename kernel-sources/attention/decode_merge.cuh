// For decode kernels that split a sequence over the CTAs of a cluster: the merge of per-warp
// softmax states across the CTA and the cluster.
#pragma once

#include "attention/merge_states.cuh"
#include "attention/params.h"
#include "common/cluster.cuh"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"

namespace kiln {

// Merges the states of the first `warps` warps (warp_acc[w][row][d], warp_m[w][row], warp_l[w][row]; rows
// r = j * kGroup + g) over the warps of the CTA, then over the CTAs of the cluster in rank 0,
// adds the sink, and writes out (and lse).
template <typename T, int kHeadDim, int kQLen, int kGroup, int kMaxWarps>
__device__ void merge_and_store(const KilnDecodeParams& p, float (&warp_acc)[kMaxWarps][kQLen * kGroup][kHeadDim],
                                float (&warp_m)[kMaxWarps][kQLen * kGroup], float (&warp_l)[kMaxWarps][kQLen * kGroup],
                                int warps, int b, int kv_head, int splits) {
  constexpr int kRows = kQLen * kGroup;
  __shared__ float cta_acc[kRows][kHeadDim];
  __shared__ float cta_m[kRows], cta_l[kRows];
  __syncthreads();

  // Merge the warps of the CTA: thread i owns (row, dim) pairs i, i + blockDim.x, ...
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
    const int r = i / kHeadDim, d = i % kHeadDim;
    const MergedState s = merge_parts(warp_acc, warp_m, warp_l, warps, r, d);
    cta_acc[r][d] = s.acc;
    if (d == 0) {
      cta_m[r] = s.m;
      cta_l[r] = s.l;
    }
  }

  // Merge the CTAs of the cluster in rank 0, through distributed shared memory.
  cluster_sync();
  if (cluster_rank() == 0) {
    for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
      const int r = i / kHeadDim, d = i % kHeadDim;
      float mm = neg_inf();
      for (int c = 0; c < splits; ++c) mm = fmaxf(mm, load_from_cluster_rank(&cta_m[r], static_cast<unsigned>(c)));
      float ll = 0.0f, aa = 0.0f;
      for (int c = 0; c < splits; ++c) {
        const float scale = rescale(load_from_cluster_rank(&cta_m[r], static_cast<unsigned>(c)), mm);
        ll += load_from_cluster_rank(&cta_l[r], static_cast<unsigned>(c)) * scale;
        aa += load_from_cluster_rank(&cta_acc[r][d], static_cast<unsigned>(c)) * scale;
      }
      store_decode_row<T, kQLen, kGroup>(p, b, kv_head, r, d, MergedState{mm, ll, aa});
    }
  }
  cluster_sync();  // no CTA leaves while rank 0 may still read its shared memory
}

}  // namespace kiln
