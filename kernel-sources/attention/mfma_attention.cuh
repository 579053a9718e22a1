// The per-block steps the AMD matrix-core attention kernels (prefill_mfma.cuh, decode_mfma.cuh)
// share. Both compute S^T = K Q^T on a 32x32 MFMA for a 32-key block: lane (col, h) holds the
// scores of its query col for keys 8 (r / 4) + 4 h + r % 4, register r.
#pragma once

#include "common/mfma.cuh"
#include "common/prelude.cuh"

namespace kiln {

#if defined(KILN_AMD)

// Element `at` of a K or V cache (`cache` of KvT elements) as the bits of a T: a 16-bit cache as
// stored, an e4m3 one widened, exactly (every e4m3 value is a bf16 and an f16).
template <typename T, typename KvT>
__device__ __forceinline__ u16 cache_bits(const void* cache, long long at) {
  if constexpr (__is_same(KvT, e4m3))
    return from_float<T>(to_float(e4m3{static_cast<const u8*>(cache)[at]})).bits;
  else
    return static_cast<const u16*>(cache)[at];
}

// S^T for one key block: A = this lane's K row (key col of the block, at element `k_row` of a
// KvT cache; zeros when `valid` is false), its dims ks * kMfmaK + h * kMfmaHalfK + i of each step;
// B = Q^T, `qb` as the kernels load it.
template <typename T, int kKSteps, typename KvT = T>
__device__ __forceinline__ mfma_f32x16 mfma_scores_transposed(const void* cache, long long k_row, bool valid, int h,
                                                              const u16 (&qb)[kKSteps][kMfmaHalfK]) {
  mfma_f32x16 s = mfma_f32x16{};
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    u16 ka[kMfmaHalfK];
#pragma unroll
    for (int i = 0; i < kMfmaHalfK; ++i) ka[i] = valid ? cache_bits<T, KvT>(cache, k_row + ks * kMfmaK + h * kMfmaHalfK + i) : u16(0);
    s = mfma_32x32<T>(ka, qb[ks], s);
  }
  return s;
}

// `x`: this lane's 16 scores, scaled, capped, in the log2 domain and masked to -inf. Raises the
// running max `m_run` (shared by both halves of the wavefront), rescales this lane's sum `l_run`
// and O^T, adds the block's probabilities to `l_run`, and returns P^T as 16-bit values in the
// accumulator's key order (the B operand of O^T += V^T P^T).
template <typename T, int kDBlocks>
__device__ __forceinline__ void mfma_softmax_step(const float (&x)[16], float& m_run, float& l_run, mfma_f32x16 (&o)[kDBlocks],
                                                  u16 (&pt)[16]) {
  float block_max = neg_inf();
#pragma unroll
  for (int r = 0; r < 16; ++r) block_max = fmaxf(block_max, x[r]);
  block_max = fmaxf(block_max, other_half(block_max));
  const float new_m = fmaxf(m_run, block_max);
  const float factor = m_run == neg_inf() ? 0.0f : exp2f(m_run - new_m);
  m_run = new_m;
  l_run *= factor;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const float pr = x[r] == neg_inf() ? 0.0f : exp2f(x[r] - new_m);
    l_run += pr;
    pt[r] = from_float<T>(pr).bits;
  }
#pragma unroll
  for (int d = 0; d < kDBlocks; ++d) o[d] *= factor;
}

#endif  // KILN_AMD

}  // namespace kiln
