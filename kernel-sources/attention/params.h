// Parameter blocks of the attention kernels, passed by value as the kernel's only argument.
// Shared verbatim by kiln's host code and the run-time-compiled kernels, so it uses only plain
// C types whose layout is the same on x86-64 / aarch64 hosts and on the GPU (LP64); valid C11,
// installed for plugins as <prefix>/include/kiln/kernel-params/attention/params.h.
// You MUST keep host and kernel builds in step: this file is part of every kernel's key.
#pragma once

#include "common/tensor_map.h"

// The TMA maps of KilnPrefillParams::tensor_maps (attention/prefill_wgmma_window.cuh): 3-D
// over (head_dim, heads, rows), boxes of 64 elements x 1 head x the kernel's rows (16 for q, one
// key block for k and v).
enum { kPrefillMapQ = 0, kPrefillMapK = 1, kPrefillMapV = 2, kPrefillTensorMaps = 3 };

struct KilnPrefillParams {
  const void* q;                          // [total_q, Hq, D]
  const void* k;                          // [total_k, Hkv, D]
  const void* v;                          // [total_k, Hkv, D]
  void* out;                              // [total_q, Hq, D]
  float* lse;                             // [total_q, Hq] or null
  const float* sinks;                     // [Hq] or null
  const int* cu_seqlens_q;                // [batch + 1]
  const int* cu_seqlens_k;                // [batch + 1]
  long long q_row_stride, q_head_stride;  // in elements
  long long k_row_stride, k_head_stride;
  long long v_row_stride, v_head_stride;
  long long out_row_stride, out_head_stride;
  long long lse_row_stride;
  int batch;
  int num_heads_q;
  int num_heads_kv;
  int head_dim;
  int max_seqlen_q;
  int max_seqlen_k;
  int causal;       // 0 or 1, bottom-right aligned
  int window_left;  // -1: none
  float softmax_scale;
  float softcap;         // 0: none
  int total_q, total_k;  // rows of q and of k and v
  // Paged K and V (mha_extend_with_kvcache, and decode through the prefill kernels), when
  // page_table is set: k and v are caches [num_pages, page_size, Hkv, D] whose row strides above
  // step within a page; key j of sequence b is row j % page_size of page
  // page_table[b * page_table_stride + j / page_size], and the sequence holds cache_seqlens[b]
  // keys (cu_seqlens_k unused). total_k is then the caches' rows (num_pages x page_size) where
  // their pages can be copied as whole TMA boxes (pages of at least 8 rows packed one after the
  // other, 16-byte strides), else 0; kv_element_bytes is then 2, or 1 for an e4m3 cache.
  const int* page_table;
  const int* cache_seqlens;
  long long page_table_stride;
  long long k_page_stride, v_page_stride;
  int page_size;                                  // a power of two
  int page_shift;                                 // log2(page_size)
  int q_len;                                      // > 0: q holds q_len rows per sequence, decode's layout (cu_seqlens_q unused)
  float k_scale, v_scale;                         // e4m3 cache: dequantized = stored * scale; else 1
  int kv_element_bytes;                           // with total_k > 0: bytes of a k and v element (2, or 1 for e4m3)
  KilnTensorMap tensor_maps[kPrefillTensorMaps];  // encoded at launch for kernels that copy by TMA, else unset
};

struct KilnDecodeParams {
  const void* q;        // [batch * q_len, Hq, D]
  const void* k_cache;  // [num_pages, page_size, Hkv, D]
  const void* v_cache;
  void* out;                 // like q
  float* lse;                // [batch * q_len, Hq] or null
  const float* sinks;        // [Hq] or null
  const int* page_table;     // [batch, page_table_stride...]
  const int* cache_seqlens;  // [batch]
  long long q_row_stride, q_head_stride;
  long long k_page_stride, k_row_stride, k_head_stride;
  long long v_page_stride, v_row_stride, v_head_stride;
  long long out_row_stride, out_head_stride;
  long long lse_row_stride;
  long long page_table_stride;
  int batch;
  int q_len;
  int num_heads_q;
  int num_heads_kv;
  int head_dim;
  int page_size;
  int max_pages_per_seq;
  int window_left;
  float softmax_scale;
  float softcap;
  float k_scale;  // fp8 cache: dequantized = stored * scale
  float v_scale;
  // Scratch for a kernel that asks for it (KernelSpec::workspace_bytes): the split-KV merge's
  // tickets and partial states (attention/decode_merge.cuh); null otherwise.
  void* workspace;
};

// kv_cache_append (attention/kv_append.cuh): token t's key and value rows go to row slot %
// page_size of page slot / page_size of the caches, slot = slot_mapping[t] (negative: skipped).
struct KilnKvAppendParams {
  const void* k;  // [tokens, Hkv, D]
  const void* v;
  const long long* slot_mapping;  // [tokens]
  void* k_cache;                  // [num_pages, page_size, Hkv, D]
  void* v_cache;
  long long k_row_stride, k_head_stride;
  long long v_row_stride, v_head_stride;
  long long k_cache_page_stride, k_cache_row_stride, k_cache_head_stride;
  long long v_cache_page_stride, v_cache_row_stride, v_cache_head_stride;
  long long slot_stride;
  int tokens;
  int num_heads_kv;
  int head_dim;
  int page_shift;          // log2(page_size)
  float k_scale, v_scale;  // e4m3 cache: stored = value / scale
};

#ifndef __cplusplus  // C code names them as C++ does
typedef struct KilnPrefillParams KilnPrefillParams;
typedef struct KilnDecodeParams KilnDecodeParams;
typedef struct KilnKvAppendParams KilnKvAppendParams;
#endif
