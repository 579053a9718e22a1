// One query row's running softmax state, spread over a warp: each lane owns D/32 output columns.
// Used by the reference attention kernels, which walk keys one at a time.
#pragma once

#include "common/prelude.cuh"

namespace kiln {

template <int kHeadDim>
struct WarpSoftmaxRow {
  static constexpr int kPerLane = kHeadDim / 32;
  float acc[kPerLane];
  float max_score;
  float denominator;

  __device__ void init() {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
    max_score = neg_inf();
    denominator = 0.0f;
  }

  // exp(old max - new max), and 0 before the first finite score (avoids -inf - -inf = NaN).
  __device__ float rescale_factor(float new_max) const { return max_score == neg_inf() ? 0.0f : expf(max_score - new_max); }

  // Adds one key: `score` is the scaled (and capped) logit, `value` this lane's slice of V.
  __device__ void add(float score, const float (&value)[kPerLane]) {
    const float new_max = fmaxf(max_score, score);
    const float rescale = rescale_factor(new_max);
    const float p = expf(score - new_max);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] = acc[i] * rescale + p * value[i];
    denominator = denominator * rescale + p;
    max_score = new_max;
  }

  // A sink joins the denominator and adds no value.
  __device__ void add_sink(float sink) {
    const float new_max = fmaxf(max_score, sink);
    const float rescale = rescale_factor(new_max);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] *= rescale;
    denominator = denominator * rescale + (new_max == neg_inf() ? 0.0f : expf(sink - new_max));
    max_score = new_max;
  }

  // Writes this lane's columns (zeros when nothing was seen) and returns the log-sum-exp.
  template <typename T>
  __device__ float store(T* out_row, int lane) const {
    const float inv = denominator > 0.0f ? 1.0f / denominator : 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) out_row[lane + 32 * i] = from_float<T>(acc[i] * inv);
    return denominator > 0.0f ? max_score + logf(denominator) : neg_inf();
  }
};

}  // namespace kiln
