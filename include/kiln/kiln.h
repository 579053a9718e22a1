/* kiln's C ABI: the operators, the registry and the selector for FFI users and plugins.
 * Every function returns a kiln_status; on failure kiln_last_error() returns a message for the
 * calling thread, valid until that thread's next kiln call. No C++ exception crosses this ABI.
 * Semantics of each operator are documented in kiln/ops.hpp. */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define KILN_API __declspec(dllexport)
#else
#define KILN_API __attribute__((visibility("default")))
#endif

typedef enum kiln_status {
  KILN_OK = 0,
  KILN_ERROR_INVALID_ARGUMENT = 1,
  KILN_ERROR_UNSUPPORTED = 2,
  KILN_ERROR_NO_KERNEL = 3,
  KILN_ERROR_COMPILE_FAILED = 4,
  KILN_ERROR_DRIVER = 5,
  KILN_ERROR_CACHE = 6,
  KILN_ERROR_PLUGIN = 7,
  KILN_ERROR_INTERNAL = 8,
  KILN_ERROR_GRAPH_CAPTURE = 9 /* a compile or load was needed while the stream captured a graph */
} kiln_status;

typedef enum kiln_dtype {
  KILN_BF16 = 1,
  KILN_F16 = 2,
  KILN_F32 = 3,
  KILN_F8_E4M3 = 4,
  KILN_F8_E5M2 = 5,
  KILN_F4_E2M1X2 = 6, /* two fp4 values per byte; shapes count bytes */
  KILN_E8M0 = 7,
  KILN_I32 = 8,
  KILN_I64 = 9,
  KILN_F4_E2M1X2_PREPARED = 10 /* KILN_F4_E2M1X2 after kiln_moe_prepare_weights */
} kiln_dtype;

#define KILN_MAX_DIMS 6

/* A non-owning view. Optional arguments are passed as NULL pointers. */
typedef struct kiln_tensor {
  void* data;
  int32_t dtype; /* kiln_dtype */
  int32_t ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t strides[KILN_MAX_DIMS]; /* in elements */
  int32_t device;                 /* GPU ordinal, or -1 for host memory */
} kiln_tensor;

typedef struct kiln_mha_prefill_args {
  const kiln_tensor *q, *k, *v, *out, *cu_seqlens_q, *cu_seqlens_k;
  int32_t max_seqlen_q, max_seqlen_k;
  const kiln_tensor* lse;   /* optional */
  const kiln_tensor* sinks; /* optional */
  float softmax_scale;      /* <= 0: 1/sqrt(D) */
  float softcap;            /* <= 0: none */
  int32_t causal;
  int32_t window_left; /* -1: none */
} kiln_mha_prefill_args;

typedef struct kiln_mha_decode_args {
  const kiln_tensor *q, *k_cache, *v_cache, *page_table, *cache_seqlens, *out;
  int32_t q_len;
  const kiln_tensor* lse;   /* optional */
  const kiln_tensor* sinks; /* optional */
  float softmax_scale, softcap;
  int32_t window_left;
  float k_scale, v_scale;
} kiln_mha_decode_args;

typedef struct kiln_mha_extend_args {
  const kiln_tensor *q, *k_cache, *v_cache, *page_table, *cache_seqlens, *cu_seqlens_q, *out;
  int32_t max_seqlen_q;
  const kiln_tensor* lse;   /* optional */
  const kiln_tensor* sinks; /* optional */
  float softmax_scale, softcap;
  int32_t causal;
  int32_t window_left;
  float k_scale, v_scale;
} kiln_mha_extend_args;

typedef struct kiln_kv_append_args {
  const kiln_tensor *k, *v, *slot_mapping, *k_cache, *v_cache;
  float k_scale, v_scale;
} kiln_kv_append_args;

/* Zero-initialize argument structs ({0}): a field kiln adds later (appended, like
 * activation_dtype) then means its default. kiln reads the struct this header declares, so a
 * program built against an older kiln.h must be rebuilt before it links a newer libkiln. */
typedef struct kiln_moe_args {
  const kiln_tensor *x, *out;
  const kiln_tensor* router_logits; /* or topk_ids + topk_weights */
  const kiln_tensor *topk_ids, *topk_weights;
  int32_t top_k;
  int32_t routing; /* 0: top-k then softmax (GPT-OSS), 1: softmax then top-k */
  int32_t renormalize;
  const kiln_tensor *w13, *w13_scale, *w13_bias;
  const kiln_tensor *w2, *w2_scale, *w2_bias;
  int32_t activation;     /* 0: SiLU-GLU, 1: GPT-OSS clamped SwiGLU */
  int32_t gate_up_layout; /* 0: concatenated, 1: interleaved */
  /* 0 or KILN_BF16: bf16 activations. KILN_F8_E4M3: W4A8 with MXFP4 weights, the activations
   * quantized to MXFP8 inside the kernel (MoeArgs::activation_dtype in ops.hpp). */
  int32_t activation_dtype;
} kiln_moe_args;

KILN_API const char* kiln_last_error(void);
KILN_API const char* kiln_version(void);

/* stream: a CUstream / hipStream_t, or NULL for the default stream. */
KILN_API kiln_status kiln_mha_prefill(const kiln_mha_prefill_args* args, void* stream);
KILN_API kiln_status kiln_mha_decode_with_kvcache(const kiln_mha_decode_args* args, void* stream);
KILN_API kiln_status kiln_mha_extend_with_kvcache(const kiln_mha_extend_args* args, void* stream);
KILN_API kiln_status kiln_kv_cache_append(const kiln_kv_append_args* args, void* stream);
KILN_API kiln_status kiln_moe_apply(const kiln_moe_args* args, void* stream);
/* The device workspace, in bytes, that the call of operator `op` ("mha_prefill", ...) with
 * `args` (that operator's argument struct) would take from the scratch allocator; 0 when none.
 * Validates the call and selects, compiles and loads its kernel (kiln::workspace_bytes), launching
 * nothing. */
KILN_API kiln_status kiln_workspace_bytes(const char* op, const void* args, void* stream, size_t* bytes);
/* Rewrites MXFP4 weights (KILN_F4_E2M1X2: w13 or w2) in place into kiln's prepared order and sets
 * weights->dtype to KILN_F4_E2M1X2_PREPARED; see moe_prepare_weights in ops.hpp. */
KILN_API kiln_status kiln_moe_prepare_weights(kiln_tensor* weights, void* stream);

/* Registry and selector. Strings returned through char** are allocated by kiln and released
 * with kiln_free_string. */
KILN_API kiln_status kiln_list_kernels_json(char** json_out);
/* op: "mha_prefill" | "mha_decode_with_kvcache" | "mha_extend_with_kvcache" | "kv_cache_append" |
 * "moe_apply"; signature: "key=value,...";
 * target: "sm_90a", ... or NULL for the current device. */
KILN_API kiln_status kiln_explain_json(const char* op, const char* signature, const char* target, char** json_out);
/* Forces a kernel for an operator; NULL or "" clears the override. */
KILN_API kiln_status kiln_set_override(const char* op, const char* kernel_name);
KILN_API kiln_status kiln_load_plugin(const char* path);
KILN_API void kiln_free_string(char* s);

/* Scratch memory (kiln/scratch.hpp): kiln takes every kernel workspace from `allocate` and hands
 * it to `release` once the launch is enqueued on `stream`; the allocator must be stream-ordered.
 * allocate returns NULL when it cannot. Both NULL restores kiln's stream-ordered pool. */
typedef void* (*kiln_scratch_allocate_fn)(size_t bytes, int32_t device, void* stream, void* user);
typedef void (*kiln_scratch_release_fn)(void* pointer, size_t bytes, int32_t device, void* stream, void* user);
KILN_API kiln_status kiln_set_scratch_allocator(kiln_scratch_allocate_fn allocate, kiln_scratch_release_fn release, void* user);

/* Prepare-only mode of the calling thread (kiln::PrepareOnly): enter 1 starts it, enter 0 ends
 * the innermost one. While on, operator calls select, compile and load their kernel and launch
 * nothing: run a step under it before capturing the step in a CUDA graph. */
KILN_API kiln_status kiln_prepare_only(int32_t enter);

/* Log messages (level: 0 debug, 1 info, 2 warn, 3 error) go to `callback` instead of stderr,
 * from any thread; NULL restores stderr. kiln_set_log_level: 0..3, 4 silences. */
typedef void (*kiln_log_fn)(int32_t level, const char* message, void* user);
KILN_API kiln_status kiln_set_log_callback(kiln_log_fn callback, void* user);
KILN_API kiln_status kiln_set_log_level(int32_t level);

/* compile 0: compiler-free serving, as KILN_JIT=off (kiln::JitSettings::compile): kernels come
 * from the cache and its seeds only, no compiler library is loaded, and a miss is
 * KILN_ERROR_NO_KERNEL naming the warm-up command that fixes it. 1: compile on a miss (default). */
KILN_API kiln_status kiln_set_jit(int32_t compile);

/* This process's cache: directory, state and counters (kiln::CacheStats) as JSON. */
KILN_API kiln_status kiln_cache_stats_json(char** json_out);
/* Warm-up (kiln::warmup): manifest is a built-in model name or a manifest file; targets are
 * comma-separated ("sm_90a,sm_80"); jobs 0 means one per core. The report lists every item;
 * failed items do not make the call fail. */
KILN_API kiln_status kiln_warmup_json(const char* manifest, const char* targets, int32_t jobs, char** report_json);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_H */
