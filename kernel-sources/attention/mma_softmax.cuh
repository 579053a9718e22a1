// The online-softmax step of the tensor-core attention kernels, on m16n8 accumulator fragments:
// a thread holds rows g and g + 8 (index `half` 0 and 1) of each key tile, and a row is spread
// over the four threads of a quad.
#pragma once

#include "attention/params.h"
#include "common/fast_math.cuh"
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

// A score as cap_and_mask_scores leaves it where the row sees its key.
template <bool kSoftcap>
__device__ __forceinline__ float capped_logit(const KilnPrefillParams& p, float x) {
  return kSoftcap ? softcap_score(x * p.softmax_scale, p.softcap) * 1.4426950408889634f : x;
}

// The masked pass of cap_and_mask_scores, with the bounds kCut names: 1 a row's first key `lo`,
// 2 its last `hi`, 3 both (relative to the thread's first key, per half).
template <bool kSoftcap, int kCut, int kKeyTiles>
__device__ __forceinline__ void mask_scores(float (&s)[kKeyTiles][4], const KilnPrefillParams& p, const int (&lo)[2], const int (&hi)[2]) {
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = n * 8 + (e & 1), half = e >> 1;
      const bool hidden = ((kCut & 1) && key < lo[half]) || ((kCut & 2) && key > hi[half]);
      s[n][e] = hidden ? neg_inf() : capped_logit<kSoftcap>(p, s[n][e]);
    }
  }
}

// Prepares a tile of raw Q K^T scores for online_softmax_step<true> in place: with a soft cap (a
// template flag, since its tanhf inlined for every score would crowd the instruction cache) turns
// them into log2-domain logits; without one leaves them raw, for the step scales them inside its
// exp2 (one FFMA per score; the scale is positive, so the max commutes with it). Either way, only
// where `edge` says the tile crosses a band edge or the end, -inf for keys a row does not see.
// Bounds are taken relative to the thread's first key, so each test is against a constant. The
// two paths are separate loops so the common one carries no mask code at all. kOneSided (the
// sliding-window kernel): an edge tile there is cut on one side only (a window's first keys, or
// the causal diagonal and the end), and where no row of the warp is cut on the other each score
// costs one compare, not two (warp votes pick the pass, so a warp takes one branch). On an H200
// GPT-OSS's window rows took 1.3% less time with it; in the warp-specialized kernel the votes and
// branches cost causal prefill 2.7% (bench/RESULTS.md, 2026-11-30).
// Prefill rows: row i sees keys from i + shift - window (with a window) to i + shift (causal,
// bottom-right aligned) or the end, within
// [0, len_k); the thread's rows are row_lo and row_lo + 8, its first key of the tile `first_key`.
template <bool kSoftcap, bool kOneSided = false, int kKeyTiles>
__device__ __forceinline__ void cap_and_mask_scores(float (&s)[kKeyTiles][4], const KilnPrefillParams& p, bool edge, int row_lo, int shift,
                                                    int len_k, int first_key) {
  if (!edge) {
    if (kSoftcap) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = capped_logit<kSoftcap>(p, s[n][e]);
      }
    }
    return;
  }
  int lo[2], hi[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int position = row_lo + 8 * half + shift;
    const int last = p.causal ? min(len_k - 1, position) : len_k - 1;
    hi[half] = last - first_key;
    lo[half] = (p.window_left >= 0 ? position - p.window_left : 0) - first_key;
  }
  if (!kOneSided) {
    mask_scores<kSoftcap, 3>(s, p, lo, hi);
    return;
  }
  constexpr int kLastKey = (kKeyTiles - 1) * 8 + 1;  // the thread's last key of the tile, relative
  const bool cut_left = __any_sync(0xffffffffu, lo[0] > 0 || lo[1] > 0);
  const bool cut_right = __any_sync(0xffffffffu, hi[0] < kLastKey || hi[1] < kLastKey);
  if (cut_left && cut_right) {
    mask_scores<kSoftcap, 3>(s, p, lo, hi);
  } else if (cut_left) {
    mask_scores<kSoftcap, 1>(s, p, lo, hi);
  } else {  // the right edge only, or neither
    mask_scores<kSoftcap, 2>(s, p, lo, hi);
  }
}

// What cap_and_mask_scores left still to multiply by to reach log2-domain logits.
template <bool kSoftcap>
__device__ __forceinline__ float pending_logit_scale(const KilnPrefillParams& p) {
  return kSoftcap ? 1.0f : p.softmax_scale * 1.4426950408889634f;
}

// One step over a tile of log2-domain logits `s` (masked to -inf), or with kScaled of scores that
// are such logits once multiplied by `scale` (> 0): updates the running max `m_row` and sum
// `l_row` of both rows (log2 domain), turns the scores into probabilities in place, and rescales
// the O accumulators. Maxima and sums run as two chains per row for shorter latency. `first`: the
// row's first tile, O still zero and not rescaled (a short band has few tiles, and the rescale is
// 32 multiplies at head_dim 64).
// online_softmax_probabilities is the step without the rescale: it leaves in `factor` what O's
// rows must be multiplied by (rescale_rows), for a kernel whose O is still in flight in an MMA.
// kLazy (the prefill kernels): where no row of the warp has a new maximum more than
// kStaleMaxLimit above its running one, the running maxima stay (probabilities up to
// 2^kStaleMaxLimit, no less exact in f32, bf16 or f16) and O needs no rescale: after a row's first
// blocks almost every block. Sums and O share the stale maximum, so the quotient is unchanged. The
// answer is warp-uniform, so the caller skips the rescale by a branch. On an H200 prefill took
// 1-7% less time; the split decode kernels, bound by memory, did not gain and keep rescaling
// (bench/RESULTS.md, 2026-11-30). Returns whether O must be rescaled by `factor`.
template <bool kScaled = false, bool kLazy = false, int kKeyTiles>
__device__ __forceinline__ bool online_softmax_probabilities(float (&s)[kKeyTiles][4], float (&m_row)[2], float (&l_row)[2], float scale,
                                                             float (&factor)[2]) {
  // A local constant: NVRTC emits a namespace-scope one as a global under a per-compile name, and
  // the binary would differ from compile to compile.
  constexpr float kStaleMaxLimit = 8.0f;
  auto probability = [&](float x, float m) { return exp2_ftz(kScaled ? fmaf(x, scale, -m) : x - m); };
  float m_use[2], new_m[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float a = neg_inf(), b = neg_inf();
#pragma unroll
    for (int n = 0; n < kKeyTiles; n += 2) {
      a = fmaxf(a, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      b = fmaxf(b, fmaxf(s[n + 1][2 * half], s[n + 1][2 * half + 1]));
    }
    const float tile_m = quad_max(fmaxf(a, b));
    new_m[half] = fmaxf(m_row[half], kScaled ? tile_m * scale : tile_m);
  }
  // A row's first key makes the difference +inf (a rescale, by 0); a row that still sees none
  // (-inf - -inf: NaN; rows past a sequence's end) needs none.
  const bool keep = kLazy && __all_sync(0xffffffffu, !(new_m[0] - m_row[0] > kStaleMaxLimit) && !(new_m[1] - m_row[1] > kStaleMaxLimit));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (keep) {
      factor[half] = 1.0f;
    } else {
      factor[half] = m_row[half] == neg_inf() ? 0.0f : exp2_ftz(m_row[half] - new_m[half]);
      m_row[half] = new_m[half];
    }
    m_use[half] = m_row[half] == neg_inf() ? 0.0f : m_row[half];  // a row masked so far: exp2(-inf - 0) = 0, not NaN
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float a = 0.0f, b = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeyTiles; n += 2) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        s[n][2 * half + j] = probability(s[n][2 * half + j], m_use[half]);
        s[n + 1][2 * half + j] = probability(s[n + 1][2 * half + j], m_use[half]);
        a += s[n][2 * half + j];
        b += s[n + 1][2 * half + j];
      }
    }
    l_row[half] = keep ? l_row[half] + (a + b) : l_row[half] * factor[half] + (a + b);
  }
  return !keep;
}
template <int kDTiles>
__device__ __forceinline__ void rescale_rows(float (&o)[kDTiles][4], const float (&factor)[2]) {
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) {
    o[n][0] *= factor[0];
    o[n][1] *= factor[0];
    o[n][2] *= factor[1];
    o[n][3] *= factor[1];
  }
}
template <bool kScaled = false, bool kLazy = false, int kKeyTiles, int kDTiles>
__device__ __forceinline__ void online_softmax_step(float (&s)[kKeyTiles][4], float (&m_row)[2], float (&l_row)[2], float (&o)[kDTiles][4],
                                                    float scale = 1.0f, bool first = false) {
  float factor[2];
  if (online_softmax_probabilities<kScaled, kLazy>(s, m_row, l_row, scale, factor) && !first) rescale_rows(o, factor);
}

// P's A fragments for P V (16 keys each) from probabilities in S's accumulator layout.
template <typename T, int kKeyTiles>
__device__ __forceinline__ void pack_p_fragments(const float (&s)[kKeyTiles][4], unsigned (&pa)[kKeyTiles / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
    pa[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// Finishes a prefill thread's two rows (row_lo and row_lo + 8, index `half`): the quad's partial
// sums and the sink (it joins the denominator and adds no value). Sets the row's final max `m_nat`
// (natural log) and sum `l`, and `scale_o`, the sink's share taken off O: O is multiplied by
// row_inverse(l, scale_o).
// The same with the row's sink given (`sink`, read where has_sink), for a kernel that reads it once.
template <typename Sink>
__device__ __forceinline__ void finish_row_with_sink(const float (&m_row)[2], float (&l_row)[2], int half, bool has_sink, Sink sink,
                                                     float& m_nat, float& l, float& scale_o) {
  const float ln2 = 0.6931471805599453f;  // a multiply, not an IEEE division
  l_row[half] = quad_sum(l_row[half]);
  m_nat = m_row[half] == neg_inf() ? neg_inf() : m_row[half] * ln2;
  l = l_row[half];
  scale_o = 1.0f;
  if (has_sink) {
    const float sink_logit = sink(), with_sink = fmaxf(m_nat, sink_logit);
    scale_o = m_nat == neg_inf() ? 0.0f : __expf(m_nat - with_sink);
    l = l * scale_o + __expf(sink_logit - with_sink);
    m_nat = with_sink;
  }
}
__device__ __forceinline__ void finish_prefill_row(const KilnPrefillParams& p, const float (&m_row)[2], float (&l_row)[2], int half,
                                                   int head, float& m_nat, float& l, float& scale_o) {
  finish_row_with_sink(
      m_row, l_row, half, p.sinks != nullptr, [&] { return p.sinks[head]; }, m_nat, l, scale_o);
}
// l is at most the key count, far below the 2^126 where __fdividef would return 0.
__device__ __forceinline__ float row_inverse(float l, float scale_o) { return l > 0.0f ? __fdividef(scale_o, l) : 0.0f; }
__device__ __forceinline__ float row_lse(float m_nat, float l) { return l > 0.0f ? m_nat + logf(l) : neg_inf(); }

// Finishes the rows and stores out (and lse); rows past the sequence are not stored.
template <typename T, int kDTiles>
__device__ __forceinline__ void store_prefill_rows(const KilnPrefillParams& p, const float (&o)[kDTiles][4], const float (&m_row)[2],
                                                   float (&l_row)[2], int head, int q_begin, int len_q, int row_lo, int c) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_lo + 8 * half;
    float m_nat, l, scale_o;
    finish_prefill_row(p, m_row, l_row, half, head, m_nat, l, scale_o);
    if (row >= len_q) continue;
    const float inv = row_inverse(l, scale_o);
    T* out = static_cast<T*>(p.out) + (q_begin + row) * p.out_row_stride + head * p.out_head_stride;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      *reinterpret_cast<unsigned*>(out + 8 * n + 2 * c) = pack2<T>(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
    if (p.lse != nullptr && c == 0) p.lse[(q_begin + row) * p.lse_row_stride + head] = row_lse(m_nat, l);
  }
}

}  // namespace kiln
