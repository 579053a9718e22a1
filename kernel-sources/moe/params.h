// Parameter block of the MoE kernels, passed by value as the kernel's only argument.
// Shared verbatim by kiln's host code and the run-time-compiled kernels (plain C types only; valid
// C11, installed for plugins as <prefix>/include/kiln/kernel-params/moe/params.h).
// You MUST keep host and kernel builds in step: this file is part of every kernel's key.
#pragma once

#include "common/tensor_map.h"

// The grouped-GEMM phases' operands (moe/apply_stream_gemm_sm90.cuh), in KilnMoeParams::tensor_maps.
// A rows come in boxes of 64 (48 in the MXFP4 large-batch build), weight rows in boxes of 256, or of 32 for W13 with gate and up
// concatenated (whose copies interleave them by warpgroup).
enum { kMoeMapXGrouped = 0, kMoeMapW13 = 1, kMoeMapW13By32 = 2, kMoeMapAct = 3, kMoeMapW2 = 4, kMoeTensorMaps = 5 };

struct KilnMoeParams {
  const void* x;                   // [T, H] bf16
  void* out;                       // [T, H] bf16
  const void* router_logits;       // [T, E] or null
  const int* topk_ids;             // [T, k] or null (then router_logits is set)
  const float* topk_weights;       // [T, k] or null
  const void* w13;                 // [E, 2I, H] bf16, or [E, 2I, H/2] packed e2m1
  const unsigned char* w13_scale;  // [E, 2I, H/32] e8m0, MXFP4 only
  const void* w13_bias;            // [E, 2I] or null
  const void* w2;                  // [E, H, I] bf16, or [E, H, I/2] packed e2m1
  const unsigned char* w2_scale;   // [E, H, I/32] e8m0, MXFP4 only
  const void* w2_bias;             // [E, H] or null
  long long x_row_stride, out_row_stride, logits_row_stride, topk_row_stride;
  long long w13_expert_stride, w13_row_stride, w13_scale_expert_stride, w13_scale_row_stride;
  long long w2_expert_stride, w2_row_stride, w2_scale_expert_stride, w2_scale_row_stride;
  long long w13_bias_expert_stride, w2_bias_expert_stride;
  int num_tokens;
  int hidden;        // H
  int intermediate;  // I
  int num_experts;   // E
  int top_k;
  int renormalize;
  int activations_mxfp8;  // 1: W4A8, x and act quantized to MXFP8 (moe/mxfp8_activations.h)
  // Zero-filled scratch that kiln allocates on the call's stream for kernels that ask for it
  // (KernelSpec::workspace_bytes); null otherwise.
  void* workspace;
  // TMA tensor maps of the grouped-GEMM phases, encoded by kiln at launch after the workspace is
  // set (KernelSpec::tensor_maps, src/kernels/moe_apply_stream.cpp); left zero on other paths.
  KilnTensorMap tensor_maps[kMoeTensorMaps];
};

#ifndef __cplusplus  // C code names it as C++ does
typedef struct KilnMoeParams KilnMoeParams;
#endif
