// The online-softmax step of the tensor-core attention kernels, on m16n8 accumulator fragments:
// a thread holds rows g and g + 8 (index `half` 0 and 1) of each key tile, and a row is spread
// over the four threads of a quad.
#pragma once

#include "attention/params.h"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"

namespace kiln {

// Max and sum over the quad that shares a row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One step over a tile of scores `s` (scaled to the log2 domain, masked to -inf) whose
// per-thread row maxima are `tile_max`: updates the running max `m_row` and sum `l_row` of both
// rows, turns the scores into probabilities in place, and rescales the O accumulators.
template <int kKeyTiles, int kDTiles>
__device__ __forceinline__ void online_softmax_step(float (&s)[kKeyTiles][4], float (&tile_max)[2], float (&m_row)[2],
                                                    float (&l_row)[2], float (&o)[kDTiles][4]) {
  float factor[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    tile_max[half] = quad_max(tile_max[half]);
    const float new_m = fmaxf(m_row[half], tile_max[half]);
    factor[half] = m_row[half] == neg_inf() ? 0.0f : exp2f(m_row[half] - new_m);
    m_row[half] = new_m;
    l_row[half] *= factor[half];
  }
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      const float pe = s[n][e] == neg_inf() ? 0.0f : exp2f(s[n][e] - m_row[half]);
      s[n][e] = pe;
      l_row[half] += pe;
    }
  }
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) {
    o[n][0] *= factor[0];
    o[n][1] *= factor[0];
    o[n][2] *= factor[1];
    o[n][3] *= factor[1];
  }
}

// Finishes a prefill thread's two rows (row_lo and row_lo + 8, index `half`): the quad's partial
// sums, the sink (it joins the denominator and adds no value), normalization, out and lse. `c` is
// the thread's index in its quad; rows past the sequence are not stored.
template <typename T, int kDTiles>
__device__ __forceinline__ void store_prefill_rows(const KilnPrefillParams& p, const float (&o)[kDTiles][4], const float (&m_row)[2],
                                                   float (&l_row)[2], int head, int q_begin, int len_q, int row_lo, int c) {
  const float log2e = 1.4426950408889634f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l_row[half] = quad_sum(l_row[half]);
    const int row = row_lo + 8 * half;
    float m_nat = m_row[half] == neg_inf() ? neg_inf() : m_row[half] / log2e;
    float l = l_row[half], scale_o = 1.0f;
    if (p.sinks != nullptr) {
      const float sink = p.sinks[head], with_sink = fmaxf(m_nat, sink);
      scale_o = m_nat == neg_inf() ? 0.0f : __expf(m_nat - with_sink);
      l = l * scale_o + __expf(sink - with_sink);
      m_nat = with_sink;
    }
    if (row >= len_q) continue;
    const float inv = l > 0.0f ? scale_o / l : 0.0f;
    T* out = static_cast<T*>(p.out) + (q_begin + row) * p.out_row_stride + head * p.out_head_stride;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      *reinterpret_cast<unsigned*>(out + 8 * n + 2 * c) = pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
    if (p.lse != nullptr && c == 0) p.lse[(q_begin + row) * p.lse_row_stride + head] = l > 0.0f ? m_nat + logf(l) : neg_inf();
  }
}

}  // namespace kiln
