// For decode kernels that split a sequence over the CTAs of a cluster: the merge of per-warp
// softmax states across the CTA and the cluster.
#pragma once

#include "attention/params.h"
#include "common/cluster.cuh"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"

namespace kiln {

// exp(old - new) that is 0, not NaN, when nothing was seen yet.
__device__ __forceinline__ float rescale(float old_max, float new_max) {
  return old_max == neg_inf() ? 0.0f : __expf(old_max - new_max);
}

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
    float mm = neg_inf();
#pragma unroll 4
    for (int w = 0; w < warps; ++w) mm = fmaxf(mm, warp_m[w][r]);
    float ll = 0.0f, aa = 0.0f;
#pragma unroll 4
    for (int w = 0; w < warps; ++w) {
      const float c = rescale(warp_m[w][r], mm);
      ll += warp_l[w][r] * c;
      aa += warp_acc[w][r][d] * c;
    }
    cta_acc[r][d] = aa;
    if (d == 0) {
      cta_m[r] = mm;
      cta_l[r] = ll;
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
      const int j = r / kGroup, g = r % kGroup;
      const int head = kv_head * kGroup + g;
      if (p.sinks != nullptr) {  // the sink joins the denominator and adds no value
        const float sink = p.sinks[head];
        const float with_sink = fmaxf(mm, sink);
        const float c = rescale(mm, with_sink);
        ll = ll * c + __expf(sink - with_sink);
        aa *= c;
        mm = with_sink;
      }
      const int row = b * kQLen + j;
      T* out = static_cast<T*>(p.out) + row * p.out_row_stride + head * p.out_head_stride;
      out[d] = from_float<T>(ll > 0.0f ? aa / ll : 0.0f);
      if (p.lse != nullptr && d == 0) p.lse[row * p.lse_row_stride + head] = ll > 0.0f ? mm + logf(ll) : neg_inf();
    }
  }
  cluster_sync();  // no CTA leaves while rank 0 may still read its shared memory
}

}  // namespace kiln
