// Reference decode attention over a paged KV cache: one warp per (new token, query head), keys
// visited one at a time through the page table with an online softmax in fp32.
// Launch: grid (Hq, batch * q_len), block 32.
#pragma once

#include "attention/online_softmax.cuh"
#include "attention/params.h"
#include "common/prelude.cuh"

namespace kiln {

template <typename T, typename Cache, int kHeadDim>
__global__ void __launch_bounds__(32) decode_reference(const KilnDecodeParams p) {
  constexpr int kPerLane = kHeadDim / 32;
  const int lane = threadIdx.x;
  const int head = blockIdx.x;
  const int q_row = blockIdx.y;
  const int batch = q_row / p.q_len;
  const int token = q_row % p.q_len;
  const int kv_head = head / (p.num_heads_q / p.num_heads_kv);
  const int len = p.cache_seqlens[batch];

  // The new token's position; it sees keys [lo, position].
  const int position = len - p.q_len + token;
  const int hi = len > 0 ? position + 1 : 0;
  const int lo = p.window_left >= 0 ? max(0, position - p.window_left) : 0;

  const T* q = static_cast<const T*>(p.q) + q_row * p.q_row_stride + head * p.q_head_stride;
  float q_slice[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) q_slice[i] = to_float(q[lane + 32 * i]);

  const int* pages = p.page_table + batch * p.page_table_stride;
  WarpSoftmaxRow<kHeadDim> row;
  row.init();
  for (int j = lo; j < hi; ++j) {
    const long long page = pages[j / p.page_size];
    const int slot = j % p.page_size;
    const Cache* k = static_cast<const Cache*>(p.k_cache) + page * p.k_page_stride + slot * p.k_row_stride + kv_head * p.k_head_stride;
    const Cache* v = static_cast<const Cache*>(p.v_cache) + page * p.v_page_stride + slot * p.v_row_stride + kv_head * p.v_head_stride;
    float partial = 0.0f, v_slice[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      partial += q_slice[i] * to_float(k[lane + 32 * i]) * p.k_scale;
      v_slice[i] = to_float(v[lane + 32 * i]) * p.v_scale;
    }
    row.add(softcap_score(warp_sum(partial) * p.softmax_scale, p.softcap), v_slice);
  }
  if (p.sinks != nullptr) row.add_sink(p.sinks[head]);

  T* out = static_cast<T*>(p.out) + q_row * p.out_row_stride + head * p.out_head_stride;
  const float lse = row.store(out, lane);
  if (p.lse != nullptr && lane == 0) p.lse[q_row * p.lse_row_stride + head] = lse;
}

}  // namespace kiln
