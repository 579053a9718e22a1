// Paged decode attention, split over the KV sequence across the CTAs of a thread-block cluster.
//
// Grid (splits, Hkv, batch), cluster (splits, 1, 1), block 128. A CTA reads its share of one
// sequence's K and V for one KV head exactly once and serves every query row of the GQA group and
// all q_len new tokens from it (kRows = kQLen * kGroup rows). A warp streams 32 / (D/8) tokens at a
// time, each lane loading 16 bytes of K and of V, the next tokens' loads issued before this
// token's math. Partial softmax states are merged across the token streams of a warp
// (shuffles), the warps of a CTA (shared memory) and the CTAs of the cluster (distributed shared
// memory); cluster rank 0 writes the output. No workspace, one launch.
#pragma once

#include "attention/decode_merge.cuh"
#include "attention/params.h"
#include "common/cluster.cuh"
#include "common/prelude.cuh"

namespace kiln {

template <typename T, int kHeadDim, int kQLen, int kGroup>
__global__ void __launch_bounds__(128, 3) decode_split_sm90(const KilnDecodeParams p) {
  constexpr int kRows = kQLen * kGroup;
  constexpr int kLanesPerToken = kHeadDim / 8;  // 16 bytes of bf16/f16 per lane
  constexpr int kStreams = 32 / kLanesPerToken;  // tokens a warp handles at once
  constexpr int kWarps = 4;
  constexpr int kStep = kWarps * kStreams;

  __shared__ float warp_acc[kWarps][kRows][kHeadDim];
  __shared__ float warp_m[kWarps][kRows], warp_l[kWarps][kRows];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int stream = lane / kLanesPerToken, chunk = lane % kLanesPerToken;
  const int splits = gridDim.x, split = blockIdx.x;
  const int kv_head = blockIdx.y, b = blockIdx.z;
  const int len = p.cache_seqlens[b];

  // Query rows r = new token j * kGroup + head g, pre-scaled. New token j sits at position
  // len - kQLen + j and sees keys in [position - window_left, position].
  float q[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int j = r / kGroup, g = r % kGroup;
    const T* src = static_cast<const T*>(p.q) + (b * kQLen + j) * p.q_row_stride + (kv_head * kGroup + g) * p.q_head_stride + chunk * 8;
    float f[8];
    unpack8<T>(load16(src), f);
#pragma unroll
    for (int k = 0; k < 8; ++k) q[r][k] = f[k] * p.softmax_scale;
  }
  const int window = p.window_left >= 0 ? p.window_left : (1 << 30);

  // This CTA's share of the keys any row sees: [first, len).
  const int first = max(0, len - kQLen - window);
  const int total = max(0, len - first);
  const int share = (total + splits - 1) / splits;
  const int t0 = first + split * share, t1 = min(len, t0 + share);

  float m[kRows], l[kRows], acc[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = neg_inf();
    l[r] = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[r][k] = 0.0f;
  }

  const int* pages = p.page_table + b * p.page_table_stride;
  auto address = [&](const void* cache, long long page_stride, long long row_stride, long long head_stride, int t) {
    const long long page = pages[t / p.page_size];
    return static_cast<const T*>(cache) + page * page_stride + (t % p.page_size) * row_stride + kv_head * head_stride + chunk * 8;
  };
  // The whole warp iterates together (the reductions shuffle across all lanes); a stream past
  // the end loads nothing and contributes nothing.
  int t = t0 + warp * kStreams + stream;
  Bf16x8 k_next{}, v_next{};
  if (t < t1) {
    k_next = load16(address(p.k_cache, p.k_page_stride, p.k_row_stride, p.k_head_stride, t));
    v_next = load16(address(p.v_cache, p.v_page_stride, p.v_row_stride, p.v_head_stride, t));
  }
  for (int base = t0 + warp * kStreams; base < t1; base += kStep, t += kStep) {
    const Bf16x8 k_cur = k_next, v_cur = v_next;
    const bool valid = t < t1;
    const int t_next = t + kStep;
    if (t_next < t1) {  // the next tokens' loads go out before this token's math
      k_next = load16(address(p.k_cache, p.k_page_stride, p.k_row_stride, p.k_head_stride, t_next));
      v_next = load16(address(p.v_cache, p.v_page_stride, p.v_row_stride, p.v_head_stride, t_next));
    }
    float kf[8], vf[8];
    unpack8<T>(k_cur, kf);
    unpack8<T>(v_cur, vf);
    const int rel = t - (len - kQLen);  // token j sees this key when rel <= j and rel >= j - window
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int j = r / kGroup;
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) s += q[r][k] * kf[k];
#pragma unroll
      for (int off = kLanesPerToken / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      s = softcap_score(s, p.softcap);
      if (valid && rel <= j && rel >= j - window) {
        const float new_m = fmaxf(m[r], s);
        const float old = rescale(m[r], new_m);
        const float w = __expf(s - new_m);
        l[r] = l[r] * old + w;
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[r][k] = acc[r][k] * old + w * vf[k];
        m[r] = new_m;
      }
    }
  }

  // Merge the token streams of the warp: lanes with the same chunk, different streams.
#pragma unroll
  for (int off = kLanesPerToken; off < 32; off <<= 1) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float m_o = __shfl_xor_sync(0xffffffffu, m[r], off);
      const float l_o = __shfl_xor_sync(0xffffffffu, l[r], off);
      const float new_m = fmaxf(m[r], m_o);
      const float a = rescale(m[r], new_m), c = rescale(m_o, new_m);
      l[r] = l[r] * a + l_o * c;
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[r][k] = acc[r][k] * a + __shfl_xor_sync(0xffffffffu, acc[r][k], off) * c;
      m[r] = new_m;
    }
  }
  if (stream == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int k = 0; k < 8; ++k) warp_acc[warp][r][chunk * 8 + k] = acc[r][k];
      if (chunk == 0) {
        warp_m[warp][r] = m[r];
        warp_l[warp][r] = l[r];
      }
    }
  }
  merge_and_store<T, kHeadDim, kQLen, kGroup, kWarps>(p, warp_acc, warp_m, warp_l, b, kv_head, splits);
}

}  // namespace kiln
