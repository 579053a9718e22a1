/* A complete kiln kernel plugin (ABI version 2): kv_cache_append for 16-bit caches, one CTA per
 * new token copying its key and value rows into their page slots. Copy it, rename "acme", and
 * replace the kernel; README.md beside it walks through each part. */
#include <stdio.h>
#include <string.h>

#include "attention/params.h" /* installed in <prefix>/include/kiln/kernel-params */
#include "kiln/plugin.h"

/* What the data cannot say: the cache holds the same 16-bit type as the new rows. The canonical
 * signature lists properties by name: "attention.kv_append:dtype=bf16,kv_dtype=bf16". */
static int accepts(const char* signature, char* reason, size_t reason_size) {
  const int bf16 = strstr(signature, ":dtype=bf16,") != NULL && strstr(signature, ",kv_dtype=bf16") != NULL;
  const int f16 = strstr(signature, ":dtype=f16,") != NULL && strstr(signature, ",kv_dtype=f16") != NULL;
  if (bf16 || f16) return 1;
  snprintf(reason, reason_size, "acme copies rows: the cache must hold the rows' own dtype");
  return 0;
}

/* One instantiation per element size (both dtypes are 2 bytes; an fp8 variant would add 1). The
 * name expression and every option are part of the cache key. */
static int specialize(const char* signature, const char* target, char* name_expression, size_t name_size, char* options,
                      size_t options_size) {
  (void)signature;
  (void)target;
  snprintf(name_expression, name_size, "acme_kv_append<unsigned short>");
  snprintf(options, options_size, "-DACME_THREADS=128\n");
  return 0;
}

static int launch(const void* params, const char* target, kiln_plugin_launch* l) {
  const KilnKvAppendParams* p = (const KilnKvAppendParams*)params;
  (void)target;
  if (p->tokens <= 0) return 1; /* kiln launches nothing for an empty call; decline defensively */
  l->grid[0] = (uint32_t)p->tokens;
  l->block[0] = 128;
  return 0;
}

static const char kSource[] =
    "#include \"attention/params.h\"\n"
    "// Token blockIdx.x: its K and V rows (Hkv x D values) to row slot % page_size of page\n"
    "// slot / page_size; a negative slot is skipped. Strides count elements, as kiln passes them.\n"
    "template <typename T>\n"
    "__global__ void __launch_bounds__(ACME_THREADS) acme_kv_append(const KilnKvAppendParams p) {\n"
    "  const long long t = blockIdx.x;\n"
    "  const long long slot = p.slot_mapping[t * p.slot_stride];\n"
    "  if (slot < 0) return;\n"
    "  const long long page = slot >> p.page_shift, row = slot & ((1LL << p.page_shift) - 1);\n"
    "  for (int i = threadIdx.x; i < p.num_heads_kv * p.head_dim; i += ACME_THREADS) {\n"
    "    const int h = i / p.head_dim, d = i % p.head_dim;\n"
    "    static_cast<T*>(p.k_cache)[page * p.k_cache_page_stride + row * p.k_cache_row_stride + h * p.k_cache_head_stride + d] =\n"
    "        static_cast<const T*>(p.k)[t * p.k_row_stride + h * p.k_head_stride + d];\n"
    "    static_cast<T*>(p.v_cache)[page * p.v_cache_page_stride + row * p.v_cache_row_stride + h * p.v_cache_head_stride + d] =\n"
    "        static_cast<const T*>(p.v)[t * p.v_row_stride + h * p.v_head_stride + d];\n"
    "  }\n"
    "}\n";

static const kiln_plugin_kernel_v2 kKernels[] = {{
    .name = "acme.attention.kv_append.rows",
    .family = "attention",
    .mode = "kv_append",
    .vendor = "nvidia",
    .min_arch = 80,
    .max_arch = 0,
    .features = "",
    .priority = 4,
    .specificity = 2,
    .source = kSource,
    .signatures = "dtype=bf16|f16;kv_dtype=bf16|f16",
    .accepts = accepts,
    .name_expression = NULL,
    .specialize = specialize,
    .workspace_bytes = NULL,
    .launch = launch,
}};

static const kiln_plugin kPlugin = {KILN_PLUGIN_ABI_VERSION, "acme kernels", 1, NULL, kKernels};

__attribute__((visibility("default"))) const kiln_plugin* kiln_plugin_entry(void) { return &kPlugin; }
