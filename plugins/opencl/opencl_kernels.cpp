// The OpenCL backend's kernels, as kiln plugin ABI version 2 kernels of vendor "opencl": every
// operator in plain OpenCL C (kernels.cl), one work-item per output row, fp32 accumulation.
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>

#include "attention/params.h"
#include "kiln/plugin.h"
#include "moe/params.h"
#include "opencl_kernels_source.hpp"  // kKernelsSource: kernels.cl
#include "opencl_plugin.hpp"

namespace kiln_opencl {
namespace {

// ---- the program: the parameter blocks' field offsets, then kernels.cl

#define KILN_OCL_OFFSET(out, alias, type, field) out << "#define KILN_P_" #alias "_" #field " " << offsetof(type, field) << "\n";

std::string program_text() {
  std::ostringstream o;
  o << "// Field offsets of kiln's parameter blocks (kernel-params/*/params.h) on this host.\n";
#define PREFILL(f) KILN_OCL_OFFSET(o, Prefill, KilnPrefillParams, f)
  PREFILL(q)
  PREFILL(k)
  PREFILL(v)
      PREFILL(out) PREFILL(lse) PREFILL(sinks) PREFILL(cu_seqlens_q) PREFILL(cu_seqlens_k) PREFILL(q_row_stride) PREFILL(
          q_head_stride) PREFILL(k_row_stride) PREFILL(k_head_stride) PREFILL(v_row_stride) PREFILL(v_head_stride) PREFILL(out_row_stride)
          PREFILL(out_head_stride) PREFILL(lse_row_stride) PREFILL(num_heads_q) PREFILL(num_heads_kv) PREFILL(causal) PREFILL(
              window_left) PREFILL(softmax_scale) PREFILL(softcap) PREFILL(page_table) PREFILL(cache_seqlens) PREFILL(page_table_stride)
              PREFILL(k_page_stride) PREFILL(v_page_stride) PREFILL(page_size) PREFILL(page_shift) PREFILL(q_len) PREFILL(k_scale) PREFILL(
                  v_scale)
#undef PREFILL
#define DECODE(f) KILN_OCL_OFFSET(o, Decode, KilnDecodeParams, f)
                  DECODE(q) DECODE(k_cache) DECODE(v_cache) DECODE(out) DECODE(lse) DECODE(sinks) DECODE(page_table) DECODE(cache_seqlens)
                      DECODE(q_row_stride) DECODE(q_head_stride) DECODE(k_page_stride) DECODE(k_row_stride) DECODE(k_head_stride)
                          DECODE(v_page_stride) DECODE(v_row_stride) DECODE(v_head_stride) DECODE(out_row_stride) DECODE(out_head_stride)
                              DECODE(lse_row_stride) DECODE(page_table_stride) DECODE(batch) DECODE(q_len) DECODE(num_heads_q)
                                  DECODE(num_heads_kv) DECODE(page_size) DECODE(window_left) DECODE(softmax_scale) DECODE(softcap)
                                      DECODE(k_scale) DECODE(v_scale)
#undef DECODE
#define KV_APPEND(f) KILN_OCL_OFFSET(o, KvAppend, KilnKvAppendParams, f)
                                          KV_APPEND(k) KV_APPEND(v) KV_APPEND(slot_mapping) KV_APPEND(k_cache) KV_APPEND(v_cache) KV_APPEND(
                                              k_row_stride) KV_APPEND(k_head_stride) KV_APPEND(v_row_stride) KV_APPEND(v_head_stride)
                                              KV_APPEND(k_cache_page_stride) KV_APPEND(k_cache_row_stride) KV_APPEND(k_cache_head_stride)
                                                  KV_APPEND(v_cache_page_stride) KV_APPEND(v_cache_row_stride)
                                                      KV_APPEND(v_cache_head_stride) KV_APPEND(slot_stride) KV_APPEND(tokens)
                                                          KV_APPEND(num_heads_kv) KV_APPEND(head_dim) KV_APPEND(page_shift)
#undef KV_APPEND
#define MOE(f) KILN_OCL_OFFSET(o, Moe, KilnMoeParams, f)
                                                              MOE(x) MOE(out)
                                                                  MOE(router_logits) MOE(topk_ids) MOE(topk_weights) MOE(w13)
                                                                      MOE(w13_scale) MOE(w13_bias) MOE(w2) MOE(w2_scale) MOE(w2_bias)
                                                                          MOE(x_row_stride) MOE(out_row_stride) MOE(logits_row_stride) MOE(
                                                                              topk_row_stride) MOE(w13_expert_stride) MOE(w13_row_stride)
                                                                              MOE(w13_scale_expert_stride) MOE(w13_scale_row_stride)
                                                                                  MOE(w2_expert_stride) MOE(w2_row_stride)
                                                                                      MOE(w2_scale_expert_stride)
                                                                                          MOE(w2_scale_row_stride)
                                                                                              MOE(w13_bias_expert_stride)
                                                                                                  MOE(w2_bias_expert_stride) MOE(hidden)
                                                                                                      MOE(intermediate) MOE(num_experts)
                                                                                                          MOE(top_k) MOE(renormalize)
#undef MOE
                                                                                                              o
      << kKernelsSource;
  return o.str();
}

const std::string& program() {
  static const std::string text = program_text();
  return text;
}

// ---- signatures: "family.mode:key=value,..."

std::map<std::string, std::string> properties(const char* signature) {
  std::map<std::string, std::string> out;
  std::string text(signature);
  std::stringstream ss(text.substr(text.find(':') + 1));
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    if (eq != std::string::npos) out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

int refuse(char* reason, size_t size, const std::string& why) {
  std::snprintf(reason, size, "%s", why.c_str());
  return 0;
}

// Attention kernels keep a row of head_dim floats per work-item: up to 256.
int attention_accepts(const char* signature, char* reason, size_t size) {
  auto p = properties(signature);
  const int head_dim = std::atoi(p["head_dim"].c_str());
  if (head_dim < 1 || head_dim > 256) return refuse(reason, size, "head_dim " + p["head_dim"] + " unsupported (1 to 256)");
  if (p.count("kv_dtype") && p["kv_dtype"] != p["dtype"]) {
    return refuse(reason, size, "kv_dtype " + p["kv_dtype"] + " unsupported (the OpenCL kernels take caches of the queries' type)");
  }
  return 1;
}

int kv_append_accepts(const char* signature, char* reason, size_t size) {
  auto p = properties(signature);
  if (p["kv_dtype"] != p["dtype"]) return refuse(reason, size, "kv_dtype " + p["kv_dtype"] + " unsupported (same as dtype only)");
  return 1;
}

int write_specialization(const char* entry, const std::string& options, char* name, size_t name_size, char* out, size_t out_size) {
  if (options.size() + 1 > out_size) {
    std::snprintf(name, name_size, "options exceed %zu bytes", out_size);
    return 1;
  }
  std::snprintf(name, name_size, "%s", entry);
  std::snprintf(out, out_size, "%s", options.c_str());
  return 0;
}

std::string element_options(std::map<std::string, std::string>& p) { return p["dtype"] == "f16" ? "-DKILN_F16=1\n" : ""; }

int specialize_prefill(const char* signature, const char*, char* name, size_t name_size, char* options, size_t options_size) {
  auto p = properties(signature);
  return write_specialization("kiln_prefill", element_options(p) + "-DHEAD_DIM=" + p["head_dim"], name, name_size, options, options_size);
}

int specialize_decode(const char* signature, const char*, char* name, size_t name_size, char* options, size_t options_size) {
  auto p = properties(signature);
  return write_specialization("kiln_decode", element_options(p) + "-DHEAD_DIM=" + p["head_dim"], name, name_size, options, options_size);
}

int specialize_kv_append(const char* signature, const char*, char* name, size_t name_size, char* options, size_t options_size) {
  auto p = properties(signature);
  return write_specialization("kiln_kv_append", element_options(p), name, name_size, options, options_size);
}

int bias_kind(const std::string& bias) { return bias == "none" ? 0 : bias == "f32" ? 1 : 2; }

int specialize_moe(const char* signature, const char*, char* name, size_t name_size, char* options, size_t options_size) {
  auto p = properties(signature);
  const std::string& routing = p["routing"];
  std::ostringstream o;
  o << "-DMOE_FORMAT=" << (p["weights"] == "mxfp4" ? 1 : 0) << "\n"
    << "-DMOE_ACTIVATION=" << (p["activation"] == "swiglu_clamped" ? 1 : 0) << "\n"
    << "-DMOE_INTERLEAVED=" << (p["layout"] == "interleaved" ? 1 : 0) << "\n"
    << "-DMOE_ROUTING="
    << (routing == "topk_softmax"   ? 0
        : routing == "softmax_topk" ? 1
                                    : 2)
    << "\n"
    << "-DMOE_LOGITS_BF16=" << (p.count("logits") && p["logits"] == "bf16" ? 1 : 0) << "\n"
    << "-DMOE_BIAS13=" << bias_kind(p["w13_bias"]) << "\n"
    << "-DMOE_BIAS2=" << bias_kind(p["w2_bias"]);
  return write_specialization("kiln_moe_apply", o.str(), name, name_size, options, options_size);
}

uint32_t ceil_div(long long a, long long b) { return static_cast<uint32_t>((a + b - 1) / b); }

// Work-groups of 16 rows: one work-item per (query row, head, sequence).
int launch_prefill(const void* params, const char*, kiln_plugin_launch* l) {
  const auto& p = *static_cast<const KilnPrefillParams*>(params);
  const int rows = p.q_len > 0 ? p.q_len : p.max_seqlen_q;
  l->grid[0] = ceil_div(rows, 16);
  l->grid[1] = static_cast<uint32_t>(p.num_heads_q);
  l->grid[2] = static_cast<uint32_t>(p.batch);
  l->block[0] = 16;
  return 0;
}

int launch_decode(const void* params, const char*, kiln_plugin_launch* l) {
  const auto& p = *static_cast<const KilnDecodeParams*>(params);
  l->grid[0] = static_cast<uint32_t>(p.num_heads_q);
  l->grid[1] = static_cast<uint32_t>(p.batch * p.q_len);
  return 0;
}

int launch_kv_append(const void* params, const char*, kiln_plugin_launch* l) {
  const auto& p = *static_cast<const KilnKvAppendParams*>(params);
  l->grid[0] = static_cast<uint32_t>(p.tokens);
  l->grid[1] = static_cast<uint32_t>(p.num_heads_kv);
  return 0;
}

constexpr uint32_t kMoeGroup = 64;
constexpr int kMoeMaxTopK = 32;  // MAX_TOP_K in kernels.cl

int launch_moe(const void* params, const char*, kiln_plugin_launch* l) {
  const auto& p = *static_cast<const KilnMoeParams*>(params);
  l->grid[0] = static_cast<uint32_t>(p.num_tokens);
  l->block[0] = kMoeGroup;
  l->dynamic_shared_bytes = static_cast<uint32_t>(
      (2 * static_cast<size_t>(p.hidden) + static_cast<size_t>(p.intermediate)) * sizeof(float) + 2 * kMoeMaxTopK * sizeof(float));
  return 0;
}

kiln_plugin_kernel_v2 kernel(const char* name, const char* family, const char* mode, const char* signatures,
                             int (*accepts)(const char*, char*, size_t),
                             int (*specialize)(const char*, const char*, char*, size_t, char*, size_t),
                             int (*launch)(const void*, const char*, kiln_plugin_launch*)) {
  kiln_plugin_kernel_v2 k{};
  k.name = name;
  k.family = family;
  k.mode = mode;
  k.vendor = "opencl";
  k.features = "opencl:svm_fine_grain_buffer";
  k.priority = 0;  // REFERENCE: plainly correct, the oracle on this backend
  k.specificity = 0;
  k.source = program().c_str();
  k.signatures = signatures;
  k.accepts = accepts;
  k.specialize = specialize;
  k.launch = launch;
  return k;
}

}  // namespace

const kiln_plugin* kernel_table() {
  static const kiln_plugin_kernel_v2 kernels[] = {
      kernel("opencl.attention.prefill", "attention", "prefill", "dtype=bf16|f16", attention_accepts, specialize_prefill, launch_prefill),
      kernel("opencl.attention.extend", "attention", "extend", "dtype=bf16|f16", attention_accepts, specialize_prefill, launch_prefill),
      kernel("opencl.attention.decode", "attention", "decode", "dtype=bf16|f16", attention_accepts, specialize_decode, launch_decode),
      kernel("opencl.attention.kv_append", "attention", "kv_append", "dtype=bf16|f16", kv_append_accepts, specialize_kv_append,
             launch_kv_append),
      kernel("opencl.moe.apply", "moe", "apply", "dtype=bf16;weights=bf16|mxfp4", nullptr, specialize_moe, launch_moe),
  };
  static const kiln_plugin plugin{KILN_PLUGIN_ABI_VERSION, "kiln-opencl", sizeof(kernels) / sizeof(kernels[0]), nullptr, kernels};
  return &plugin;
}

}  // namespace kiln_opencl

extern "C" __attribute__((visibility("default"))) const kiln_plugin* kiln_plugin_entry(void) { return kiln_opencl::kernel_table(); }
