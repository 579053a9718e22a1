// Merging the partial softmax states of a decode kernel's warps or wavefronts, and the end of a
// decode row (sink, normalization, out and lse). Portable: decode_merge.cuh (NVIDIA, split-KV)
// and decode_mfma.cuh (AMD) both use it.
#pragma once

#include "attention/params.h"
#include "common/prelude.cuh"

namespace kiln {

// exp(old - new) that is 0, not NaN, when nothing was seen yet.
__device__ __forceinline__ float rescale(float old_max, float new_max) { return old_max == neg_inf() ? 0.0f : __expf(old_max - new_max); }

// The softmax state of one (row, dim): running max (natural log), denominator, numerator.
struct MergedState {
  float m, l, acc;
};

// Row r, dim d of the first `parts` states (acc[w][r][d], m[w][r], m natural-log, l[w][r]).
template <int kMaxParts, int kRows, int kHeadDim>
__device__ __forceinline__ MergedState merge_parts(const float (&acc)[kMaxParts][kRows][kHeadDim], const float (&m)[kMaxParts][kRows],
                                                   const float (&l)[kMaxParts][kRows], int parts, int r, int d) {
  MergedState s{neg_inf(), 0.0f, 0.0f};
#pragma unroll 4
  for (int w = 0; w < parts; ++w) s.m = fmaxf(s.m, m[w][r]);
#pragma unroll 4
  for (int w = 0; w < parts; ++w) {
    const float c = rescale(m[w][r], s.m);
    s.l += l[w][r] * c;
    s.acc += acc[w][r][d] * c;
  }
  return s;
}

// Row r = j * kGroup + g of sequence b and KV head kv_head, dim d: adds the sink (it joins the
// denominator and adds no value), writes out and, for d == 0, lse.
template <typename T, int kQLen, int kGroup>
__device__ __forceinline__ void store_decode_row(const KilnDecodeParams& p, int b, int kv_head, int r, int d, MergedState s) {
  const int j = r / kGroup, head = kv_head * kGroup + r % kGroup;
  if (p.sinks != nullptr) {
    const float sink = p.sinks[head];
    const float with_sink = fmaxf(s.m, sink);
    const float c = rescale(s.m, with_sink);
    s.l = s.l * c + __expf(sink - with_sink);
    s.acc *= c;
    s.m = with_sink;
  }
  const int row = b * kQLen + j;
  T* out = static_cast<T*>(p.out) + row * p.out_row_stride + head * p.out_head_stride;
  out[d] = from_float<T>(s.l > 0.0f ? s.acc / s.l : 0.0f);
  if (p.lse != nullptr && d == 0) p.lse[row * p.lse_row_stride + head] = s.l > 0.0f ? s.m + logf(s.l) : neg_inf();
}

}  // namespace kiln
