// What the MoE kernels share: the enumerations their template arguments use, weight and bias
// reads, router logits and the gated activations.
#pragma once

#include "common/prelude.cuh"
#include "moe/mxfp4_prepared.h"
#include "moe/mxfp8_activations.h"
#include "moe/params.h"

namespace kiln {

// kWeightsMxfp4Prepared: MXFP4 in kiln's prepared order (moe/mxfp4_prepared.h).
enum MoeWeightFormat { kWeightsBf16 = 0, kWeightsMxfp4 = 1, kWeightsMxfp4Prepared = 2 };
enum MoeActivationKind { kSiluGlu = 0, kSwigluClamped = 1 };
enum MoeLayoutKind { kGateUpConcatenated = 0, kGateUpInterleaved = 1 };
enum MoeRoutingKind { kRoutingTopkSoftmax = 0, kRoutingSoftmaxTopk = 1, kRoutingPrecomputed = 2 };
enum MoeBiasKind { kBiasNone = 0, kBiasF32 = 1, kBiasBf16 = 2 };

// An enumerator, not a constexpr variable: a namespace-scope variable gets an internal symbol whose
// NVRTC-generated name differs from process to process, which would make binaries irreproducible.
enum { kMoeMaxTopK = 32 };

template <int kFormat>
__device__ __forceinline__ float moe_weight(const void* base, const u8* scales, long long row_offset, long long scale_row_offset, int k) {
  if (kFormat == kWeightsBf16) return to_float(static_cast<const bf16*>(base)[row_offset + k]);
  const u8* byte = static_cast<const u8*>(base) + row_offset + k / 2;
  u32 nibble;
  if (kFormat == kWeightsMxfp4Prepared) {  // rows start on 16-byte boundaries (moe_apply checks)
    nibble = kiln_mxfp4_prepared_value(*reinterpret_cast<const u32*>(byte - (k / 2) % 4), k % 8);
  } else {
    nibble = (k & 1) ? (*byte >> 4) : (*byte & 0xFu);
  }
  return e2m1_to_float(nibble) * e8m0_to_float(scales[scale_row_offset + k / 32]);
}

// The w13 rows of intermediate unit u: gate and up, rows 2u and 2u + 1 when interleaved, u and
// I + u when concatenated.
struct GateUpRows {
  int gate, up;
};
template <int kLayout>
__device__ __forceinline__ GateUpRows gate_up_rows(int u, int inter) {
  return kLayout == kGateUpInterleaved ? GateUpRows{2 * u, 2 * u + 1} : GateUpRows{u, inter + u};
}

template <int kBias>
__device__ __forceinline__ float moe_bias(const void* bias, long long offset) {
  if (kBias == kBiasF32) return static_cast<const float*>(bias)[offset];
  if (kBias == kBiasBf16) return to_float(static_cast<const bf16*>(bias)[offset]);
  return 0.0f;
}

template <bool kLogitsBf16>
__device__ __forceinline__ float logit(const KilnMoeParams& p, int token, int e) {
  const long long at = token * p.logits_row_stride + e;
  return kLogitsBf16 ? to_float(static_cast<const bf16*>(p.router_logits)[at]) : static_cast<const float*>(p.router_logits)[at];
}

// The gated activation of one intermediate unit from its gate and up projections (bias added).
template <int kActivation>
__device__ __forceinline__ float glu_activation(float gate, float up) {
  if (kActivation == kSwigluClamped) {  // GPT-OSS: gate clamped above at 7, up to [-7, 7]
    gate = fminf(gate, 7.0f);
    up = fminf(fmaxf(up, -7.0f), 7.0f);
    return gate / (1.0f + expf(-1.702f * gate)) * (up + 1.0f);
  }
  return gate / (1.0f + expf(-gate)) * up;
}

// A routed expert id as the kernels keep it: -1 for one outside [0, E), which contributes nothing
// (device-resident precomputed ids are not checked on the host).
__device__ __forceinline__ int moe_known_expert(int id, int experts) { return id >= 0 && id < experts ? id : -1; }

// Serial routing of one token by one thread: picks top_k experts (ties go to the lower index) and
// their weights, or takes the precomputed ones, where an id outside [0, E) becomes -1 (the
// reference kernel and moe_apply_mfma).
template <int kRouting, bool kLogitsBf16>
__device__ void route_token(const KilnMoeParams& p, int token, int* ids, float* weights) {
  if (kRouting == kRoutingPrecomputed) {
    for (int j = 0; j < p.top_k; ++j) {
      const int id = p.topk_ids[token * p.topk_row_stride + j];
      ids[j] = moe_known_expert(id, p.num_experts);
      weights[j] = p.topk_weights[token * p.topk_row_stride + j];
    }
    return;
  }
  float max_logit = neg_inf();
  for (int e = 0; e < p.num_experts; ++e) max_logit = fmaxf(max_logit, logit<kLogitsBf16>(p, token, e));
  float total = 0.0f;
  if (kRouting == kRoutingSoftmaxTopk) {
    for (int e = 0; e < p.num_experts; ++e) total += expf(logit<kLogitsBf16>(p, token, e) - max_logit);
  }
  for (int j = 0; j < p.top_k; ++j) {
    int best = -1;
    float best_logit = neg_inf();
    for (int e = 0; e < p.num_experts; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= (ids[i] == e);
      const float l = logit<kLogitsBf16>(p, token, e);
      const bool above = l > best_logit || (best_logit != best_logit && l == l);  // a NaN ranks below every number
      if (!taken && (best < 0 || above)) {
        best = e;
        best_logit = l;
      }
    }
    ids[j] = best;
    weights[j] = expf(best_logit - max_logit);  // max over all is also max over the chosen
  }
  float chosen = 0.0f;
  for (int j = 0; j < p.top_k; ++j) chosen += weights[j];
  const float norm = (kRouting == kRoutingTopkSoftmax || p.renormalize) ? chosen : total;
  for (int j = 0; j < p.top_k; ++j) weights[j] /= norm;
}

// W4A8 in registers: one MXFP8 block of 32 activations held as 16 bf16 pairs (value 2i in the
// low half of word i, or any order within the block), quantized as moe/mxfp8_activations.h
// defines. The value of half `high` of a word, the block's exponent, and the block quantized in
// place: the results are bf16 values (q 2^s), so truncating their f32 bits is exact.
__device__ __forceinline__ float bf16_pair_value(u32 word, bool high) { return __uint_as_float(high ? word & 0xFFFF0000u : word << 16); }
__device__ __forceinline__ int mxfp8_pairs_exponent(const u32 (&w)[16]) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fmaxf(__uint_as_float((w[i] << 16) & 0x7FFF0000u), __uint_as_float(w[i] & 0x7FFF0000u)));
  return kiln_mxfp8_exponent(amax);
}
__device__ __forceinline__ void quantize_mxfp8_pairs(u32 (&w)[16]) {
  const int s = mxfp8_pairs_exponent(w);
  const float down = kiln_pow2(-s), up = kiln_pow2(s);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const u32 lo = __float_as_uint(kiln_round_to_e4m3(bf16_pair_value(w[i], false) * down) * up);
    const u32 hi = __float_as_uint(kiln_round_to_e4m3(bf16_pair_value(w[i], true) * down) * up);
    w[i] = (lo >> 16) | (hi & 0xFFFF0000u);
  }
}

// W4A8: a lane's 32 activations held as bf16 pairs -- one MXFP8 block, in any order (a streaming
// phase's MXFP4 piece, or 32 consecutive values of the grouped GEMMs' x or act rows) -- quantized
// in place (quantize_mxfp8_pairs); the results are bf16 values and go through the same bf16 MMAs.
// From sm_89 on, the hardware's e4m3 conversion rounds (to nearest even, never saturating here
// since no value exceeds 448).
__device__ __forceinline__ void quantize_mxfp8_block(u32 (&b)[16]) {
#if __CUDA_ARCH__ >= 890
  const int s = mxfp8_pairs_exponent(b);
  const float down = kiln_pow2(-s), up = kiln_pow2(s);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    unsigned short q;
    unsigned halves;
    float q_lo, q_hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
        : "=h"(q)
        : "f"(bf16_pair_value(b[i], true) * down), "f"(bf16_pair_value(b[i], false) * down));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(q));  // the first source in the upper half
    asm("cvt.f32.f16 %0, %1;" : "=f"(q_lo) : "h"(static_cast<unsigned short>(halves & 0xFFFFu)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(q_hi) : "h"(static_cast<unsigned short>(halves >> 16)));
    // q 2^s is a bf16 value: keeping the upper half of its f32 bits is exact.
    b[i] = (__float_as_uint(q_hi * up) & 0xFFFF0000u) | (__float_as_uint(q_lo * up) >> 16);
  }
#else
  quantize_mxfp8_pairs(b);
#endif
}

// The expert e with start[e] * scale <= item < start[e + 1] * scale, for a per-expert prefix
// `start` (item counts scaled by `scale` work items per unit).
__device__ __forceinline__ int find_expert(const int* start, int experts, int item, int scale) {
  int lo = 0, hi = experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (start[mid] * scale <= item)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace kiln
