/* The ABI an out-of-tree kernel plugin implements. A plugin is a shared library on
 * KILN_PLUGIN_PATH that exports
 *
 *     const kiln_plugin* kiln_plugin_entry(void);
 *
 * kiln refuses a plugin whose abi_version differs from KILN_PLUGIN_ABI_VERSION, naming both.
 * Every pointer the plugin returns must stay valid while the library is loaded (kiln never
 * unloads it). Kernel sources are CUDA/HIP text compiled by kiln's JIT like built-in ones; the
 * kernel receives the operator's parameter struct by value: kernel-sources/<family>/params.h,
 * installed (valid C11 and C++) as <prefix>/include/kiln/kernel-params/<family>/params.h, whose
 * directory kiln's CMake targets put on the include path ("attention/params.h").
 *
 * You MUST bump KILN_PLUGIN_ABI_VERSION when any struct below changes layout or meaning. */
#ifndef KILN_PLUGIN_H
#define KILN_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_PLUGIN_ABI_VERSION 1u

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

typedef struct kiln_plugin {
  uint32_t abi_version; /* KILN_PLUGIN_ABI_VERSION the plugin was built against */
  const char* name;
  uint32_t num_kernels;
  const kiln_plugin_kernel* kernels;
} kiln_plugin;

typedef const kiln_plugin* (*kiln_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_PLUGIN_H */
