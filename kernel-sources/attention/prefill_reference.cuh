// Reference prefill attention: one warp per (query row, head), keys visited one at a time with an
// online softmax in fp32. Plainly correct and slow; the oracle faster kernels are checked against.
// Launch: grid (ceil(max_seqlen_q / 4), Hq, batch), block 128.
#pragma once

#include "attention/online_softmax.cuh"
#include "attention/params.h"
#include "common/prelude.cuh"

namespace kiln {

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(128) prefill_reference(const KilnPrefillParams p) {
  constexpr int kPerLane = kHeadDim / 32;
  const int lane = threadIdx.x % 32;
  const int row_in_seq = blockIdx.x * 4 + threadIdx.x / 32;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int q_begin = p.cu_seqlens_q[batch];
  const int len_q = p.cu_seqlens_q[batch + 1] - q_begin;
  const int k_begin = p.cu_seqlens_k[batch];
  const int len_k = p.cu_seqlens_k[batch + 1] - k_begin;
  if (row_in_seq >= len_q) return;
  const int kv_head = head / (p.num_heads_q / p.num_heads_kv);

  // Visible keys [lo, hi): bottom-right aligned position of this query among the keys.
  const int position = row_in_seq + len_k - len_q;
  int lo = 0, hi = len_k;
  if (p.causal) hi = min(len_k, position + 1);
  if (p.window_left >= 0) lo = max(0, position - p.window_left);

  const T* q = static_cast<const T*>(p.q) + (q_begin + row_in_seq) * p.q_row_stride + head * p.q_head_stride;
  float q_slice[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) q_slice[i] = to_float(q[lane + 32 * i]);

  WarpSoftmaxRow<kHeadDim> row;
  row.init();
  for (int j = lo; j < hi; ++j) {
    const T* k = static_cast<const T*>(p.k) + (k_begin + j) * p.k_row_stride + kv_head * p.k_head_stride;
    const T* v = static_cast<const T*>(p.v) + (k_begin + j) * p.v_row_stride + kv_head * p.v_head_stride;
    float partial = 0.0f, v_slice[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      partial += q_slice[i] * to_float(k[lane + 32 * i]);
      v_slice[i] = to_float(v[lane + 32 * i]);
    }
    row.add(softcap_score(warp_sum(partial) * p.softmax_scale, p.softcap), v_slice);
  }
  if (p.sinks != nullptr) row.add_sink(p.sinks[head]);

  T* out = static_cast<T*>(p.out) + (q_begin + row_in_seq) * p.out_row_stride + head * p.out_head_stride;
  const float lse = row.store(out, lane);
  if (p.lse != nullptr && lane == 0) p.lse[(q_begin + row_in_seq) * p.lse_row_stride + head] = lse;
}

}  // namespace kiln
