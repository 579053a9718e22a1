// Reference MoE layer: one block per token routes it, then for each chosen expert computes the
// activated intermediate vector into shared memory and accumulates the weighted down projection.
// fp32 throughout (W4A8: x and act quantized to MXFP8 first); weights decoded element by element.
// Slow and plainly correct: the oracle.
// Launch: grid (T), block 256, dynamic shared memory (2H + I) floats + routing scratch.
#pragma once

#include "moe/moe_common.cuh"

namespace kiln {

// W4A8: each block of 32 of the n values (n a multiple of 32) quantized to MXFP8 in place, a
// thread per block; `bf16_first` rounds them to bf16 before (act, which kiln stores as bf16).
__device__ __forceinline__ void quantize_mxfp8_rows(float* values, int n, bool bf16_first) {
  for (int b = threadIdx.x; b < n / 32; b += blockDim.x) {
    float* block = values + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (bf16_first) block[i] = to_float(from_float<bf16>(block[i]));
      amax = fmaxf(amax, fmaxf(block[i], -block[i]));
    }
    const int s = kiln_mxfp8_exponent(amax);
    for (int i = 0; i < 32; ++i) block[i] = kiln_mxfp8_value(block[i], s);
  }
}

template <int kFormat, int kActivation, int kLayout, int kRouting, bool kLogitsBf16, int kBias13, int kBias2, bool kActMxfp8>
__global__ void __launch_bounds__(256) moe_apply_reference(const KilnMoeParams p) {
  extern __shared__ float shared[];
  float* x = shared;                                      // [H]
  float* act = x + p.hidden;                              // [I]
  float* out_acc = act + p.intermediate;                  // [H]
  int* ids = reinterpret_cast<int*>(out_acc + p.hidden);  // [kMoeMaxTopK]
  float* weights = reinterpret_cast<float*>(ids + kMoeMaxTopK);
  const int token = blockIdx.x;

  const bf16* x_row = static_cast<const bf16*>(p.x) + token * p.x_row_stride;
  for (int h = threadIdx.x; h < p.hidden; h += blockDim.x) {
    x[h] = to_float(x_row[h]);
    out_acc[h] = 0.0f;
  }
  if (threadIdx.x == 0) route_token<kRouting, kLogitsBf16>(p, token, ids, weights);
  __syncthreads();
  if (kActMxfp8) {
    quantize_mxfp8_rows(x, p.hidden, false);
    __syncthreads();
  }

  for (int j = 0; j < p.top_k; ++j) {
    const int e = ids[j];
    if (e < 0) continue;  // an id outside [0, E) (route_token): nothing to add
    const float w = weights[j];
    for (int r = threadIdx.x; r < p.intermediate; r += blockDim.x) {
      const GateUpRows rows = gate_up_rows<kLayout>(r, p.intermediate);
      const int gate_row = rows.gate, up_row = rows.up;
      float gate = 0.0f, up = 0.0f;
      for (int k = 0; k < p.hidden; ++k) {
        const long long base = e * p.w13_expert_stride;
        const long long scale_base = e * p.w13_scale_expert_stride;
        gate += x[k] * moe_weight<kFormat>(p.w13, p.w13_scale, base + gate_row * p.w13_row_stride,
                                           scale_base + gate_row * p.w13_scale_row_stride, k);
        up += x[k] *
              moe_weight<kFormat>(p.w13, p.w13_scale, base + up_row * p.w13_row_stride, scale_base + up_row * p.w13_scale_row_stride, k);
      }
      gate += moe_bias<kBias13>(p.w13_bias, e * p.w13_bias_expert_stride + gate_row);
      up += moe_bias<kBias13>(p.w13_bias, e * p.w13_bias_expert_stride + up_row);
      act[r] = glu_activation<kActivation>(gate, up);
    }
    __syncthreads();
    if (kActMxfp8) {
      quantize_mxfp8_rows(act, p.intermediate, true);
      __syncthreads();
    }
    for (int h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      float sum = 0.0f;
      for (int k = 0; k < p.intermediate; ++k) {
        sum += act[k] * moe_weight<kFormat>(p.w2, p.w2_scale, e * p.w2_expert_stride + h * p.w2_row_stride,
                                            e * p.w2_scale_expert_stride + h * p.w2_scale_row_stride, k);
      }
      sum += moe_bias<kBias2>(p.w2_bias, e * p.w2_bias_expert_stride + h);
      out_acc[h] += w * sum;
    }
    __syncthreads();
  }
  bf16* out_row = static_cast<bf16*>(p.out) + token * p.out_row_stride;
  for (int h = threadIdx.x; h < p.hidden; h += blockDim.x) out_row[h] = from_float<bf16>(out_acc[h]);
}

}  // namespace kiln
