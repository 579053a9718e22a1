/* A real out-of-tree kiln plugin of ABI version 2, built by the test suite: one decode kernel
 * whose accepted signatures are data, specialized per signature (template arguments and a
 * define), with a workspace and launch attributes (a cluster, more dynamic shared memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/params.h"
#include "kiln/plugin.h"

/* The integer value of `key` in a canonical signature ("op:key=value,..."), or -1. */
static long property(const char* signature, const char* key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "%s=", key);
  for (const char* at = strstr(signature, pattern); at != NULL; at = strstr(at + 1, pattern)) {
    if (at[-1] == ':' || at[-1] == ',') return strtol(at + strlen(pattern), NULL, 10);
  }
  return -1;
}

static int specialize(const char* signature, const char* target, char* name_expression, size_t name_size, char* options,
                      size_t options_size) {
  (void)target;
  const long head_dim = property(signature, "head_dim"), group = property(signature, "group");
  if (group > 8) {
    snprintf(name_expression, name_size, "testplugin2 is built for groups up to 8, not %ld", group);
    return 1;
  }
  snprintf(name_expression, name_size, "testplugin2_decode<%ld, %ld>", head_dim, group);
  snprintf(options, options_size, "-DTESTPLUGIN2_HEAD_DIM=%ld\n-DTESTPLUGIN2_TAG=7\n", head_dim);
  return 0;
}

static uint64_t workspace_bytes(const void* params, const char* target) {
  (void)target;
  const KilnDecodeParams* p = (const KilnDecodeParams*)params;
  return (uint64_t)p->batch * 4096u;
}

static int launch(const void* params, const char* target, kiln_plugin_launch* l) {
  const KilnDecodeParams* p = (const KilnDecodeParams*)params;
  if (strcmp(target, "sm_90a") != 0) return 1;
  l->grid[0] = (uint32_t)p->batch;
  l->grid[1] = 2;
  l->block[0] = 128;
  l->dynamic_shared_bytes = 64 * 1024;
  l->cluster[1] = 2;
  return 0;
}

/* On a GPU (tests/gpu) the kernel leaves a trace of its launch: each CTA writes its place in the
 * cluster through the workspace and back into lse, so a run shows the cluster, the workspace and
 * the specialization all arrived. */
static const char kSource[] =
    "#include \"attention/params.h\"\n"
    "#if !defined(TESTPLUGIN2_HEAD_DIM) || TESTPLUGIN2_TAG != 7\n"
    "#error specialize's options did not reach the compiler\n"
    "#endif\n"
    "template <int kHeadDim, int kGroup>\n"
    "__global__ void testplugin2_decode(const KilnDecodeParams p) {\n"
    "  static_assert(kHeadDim == TESTPLUGIN2_HEAD_DIM, \"template argument and define agree\");\n"
    "  if (threadIdx.x != 0 || p.lse == nullptr) return;\n"
    "  unsigned rank;\n"
    "  asm volatile(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(rank));\n"
    "  const int cta = blockIdx.x * gridDim.y + blockIdx.y;\n"
    "  volatile float* scratch = static_cast<float*>(p.workspace);\n"
    "  scratch[cta] = float(kHeadDim * kGroup * 10 + rank);\n"
    "  p.lse[cta] = scratch[cta];\n"
    "}\n";

static const kiln_plugin_kernel_v2 kKernels[] = {{
    "testplugin2.attention.decode.tiled",
    "attention",
    "decode",
    "nvidia",
    90,
    0,
    "",
    4,
    3,
    kSource,
    "dtype=f16;kv_dtype=f16;head_dim=64|128;q_len=1",
    NULL,
    NULL,
    specialize,
    workspace_bytes,
    launch,
}};

static const kiln_plugin kPlugin = {KILN_PLUGIN_ABI_VERSION, "kiln test plugin v2", 1, NULL, kKernels};

__attribute__((visibility("default"))) const kiln_plugin* kiln_plugin_entry(void) { return &kPlugin; }
