// Prefill attention on AMD matrix cores (MFMA; gfx90a, gfx942 = CDNA3, gfx950 = CDNA4), same
// semantics as the reference. COMPILE-VERIFIED ONLY: no AMD GPU has run this kernel.
//
// One wavefront (64 lanes) owns 32 query rows of one head and walks 32-key blocks, reading K and
// V straight from global memory (L2 serves the other wavefronts of the head). Both products are
// computed transposed so the softmax state never crosses lanes:
//   S^T = K Q^T  (32 keys x 32 queries): lane l holds query l % 32 and 16 of the block's keys;
//   O^T = V^T P^T (D dims x 32 queries): P^T's accumulator layout is exactly the B operand this
//                 product needs, and lane l again holds query l % 32.
// kPaged with an e4m3 cache (KvT = e4m3): K and V are widened to q's type as they load, exactly;
// k_scale joins the scores' scale and v_scale the output's, as in decode_mfma.cuh.
// The 32x32 MFMA layouts are in common/mfma.cuh. Any fixed permutation of a product's reduction
// index is harmless when A and B share it; the P^T operand of the 16-wide product takes the key
// order its accumulator layout gives (keys 8 (r / 4) + 4 h + r % 4), and V^T follows it.
// Launch: grid (ceil(max_seqlen_q / 32), Hq, batch), block 64.
#pragma once

#include "attention/mfma_attention.cuh"
#include "attention/params.h"
#include "attention/prefill_block.cuh"
#include "common/mfma.cuh"
#include "common/prelude.cuh"

namespace kiln {

#if defined(KILN_AMD)

// kPaged: K and V are paged caches (KilnPrefillParams::page_table): each row read finds its page.
// KvT: their element type, T or (paged only) e4m3.
template <typename T, int kHeadDim, bool kPaged = false, typename KvT = T>
__global__ void __launch_bounds__(64) prefill_mfma(const KilnPrefillParams p) {
  constexpr bool kFp8Cache = __is_same(KvT, e4m3);
  static_assert(!kFp8Cache || kPaged, "e4m3 K and V come from paged caches");
  constexpr int kBlock = 32;                  // queries per wavefront, keys per block
  constexpr int kKSteps = kHeadDim / kMfmaK;  // steps of S^T = K Q^T
  constexpr int kDBlocks = kHeadDim / 32;     // 32-dim row blocks of O^T
  constexpr int kPSteps = kBlock / kMfmaK;    // steps of O^T = V^T P^T per key block
  const int lane = static_cast<int>(threadIdx.x), col = lane & 31, h = lane >> 5;
  const PrefillQueryBlock blk = prefill_query_block(p, kBlock);
  if (blk.q0 >= blk.len_q) return;

  // Q^T as B operands: lane (col, h) holds query q0 + col, dims ks * kMfmaK + h * kMfmaHalfK + i.
  const int query = blk.q0 + col;
  const bool query_valid = query < blk.len_q;
  const u16* q_row = static_cast<const u16*>(p.q) + (blk.q_begin + (query_valid ? query : 0)) * p.q_row_stride + blk.head * p.q_head_stride;
  u16 qb[kKSteps][kMfmaHalfK];
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int i = 0; i < kMfmaHalfK; ++i) qb[ks][i] = query_valid ? q_row[ks * kMfmaK + h * kMfmaHalfK + i] : u16(0);
  }

  // Element offsets (of KvT) of this KV head's first key.
  const long long k_base = blk.k_begin * p.k_row_stride + blk.kv_head * p.k_head_stride;
  const long long v_base = blk.k_begin * p.v_row_stride + blk.kv_head * p.v_head_stride;
  const float score_scale = kFp8Cache ? p.softmax_scale * p.k_scale : p.softmax_scale;
  mfma_f32x16 o[kDBlocks];
#pragma unroll
  for (int d = 0; d < kDBlocks; ++d) o[d] = mfma_f32x16{};
  float m_run = neg_inf(), l_run = 0.0f;  // log2 domain; l_run sums this lane's keys only
  const float log2e = 1.4426950408889634f;
  const int position = query + blk.shift;

  for (int key0 = (blk.key_start / kBlock) * kBlock; key0 < blk.key_end; key0 += kBlock) {
    // S^T: A = K rows (lane (col, h): key key0 + col, its dims of each step).
    const int a_key = key0 + col;
    const bool a_valid = a_key < blk.len_k;
    const long long k_row = k_base + key_row_offset<kPaged>(p, blk.batch, a_valid ? a_key : 0, p.k_row_stride, p.k_page_stride);
    const mfma_f32x16 s = mfma_scores_transposed<T, kKSteps, KvT>(p.k, k_row, a_valid, h, qb);
    // Register r holds key key0 + 8 (r / 4) + 4 h + r % 4 for this lane's query.
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int key = key0 + 8 * (r / 4) + 4 * h + r % 4;
      float v = softcap_score(s[r] * score_scale, p.softcap) * log2e;
      if (key >= blk.len_k || (blk.upper_bound && key > position) || (p.window_left >= 0 && key < position - p.window_left)) {
        v = neg_inf();
      }
      x[r] = v;
    }
    u16 pt[16];  // P^T in this lane's accumulator order, as 16-bit values
    mfma_softmax_step<T>(x, m_run, l_run, o, pt);

    // O^T += V^T P^T, kMfmaK keys per step. B item i of step t is pt[r], r = t * kMfmaHalfK + i, in
    // the accumulator's key order; A takes V at the same keys: key0 + 8 (r / 4) + 4 h + r % 4.
#pragma unroll
    for (int t = 0; t < kPSteps; ++t) {
      u16 pb[kMfmaHalfK];
#pragma unroll
      for (int i = 0; i < kMfmaHalfK; ++i) pb[i] = pt[t * kMfmaHalfK + i];
#pragma unroll
      for (int d = 0; d < kDBlocks; ++d) {
        u16 va[kMfmaHalfK];
#pragma unroll
        for (int i = 0; i < kMfmaHalfK; ++i) {
          const int r = t * kMfmaHalfK + i, key = key0 + 8 * (r / 4) + 4 * h + r % 4;
          va[i] = key < blk.len_k
                      ? cache_bits<T, KvT>(
                            p.v, v_base + key_row_offset<kPaged>(p, blk.batch, key, p.v_row_stride, p.v_page_stride) + 32 * d + col)
                      : u16(0);  // P is 0 there; no NaN
        }
        o[d] = mfma_32x32<T>(va, pb, o[d]);
      }
    }
  }

  // Finish this lane's query: both halves' sums, the sink, normalization, lse.
  float l = l_run + other_half(l_run);
  float m_nat = m_run == neg_inf() ? neg_inf() : m_run / log2e, scale_o = 1.0f;
  if (p.sinks != nullptr) {  // the sink joins the denominator and adds no value
    const float sink = p.sinks[blk.head], with_sink = fmaxf(m_nat, sink);
    scale_o = m_nat == neg_inf() ? 0.0f : __expf(m_nat - with_sink);
    l = l * scale_o + __expf(sink - with_sink);
    m_nat = with_sink;
  }
  if (!query_valid) return;
  const float inv = (l > 0.0f ? scale_o / l : 0.0f) * (kFp8Cache ? p.v_scale : 1.0f);
  T* out = static_cast<T*>(p.out) + (blk.q_begin + query) * p.out_row_stride + blk.head * p.out_head_stride;
  // O^T register r of block d holds dim 32 d + 8 (r / 4) + 4 h + r % 4.
#pragma unroll
  for (int d = 0; d < kDBlocks; ++d) {
#pragma unroll
    for (int r = 0; r < 16; ++r) out[32 * d + 8 * (r / 4) + 4 * h + r % 4] = from_float<T>(o[d][r] * inv);
  }
  if (p.lse != nullptr && h == 0) p.lse[(blk.q_begin + query) * p.lse_row_stride + blk.head] = l > 0.0f ? m_nat + logf(l) : neg_inf();
}

#endif  // KILN_AMD

}  // namespace kiln
