// Reference prefill attention: one warp per (query row, head), keys visited one at a time with an
// online softmax in fp32. Plainly correct and slow; the oracle faster kernels are checked against.
// Also extend over a paged cache (KilnPrefillParams::page_table), of type Cache: the queries' type,
// or e4m3 dequantized with k_scale and v_scale.
// Launch: grid (ceil(max_seqlen_q / 4), Hq, batch), block 128.
#pragma once

#include "attention/online_softmax.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/prelude.cuh"

namespace kiln {

template <typename T, int kHeadDim, typename Cache = T>
__global__ void __launch_bounds__(128) prefill_reference(const KilnPrefillParams p) {
  constexpr int kPerLane = kHeadDim / 32;
  const int lane = threadIdx.x % 32;
  const int row_in_seq = blockIdx.x * 4 + threadIdx.x / 32;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const bool paged = p.page_table != nullptr;
  const int q_begin = p.q_len > 0 ? batch * p.q_len : p.cu_seqlens_q[batch];
  const int len_q = p.q_len > 0 ? p.q_len : p.cu_seqlens_q[batch + 1] - q_begin;
  const int k_begin = paged ? 0 : p.cu_seqlens_k[batch];
  const int len_k = paged ? p.cache_seqlens[batch] : p.cu_seqlens_k[batch + 1] - k_begin;
  if (row_in_seq >= len_q) return;
  const int kv_head = head / (p.num_heads_q / p.num_heads_kv);
  const float k_scale = paged ? p.k_scale : 1.0f, v_scale = paged ? p.v_scale : 1.0f;

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
    const long long k_at = paged ? key_row_offset<true>(p, batch, j, p.k_row_stride, p.k_page_stride) : (k_begin + j) * p.k_row_stride;
    const long long v_at = paged ? key_row_offset<true>(p, batch, j, p.v_row_stride, p.v_page_stride) : (k_begin + j) * p.v_row_stride;
    const Cache* k = static_cast<const Cache*>(p.k) + k_at + kv_head * p.k_head_stride;
    const Cache* v = static_cast<const Cache*>(p.v) + v_at + kv_head * p.v_head_stride;
    float partial = 0.0f, v_slice[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      partial += q_slice[i] * to_float(k[lane + 32 * i]) * k_scale;
      v_slice[i] = to_float(v[lane + 32 * i]) * v_scale;
    }
    row.add(softcap_score(warp_sum(partial) * p.softmax_scale, p.softcap), v_slice);
  }
  if (p.sinks != nullptr) row.add_sink(p.sinks[head]);

  T* out = static_cast<T*>(p.out) + (q_begin + row_in_seq) * p.out_row_stride + head * p.out_head_stride;
  const float lse = row.store(out, lane);
  if (p.lse != nullptr && lane == 0) p.lse[(q_begin + row_in_seq) * p.lse_row_stride + head] = lse;
}

}  // namespace kiln
