/* The ABI an out-of-tree kernel plugin implements. A plugin is a shared library on
 * KILN_PLUGIN_PATH that exports
 *
 *     const kiln_plugin* kiln_plugin_entry(void);
 *
 * kiln loads plugins of ABI versions KILN_PLUGIN_ABI_MIN_VERSION to KILN_PLUGIN_ABI_VERSION and
 * refuses any other, naming both. Version 1 kernels (kiln_plugin_kernel) declare a fixed name
 * expression and a grid; version 2 kernels (kiln_plugin_kernel_v2) have everything built-in
 * kernels have: signatures accepted as data, a specialization per signature and target (template
 * arguments and compile options), a workspace, and launch attributes (clusters, cooperative).
 * Every pointer the plugin returns must stay valid while the library is loaded (kiln never
 * unloads it). Kernel sources are CUDA/HIP text compiled by kiln's JIT like built-in ones; the
 * kernel receives the operator's parameter struct by value: kernel-sources/<family>/params.h,
 * installed (valid C11 and C++) as <prefix>/include/kiln/kernel-params/<family>/params.h, whose
 * directory kiln's CMake targets put on the include path ("attention/params.h").
 *
 * You MUST bump KILN_PLUGIN_ABI_VERSION when any struct below changes layout or meaning, and keep
 * the structs of older versions that kiln still loads. */
#ifndef KILN_PLUGIN_H
#define KILN_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_PLUGIN_ABI_VERSION 2u
#define KILN_PLUGIN_ABI_MIN_VERSION 1u

typedef struct kiln_plugin_kernel {
  const char* name;            /* unique across kiln, e.g. "acme.attention.prefill.fast" */
  const char* family;          /* "attention" | "moe" */
  const char* mode;            /* "prefill" | "decode" | "apply" */
  const char* vendor;          /* "nvidia" | "amd" */
  int32_t min_arch;            /* inclusive, as Platform::arch_version (sm_90a -> 90); 0: any */
  int32_t max_arch;            /* inclusive; 0: any */
  const char* features;        /* comma-separated required features, e.g. "mma:wgmma,memory:tma" */
  int32_t priority;            /* 0 reference .. 4 plugin; ranks among plugin kernels. A built-in kernel
                                  that runs a call wins over every plugin kernel unless the operator
                                  sets KILN_PLUGINS_OUTRANK=1 (kiln::Registry) */
  int32_t specificity;         /* signature properties this kernel constrains (tie-breaker) */
  const char* source;          /* full kernel source text */
  const char* name_expression; /* the __global__ function to instantiate, e.g. "acme_prefill" */
  /* Returns 1 if the kernel runs the canonical signature (see kiln::Signature::canonical);
   * otherwise 0 and a NUL-terminated reason written into reason[0..reason_size). */
  int (*accepts)(const char* signature, char* reason, size_t reason_size);
  /* Launch geometry for one call: params points at the operator's parameter block, target is
   * the arch ("sm_90a"). Returns 0 on success, else nonzero (kiln reports it as unsupported). */
  int (*launch_shape)(const void* params, const char* target, uint32_t grid[3], uint32_t block[3], uint32_t* dynamic_shared_bytes);
} kiln_plugin_kernel;

/* One call's launch (version 2). kiln fills it with defaults (grid and block 1, no dynamic
 * shared memory, no cluster, not cooperative) before calling the kernel's launch(). */
typedef struct kiln_plugin_launch {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t dynamic_shared_bytes; /* above 48 KiB kiln raises the function's limit */
  uint32_t cluster[3];           /* thread-block cluster (sm_90+); all 0: none */
  int32_t cooperative;           /* 1: every CTA resident at once, for grid-wide barriers */
} kiln_plugin_launch;

typedef struct kiln_plugin_kernel_v2 {
  const char* name;     /* unique across kiln, e.g. "acme.attention.prefill.fast" */
  const char* family;   /* "attention" | "moe" */
  const char* mode;     /* "prefill" | "decode" | "extend" | "kv_append" | "apply" */
  const char* vendor;   /* "nvidia" | "amd" | a backend plugin's name (kiln/backend_plugin.h) */
  int32_t min_arch;     /* inclusive, as Platform::arch_version (sm_90a -> 90); 0: any */
  int32_t max_arch;     /* inclusive; 0: any */
  const char* features; /* comma-separated required features, e.g. "mma:wgmma,memory:tma" */
  int32_t priority;     /* as in version 1 */
  int32_t specificity;  /* signature properties this kernel constrains (tie-breaker) */
  const char* source;   /* full kernel source text */
  /* The signatures it runs, as data: constraints separated by ';', each a property and the values
   * it may take separated by '|', as kiln::Signature::canonical writes them, e.g.
   * "dtype=bf16|f16;head_dim=64|128;window=0". A signature must satisfy every constraint; NULL or
   * "": any signature of the operator. kiln explains a refusal by naming the constraint. */
  const char* signatures;
  /* Optional, for what data cannot say: as version 1's accepts. NULL: the constraints decide. */
  int (*accepts)(const char* signature, char* reason, size_t reason_size);
  /* The __global__ function when specialize is NULL, e.g. "acme_prefill". */
  const char* name_expression;
  /* Optional specialization for a signature (canonical) on a target ("sm_90a"): writes the name
   * expression to instantiate (with template arguments, e.g. "acme_prefill<128, true>") and
   * compile options, one per line (e.g. "-DACME_TILE=128"), both NUL-terminated. Each is part of
   * the kernel's cache key. Returns 0, or nonzero with a reason in name_expression (kiln then
   * reports the signature as unsupported). */
  int (*specialize)(const char* signature, const char* target, char* name_expression, size_t name_size, char* options, size_t options_size);
  /* Optional: the scratch one call needs, in bytes (0: none). kiln allocates it on the call's
   * stream, zero-filled, writes its address into the parameter block's workspace field, and
   * frees it after the launch. */
  uint64_t (*workspace_bytes)(const void* params, const char* target);
  /* Required: one call's launch. Returns 0, else nonzero (the call is reported unsupported). */
  int (*launch)(const void* params, const char* target, kiln_plugin_launch* launch);
} kiln_plugin_kernel_v2;

typedef struct kiln_plugin {
  uint32_t abi_version; /* the KILN_PLUGIN_ABI_VERSION the plugin was built against */
  const char* name;
  uint32_t num_kernels;
  const kiln_plugin_kernel* kernels; /* version 1: num_kernels of them; version 2: NULL */
  /* Version 2 only (kiln reads it only from a plugin that says abi_version 2): num_kernels of them. */
  const kiln_plugin_kernel_v2* kernels_v2;
} kiln_plugin;

typedef const kiln_plugin* (*kiln_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_PLUGIN_H */
