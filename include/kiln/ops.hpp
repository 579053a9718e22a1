// kiln's operators. Hardware-agnostic: tensors are views of device memory, the stream is the
// caller's. Every argument is validated before anything is selected or launched; a bad one
// raises kiln::Error(kInvalidArgument) naming it and what was expected.
//
// Common rules: the last dimension of every tensor is contiguous (stride 1); data pointers are
// 16-byte aligned; all tensors of one call are on the same device; element offsets must fit in
// 32-bit signed indexing (numel < 2^31) per tensor.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/tensor.hpp"

namespace kiln {

// ---------------------------------------------------------------------------------------------
// Attention prefill over packed variable-length sequences.
//
//   q   [total_q, Hq, D]     k, v  [total_k, Hkv, D]     out [total_q, Hq, D]
//   cu_seqlens_q, cu_seqlens_k   int32 [B + 1], non-decreasing, starting at 0, ending at
//                                total_q / total_k. Sequence b owns rows [cu[b], cu[b+1]).
//   lse (optional)   f32 [total_q, Hq], natural-log sum of exp of the scaled scores.
//   sinks (optional) f32 [Hq]: one logit per head that joins the softmax denominator and
//                    contributes no value (GPT-OSS).
// q, k, v, out share one dtype: bf16 or f16. Hq % Hkv == 0 (GQA; MQA when Hkv == 1); query head
// h reads KV head h / (Hq / Hkv).
// Scores are softmax_scale * q.k (softmax_scale <= 0 means 1/sqrt(D)); with softcap > 0 they
// become softcap * tanh(score / softcap).
// causal: aligned bottom-right: in a sequence with Lq queries and Lk keys, query i (0-based)
// sits at key position i + Lk - Lq and sees keys at positions <= that.
// window_left >= 0: the query at position p also sees only keys at positions >= p - window_left
// (-1: no window). A window bounds only the left side: without causal, the query still sees every
// key after its position. A query that sees no key writes zeros (and lse = -inf; with sinks the sink
// alone forms the denominator, so the output is zero as well).
struct MhaPrefillArgs {
  TensorView q, k, v, out;
  TensorView cu_seqlens_q, cu_seqlens_k;
  int32_t max_seqlen_q = 0;
  int32_t max_seqlen_k = 0;
  TensorView lse;    // optional
  TensorView sinks;  // optional
  float softmax_scale = 0.0f;
  float softcap = 0.0f;
  bool causal = false;
  int32_t window_left = -1;
};

// ---------------------------------------------------------------------------------------------
// Decode attention against a paged KV cache.
//
//   q        [B * q_len, Hq, D]   (row b * q_len + j is new token j of sequence b)
//   k_cache, v_cache  [num_pages, page_size, Hkv, D]
//   page_table  int32 [B, max_pages_per_seq]: page_table[b][p] holds tokens
//               [p * page_size, (p + 1) * page_size) of sequence b.
//   cache_seqlens  int32 [B]: tokens in the cache per sequence, the q_len new ones included
//                  (0 allowed: that sequence's output is zeros).
//   out like q; lse optional f32 [B * q_len, Hq]; sinks optional f32 [Hq].
// q_len is 1 to 16; the new tokens are causal among themselves: token j of sequence b sits at
// position cache_seqlens[b] - q_len + j and sees keys at positions <= that (and, with
// window_left >= 0, >= position - window_left).
// Dtypes: q and out bf16 or f16; the cache the same dtype as q, or e4m3 with per-tensor
// k_scale / v_scale (dequantized value = stored * scale). page_size a power of two from 1 to 256.
struct MhaDecodeArgs {
  TensorView q, k_cache, v_cache, page_table, cache_seqlens, out;
  int32_t q_len = 1;
  TensorView lse;    // optional
  TensorView sinks;  // optional
  float softmax_scale = 0.0f;
  float softcap = 0.0f;
  int32_t window_left = -1;
  float k_scale = 1.0f;  // fp8 cache only
  float v_scale = 1.0f;
};

// ---------------------------------------------------------------------------------------------
// Extend attention against a paged KV cache: chunked prefill and prefix caching. The new tokens of
// each sequence attend to the sequence's prefix already in the cache and to themselves.
//
//   q        [total_q, Hq, D]; cu_seqlens_q int32 [B + 1] (q rows of sequence b:
//            [cu_seqlens_q[b], cu_seqlens_q[b + 1]))
//   k_cache, v_cache  [num_pages, page_size, Hkv, D], page_size a power of two from 1 to 256;
//            they already hold each sequence's prefix and its new tokens (append them first:
//            kv_cache_append below).
//   page_table  int32 [B, max_pages_per_seq]; cache_seqlens int32 [B]: keys in the cache per
//            sequence, new tokens included (>= the sequence's q rows).
//   out like q; lse optional f32 [total_q, Hq]; sinks optional f32 [Hq].
// Sequence b's query i sits at key position i + cache_seqlens[b] - Lq (bottom-right aligned);
// causal, window_left, softcap, sinks and softmax_scale mean what they mean for mha_prefill.
// Dtypes: q and out bf16 or f16; the cache the same dtype, or e4m3 with per-tensor k_scale /
// v_scale (dequantized value = stored * scale).
struct MhaExtendArgs {
  TensorView q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, out;
  int32_t max_seqlen_q = 0;  // the longest sequence's q rows
  TensorView lse;            // optional
  TensorView sinks;          // optional
  float softmax_scale = 0.0f;
  float softcap = 0.0f;
  bool causal = true;
  int32_t window_left = -1;
  float k_scale = 1.0f;  // e4m3 cache only
  float v_scale = 1.0f;
};

// ---------------------------------------------------------------------------------------------
// KV-cache append: writes new tokens' keys and values into the paged cache.
//
//   k, v        [T, Hkv, D] bf16 or f16: token t's key and value
//   slot_mapping int64 [T]: token t goes to row slot % page_size of page slot / page_size (as
//               vLLM's reshape_and_cache); a negative slot skips the token (padding).
//   k_cache, v_cache  [num_pages, page_size, Hkv, D], the dtype of k, or e4m3: then stored =
//               saturate(value / scale) rounded to nearest even, with per-tensor k_scale, v_scale.
// Tokens must not share a slot (the result would depend on ordering).
struct KvAppendArgs {
  TensorView k, v, slot_mapping, k_cache, v_cache;
  float k_scale = 1.0f;  // e4m3 cache only
  float v_scale = 1.0f;
};

// ---------------------------------------------------------------------------------------------
// Mixture of experts: out = sum over the chosen experts e of weight_e * expert_e(x).
//
//   x  [T, H] bf16;  out [T, H] bf16.
//   Routing, one of:
//     router_logits [T, E] (f32 or bf16) with `routing`:
//       kTopkThenSoftmax  — top-k of the logits, softmax over those k (GPT-OSS);
//       kSoftmaxThenTopk  — softmax over all E, top-k, renormalized to sum 1 when `renormalize`.
//     topk_ids int32 [T, k] and topk_weights f32 [T, k], precomputed.
//   w13 [E, 2I, H]: the gate and up projections. gate_up_layout kConcatenated: rows [0, I) gate,
//       [I, 2I) up (Mixtral, Qwen). kInterleaved: row 2j gate j, row 2j + 1 up j (GPT-OSS).
//   w13_bias optional [E, 2I] (f32 or bf16), in the same layout as w13's rows.
//   w2 [E, H, I];  w2_bias optional [E, H].
//   Weight formats: bf16 (w13, w2 as above); or MXFP4 (OCP MX): w13 is kF4E2M1x2
//   [E, 2I, H/2] with w13_scale kE8M0 [E, 2I, H/32], w2 kF4E2M1x2 [E, H, I/2] with w2_scale
//   kE8M0 [E, H, I/32]; each scale covers 32 consecutive values along the reduction dimension.
//   activation kSiluGlu: silu(gate) * up. kSwigluClamped (GPT-OSS): gate = min(gate, 7),
//   up = clamp(up, -7, 7), gate * sigmoid(1.702 * gate) * (up + 1).
//   Memory: the fast kernels take T * k * (H + I) * 4 bytes plus a little of device scratch,
//   allocated on `stream` from the device's default memory pool and freed on it after the launch.
//   Device-resident topk_ids outside [0, E) contribute nothing (host-resident ones are checked).
//   Numerics: the projections run with f32 accumulation, and the activated intermediate is
//   rounded to bf16 between them. Where the two projections run as grouped GEMMs (Hopper, bf16
//   weights, H and I multiples of 64, at least 16 routed (token, slot) pairs) each expert's output,
//   bias included, is also rounded to bf16 before the weighted sum, as a pipeline of bf16 grouped
//   GEMMs does; elsewhere it stays f32. MXFP4 values are multiplied by their scale in bf16,
//   exactly: every e2m1 value times every e8m0 scale is a bf16 or beyond even f32's range (then
//   infinite), and scale 0xFF gives NaN. On gfx950, which has scaled MXFP4 matrix instructions
//   but no bf16 x e2m1 ones, bf16 activations enter them as two MXFP8 terms: exact but for
//   values below about 2^-15 of the largest in their 32-value block, which keep an error under
//   2^-21 of that largest (kernel-sources/moe/mxfp8_activations.h).
//   activation_dtype kBF16: x and act enter the projections as bf16. kF8E4M3 (W4A8; MXFP4 weights
//   only): each projection's activations -- x for up, the bf16 act for down -- are quantized
//   inside the kernel to MXFP8: e4m3 values with one power-of-two scale per 32 consecutive values
//   along the reduction dimension, chosen so no value saturates, rounded to nearest even
//   (kernel-sources/moe/mxfp8_activations.h defines it bit for bit, and the float64 reference
//   models it). This adds up to 2^-4 relative error per activation; the projections still
//   accumulate in f32. Where no fp8 matrix instruction serves the call (NVIDIA today; AMD before
//   gfx950) the quantized values, which are bf16 values, go through the bf16 MMAs: the same
//   numbers, not a faster path. gfx950 runs them on its scaled MXFP4 x MXFP8 MFMAs.
//   Prepared MXFP4 weights: moe_prepare_weights (below) rewrites w13 and w2 once, at load time,
//   into kF4E2M1x2Prepared; pass both so (the scales stay as they are). Results are the same, bit
//   for bit, and cheaper to decode on NVIDIA. AMD's fast kernel reads only the standard layout
//   (prepared weights run on the reference kernel there): keep AMD weights standard.
enum class MoeRouting { kTopkThenSoftmax = 0, kSoftmaxThenTopk = 1 };
enum class MoeActivation { kSiluGlu = 0, kSwigluClamped = 1 };
enum class GateUpLayout { kConcatenated = 0, kInterleaved = 1 };

struct MoeArgs {
  TensorView x, out;
  TensorView router_logits;           // either this ...
  TensorView topk_ids, topk_weights;  // ... or these two
  int32_t top_k = 0;
  MoeRouting routing = MoeRouting::kTopkThenSoftmax;
  bool renormalize = true;              // kSoftmaxThenTopk only
  TensorView w13, w13_scale, w13_bias;  // scale: MXFP4 only; bias optional
  TensorView w2, w2_scale, w2_bias;
  MoeActivation activation = MoeActivation::kSiluGlu;
  GateUpLayout gate_up_layout = GateUpLayout::kConcatenated;
  DType activation_dtype = DType::kBF16;  // or kF8E4M3 (W4A8, MXFP4 weights)
};

void mha_prefill(const MhaPrefillArgs& args, Stream stream);
void mha_decode_with_kvcache(const MhaDecodeArgs& args, Stream stream);
void mha_extend_with_kvcache(const MhaExtendArgs& args, Stream stream);
void kv_cache_append(const KvAppendArgs& args, Stream stream);
void moe_apply(const MoeArgs& args, Stream stream);

// The device workspace, in bytes, that the call would take from the scratch allocator
// (kiln/scratch.hpp) on `stream`: 0 when its kernel needs none. Validates the call, then selects,
// compiles and loads its kernel as a PrepareOnly call would, and launches nothing. An engine that
// sizes one arena for a CUDA graph asks for each captured call's workspace and serves it from its
// allocator; kiln allocates nothing else while launching.
size_t workspace_bytes(const MhaPrefillArgs& args, Stream stream);
size_t workspace_bytes(const MhaDecodeArgs& args, Stream stream);
size_t workspace_bytes(const MhaExtendArgs& args, Stream stream);
size_t workspace_bytes(const KvAppendArgs& args, Stream stream);
size_t workspace_bytes(const MoeArgs& args, Stream stream);

// Rewrites MXFP4 weights (kF4E2M1x2, moe_apply's w13 or w2: a contiguous tensor, 4-byte aligned,
// whose last dimension is a multiple of 16 bytes) in place into kiln's prepared order
// (kernel-sources/moe/mxfp4_prepared.h) and returns the same memory viewed as kF4E2M1x2Prepared.
// Host memory is rewritten directly (the fastest way: prepare the checkpoint before upload).
// Device memory goes through host memory in 64 MiB pieces, ordered on `stream` and finished when
// the call returns. Throws kInvalidArgument for any other tensor, naming what it expected, and
// kDriverError when a copy fails (pieces already copied back stay prepared: reload the weights).
TensorView moe_prepare_weights(const TensorView& weights, Stream stream);

}  // namespace kiln
