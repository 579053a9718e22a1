// Float64 CPU references of the three operators: the ground truth for the GPU reference kernels
// (tests/gpu) and for `kiln check` on small shapes.
// Tensors are dense row-major vectors of decoded values.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::reference {

struct AttentionResult {
  std::vector<double> out;  // [rows, Hq, D]
  std::vector<double> lse;  // [rows, Hq]; -inf where nothing was attended (and no sink)
};

struct PrefillProblem {
  std::vector<double> q, k, v;  // [total_q, Hq, D], [total_k, Hkv, D]
  std::vector<int> cu_q, cu_k;
  int hq = 0, hkv = 0, d = 0;
  bool causal = false;
  int window_left = -1;
  std::vector<double> sinks;  // empty or [Hq]
  double softcap = 0, scale = 0;
};
AttentionResult prefill_reference(const PrefillProblem& p);

struct DecodeProblem {
  std::vector<double> q;                 // [B * q_len, Hq, D]
  std::vector<double> k_cache, v_cache;  // [pages, page_size, Hkv, D], dequantized
  std::vector<int> page_table;           // [B, max_pages]
  std::vector<int> seqlens;              // [B]
  int batch = 0, q_len = 1, hq = 0, hkv = 0, d = 0, page_size = 0, max_pages = 0;
  int window_left = -1;
  std::vector<double> sinks;
  double softcap = 0, scale = 0;
};
AttentionResult decode_reference(const DecodeProblem& p);

struct MoeProblem {
  std::vector<double> x;       // [T, H]
  std::vector<double> logits;  // [T, E] or empty
  std::vector<int> topk_ids;   // [T, k] when logits is empty
  std::vector<double> topk_weights;
  int routing = 0;  // 0 top-k then softmax, 1 softmax then top-k
  bool renormalize = true;
  std::vector<double> w13;       // [E, 2I, H] decoded
  std::vector<double> w13_bias;  // [E, 2I] or empty
  std::vector<double> w2;        // [E, H, I] decoded
  std::vector<double> w2_bias;   // [E, H] or empty
  int tokens = 0, hidden = 0, inter = 0, experts = 0, top_k = 0;
  int activation = 0;  // 0 SiLU-GLU, 1 clamped SwiGLU
  bool interleaved = false;
  // W4A8: x, and act rounded to bf16, quantized to MXFP8 as the kernels do
  // (kernel-sources/moe/mxfp8_activations.h) before each projection.
  bool mxfp8_activations = false;
};
std::vector<double> moe_apply_reference(const MoeProblem& p);  // [T, H]

}  // namespace kiln::reference
