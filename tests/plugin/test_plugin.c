/* A real out-of-tree kiln plugin of ABI version 1, built by the test suite: kiln still loads
 * those. It registers one prefill kernel that accepts only head_dim=64 and causal=1, at PLUGIN
 * priority, with CUDA source that compiles. Built twice: once as is, once with
 * KILN_TEST_PLUGIN_ABI set to a wrong ABI version. */
#include <stdio.h>
#include <string.h>

#include "kiln/plugin.h"

#ifndef KILN_TEST_PLUGIN_ABI
#define KILN_TEST_PLUGIN_ABI 1u
#endif

static int accepts(const char* signature, char* reason, size_t reason_size) {
  if (strstr(signature, "head_dim=64") == NULL) {
    snprintf(reason, reason_size, "testplugin handles head_dim=64 only");
    return 0;
  }
  if (strstr(signature, "causal=1") == NULL) {
    snprintf(reason, reason_size, "testplugin handles causal attention only");
    return 0;
  }
  return 1;
}

static int launch_shape(const void* params, const char* target, uint32_t grid[3], uint32_t block[3], uint32_t* dynamic_shared_bytes) {
  (void)params;
  (void)target;
  grid[0] = grid[1] = grid[2] = 1;
  block[0] = 32;
  block[1] = block[2] = 1;
  *dynamic_shared_bytes = 0;
  return 0;
}

static const char kSource[] =
    "#include \"attention/params.h\"\n"
    "extern \"C\" __global__ void testplugin_prefill(const KilnPrefillParams p) {\n"
    "  if (threadIdx.x == 0 && p.batch < 0) *(int*)p.out = 0;\n"
    "}\n";

static const kiln_plugin_kernel kKernels[] = {{
    "testplugin.attention.prefill.causal64",
    "attention",
    "prefill",
    "nvidia",
    80,
    0,
    "",
    4,
    2,
    kSource,
    "testplugin_prefill",
    accepts,
    launch_shape,
}};

static const kiln_plugin kPlugin = {KILN_TEST_PLUGIN_ABI, "kiln test plugin", 1, kKernels};

__attribute__((visibility("default"))) const kiln_plugin* kiln_plugin_entry(void) { return &kPlugin; }
