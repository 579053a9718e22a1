// The C ABI (kiln/kiln.h): converts arguments, calls the C++ API, and turns every exception into
// a status code plus a thread-local message. No exception crosses this file's functions.
#include "kiln/jit.hpp"
#include "kiln/kiln.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/author.hpp"
#include "kiln/cache.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "kiln/ops.hpp"
#include "kiln/platform.hpp"
#include "kiln/registry.hpp"
#include "kiln/scratch.hpp"
#include "kiln/warmup.hpp"
#include "warmup/report_json.hpp"

namespace {

thread_local std::string last_error;

kiln_status status_of(kiln::ErrorCode code) {
  switch (code) {
    case kiln::ErrorCode::kInvalidArgument: return KILN_ERROR_INVALID_ARGUMENT;
    case kiln::ErrorCode::kUnsupported: return KILN_ERROR_UNSUPPORTED;
    case kiln::ErrorCode::kNoKernel: return KILN_ERROR_NO_KERNEL;
    case kiln::ErrorCode::kCompileFailed: return KILN_ERROR_COMPILE_FAILED;
    case kiln::ErrorCode::kDriverError: return KILN_ERROR_DRIVER;
    case kiln::ErrorCode::kCacheError: return KILN_ERROR_CACHE;
    case kiln::ErrorCode::kPluginError: return KILN_ERROR_PLUGIN;
    case kiln::ErrorCode::kInternal: return KILN_ERROR_INTERNAL;
    case kiln::ErrorCode::kGraphCapture: return KILN_ERROR_GRAPH_CAPTURE;
  }
  return KILN_ERROR_INTERNAL;
}

template <typename F>
kiln_status guarded(F&& body) {
  try {
    body();
    last_error.clear();
    return KILN_OK;
  } catch (const kiln::Error& e) {
    last_error = e.what();
    return status_of(e.code());
  } catch (const std::bad_alloc&) {
    last_error = "kiln: out of host memory";
    return KILN_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    last_error = std::string("kiln: internal error: ") + e.what();
    return KILN_ERROR_INTERNAL;
  } catch (...) {
    last_error = "kiln: internal error: unknown exception";
    return KILN_ERROR_INTERNAL;
  }
}

kiln::TensorView view(const kiln_tensor* t, const char* name) {
  kiln::TensorView v;
  if (t == nullptr) return v;  // absent
  if (t->dtype < KILN_BF16 || t->dtype > KILN_F4_E2M1X2_PREPARED) {
    throw kiln::Error(kiln::ErrorCode::kInvalidArgument, fmt::format("{}: dtype code {} is not a kiln_dtype", name, t->dtype));
  }
  if (t->ndim < 1 || t->ndim > KILN_MAX_DIMS) {
    throw kiln::Error(kiln::ErrorCode::kInvalidArgument, fmt::format("{}: ndim {} is outside 1..{}", name, t->ndim, KILN_MAX_DIMS));
  }
  v.data = t->data;
  v.dtype = static_cast<kiln::DType>(t->dtype);
  v.ndim = t->ndim;
  for (int i = 0; i < t->ndim; ++i) {
    v.shape[static_cast<size_t>(i)] = t->shape[i];
    v.strides[static_cast<size_t>(i)] = t->strides[i];
  }
  v.device = t->device;
  return v;
}

void require(const void* p, const char* name) {
  if (p == nullptr) throw kiln::Error(kiln::ErrorCode::kInvalidArgument, fmt::format("{}: must not be NULL", name));
}

char* copy_string(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

kiln::Platform platform_named_or_current(const char* target) {
  if (target != nullptr && *target != '\0') return kiln::platform_for_target(target);
  kiln::DeviceReport report = kiln::detect_devices();
  if (report.devices.empty()) {
    std::string why;
    for (const auto& n : report.notes) why += "\n  " + n;
    throw kiln::Error(kiln::ErrorCode::kDriverError, "target: none given and no usable GPU found:" + why);
  }
  return report.devices.front();
}

kiln::MhaPrefillArgs to_cpp(const kiln_mha_prefill_args* a) {
  require(a, "args");
  kiln::MhaPrefillArgs args;
  args.q = view(a->q, "q");
  args.k = view(a->k, "k");
  args.v = view(a->v, "v");
  args.out = view(a->out, "out");
  args.cu_seqlens_q = view(a->cu_seqlens_q, "cu_seqlens_q");
  args.cu_seqlens_k = view(a->cu_seqlens_k, "cu_seqlens_k");
  args.max_seqlen_q = a->max_seqlen_q;
  args.max_seqlen_k = a->max_seqlen_k;
  args.lse = view(a->lse, "lse");
  args.sinks = view(a->sinks, "sinks");
  args.softmax_scale = a->softmax_scale;
  args.softcap = a->softcap;
  args.causal = a->causal != 0;
  args.window_left = a->window_left;
  return args;
}

kiln::MhaDecodeArgs to_cpp(const kiln_mha_decode_args* a) {
  require(a, "args");
  kiln::MhaDecodeArgs args;
  args.q = view(a->q, "q");
  args.k_cache = view(a->k_cache, "k_cache");
  args.v_cache = view(a->v_cache, "v_cache");
  args.page_table = view(a->page_table, "page_table");
  args.cache_seqlens = view(a->cache_seqlens, "cache_seqlens");
  args.out = view(a->out, "out");
  args.q_len = a->q_len;
  args.lse = view(a->lse, "lse");
  args.sinks = view(a->sinks, "sinks");
  args.softmax_scale = a->softmax_scale;
  args.softcap = a->softcap;
  args.window_left = a->window_left;
  args.k_scale = a->k_scale;
  args.v_scale = a->v_scale;
  return args;
}

kiln::MhaExtendArgs to_cpp(const kiln_mha_extend_args* a) {
  require(a, "args");
  kiln::MhaExtendArgs args;
  args.q = view(a->q, "q");
  args.k_cache = view(a->k_cache, "k_cache");
  args.v_cache = view(a->v_cache, "v_cache");
  args.page_table = view(a->page_table, "page_table");
  args.cache_seqlens = view(a->cache_seqlens, "cache_seqlens");
  args.cu_seqlens_q = view(a->cu_seqlens_q, "cu_seqlens_q");
  args.out = view(a->out, "out");
  args.max_seqlen_q = a->max_seqlen_q;
  args.lse = view(a->lse, "lse");
  args.sinks = view(a->sinks, "sinks");
  args.softmax_scale = a->softmax_scale;
  args.softcap = a->softcap;
  args.causal = a->causal != 0;
  args.window_left = a->window_left;
  args.k_scale = a->k_scale;
  args.v_scale = a->v_scale;
  return args;
}

kiln::KvAppendArgs to_cpp(const kiln_kv_append_args* a) {
  require(a, "args");
  kiln::KvAppendArgs args;
  args.k = view(a->k, "k");
  args.v = view(a->v, "v");
  args.slot_mapping = view(a->slot_mapping, "slot_mapping");
  args.k_cache = view(a->k_cache, "k_cache");
  args.v_cache = view(a->v_cache, "v_cache");
  args.k_scale = a->k_scale;
  args.v_scale = a->v_scale;
  return args;
}

kiln::MoeArgs to_cpp(const kiln_moe_args* a) {
  require(a, "args");
  kiln::MoeArgs args;
  args.x = view(a->x, "x");
  args.out = view(a->out, "out");
  args.router_logits = view(a->router_logits, "router_logits");
  args.topk_ids = view(a->topk_ids, "topk_ids");
  args.topk_weights = view(a->topk_weights, "topk_weights");
  args.top_k = a->top_k;
  args.routing = static_cast<kiln::MoeRouting>(a->routing);
  args.renormalize = a->renormalize != 0;
  args.w13 = view(a->w13, "w13");
  args.w13_scale = view(a->w13_scale, "w13_scale");
  args.w13_bias = view(a->w13_bias, "w13_bias");
  args.w2 = view(a->w2, "w2");
  args.w2_scale = view(a->w2_scale, "w2_scale");
  args.w2_bias = view(a->w2_bias, "w2_bias");
  args.activation = static_cast<kiln::MoeActivation>(a->activation);
  args.gate_up_layout = static_cast<kiln::GateUpLayout>(a->gate_up_layout);
  args.activation_dtype = a->activation_dtype == 0 ? kiln::DType::kBF16 : static_cast<kiln::DType>(a->activation_dtype);
  return args;
}

}  // namespace

extern "C" {

const char* kiln_last_error(void) { return last_error.c_str(); }
const char* kiln_version(void) { return KILN_VERSION_STRING; }

kiln_status kiln_mha_prefill(const kiln_mha_prefill_args* a, void* stream) {
  return guarded([&] { kiln::mha_prefill(to_cpp(a), stream); });
}

kiln_status kiln_mha_decode_with_kvcache(const kiln_mha_decode_args* a, void* stream) {
  return guarded([&] { kiln::mha_decode_with_kvcache(to_cpp(a), stream); });
}

kiln_status kiln_mha_extend_with_kvcache(const kiln_mha_extend_args* a, void* stream) {
  return guarded([&] { kiln::mha_extend_with_kvcache(to_cpp(a), stream); });
}

kiln_status kiln_kv_cache_append(const kiln_kv_append_args* a, void* stream) {
  return guarded([&] { kiln::kv_cache_append(to_cpp(a), stream); });
}

kiln_status kiln_moe_apply(const kiln_moe_args* a, void* stream) {
  return guarded([&] { kiln::moe_apply(to_cpp(a), stream); });
}

kiln_status kiln_workspace_bytes(const char* op, const void* args, void* stream, size_t* bytes) {
  return guarded([&] {
    require(op, "op");
    require(bytes, "bytes");
    const kiln::OperatorId id = kiln::operator_from_name(op);
    const std::string name = kiln::operator_name(id);
    if (name == "mha_prefill") {
      *bytes = kiln::workspace_bytes(to_cpp(static_cast<const kiln_mha_prefill_args*>(args)), stream);
    } else if (name == "mha_decode_with_kvcache") {
      *bytes = kiln::workspace_bytes(to_cpp(static_cast<const kiln_mha_decode_args*>(args)), stream);
    } else if (name == "mha_extend_with_kvcache") {
      *bytes = kiln::workspace_bytes(to_cpp(static_cast<const kiln_mha_extend_args*>(args)), stream);
    } else if (name == "kv_cache_append") {
      *bytes = kiln::workspace_bytes(to_cpp(static_cast<const kiln_kv_append_args*>(args)), stream);
    } else {
      *bytes = kiln::workspace_bytes(to_cpp(static_cast<const kiln_moe_args*>(args)), stream);
    }
  });
}

kiln_status kiln_moe_prepare_weights(kiln_tensor* weights, void* stream) {
  return guarded([&] {
    require(weights, "weights");
    weights->dtype = static_cast<int32_t>(kiln::moe_prepare_weights(view(weights, "weights"), stream).dtype);
  });
}

kiln_status kiln_list_kernels_json(char** json_out) {
  return guarded([&] {
    require(json_out, "json_out");
    nlohmann::json list = nlohmann::json::array();
    for (const auto& k : kiln::Registry::global().kernels()) {
      list.push_back({{"name", k->name},
                      {"operator", kiln::operator_name({k->family, k->mode})},
                      {"priority", kiln::priority_name(k->priority)},
                      {"backend", kiln::backend_name(k->backend)},
                      {"vendor", kiln::vendor_name(k->requirements.vendor)},
                      {"origin", k->origin}});
    }
    *json_out = copy_string(list.dump());
  });
}

kiln_status kiln_explain_json(const char* op, const char* signature, const char* target, char** json_out) {
  return guarded([&] {
    require(op, "op");
    require(signature, "signature");
    require(json_out, "json_out");
    const kiln::Signature sig = kiln::Signature::parse(kiln::operator_from_name(op), signature);
    kiln::validate_signature(sig);
    *json_out = copy_string(kiln::Registry::global().explain(sig, platform_named_or_current(target)).to_json());
  });
}

kiln_status kiln_set_override(const char* op, const char* kernel_name) {
  return guarded([&] {
    require(op, "op");
    kiln::Registry::global().set_override(kiln::operator_from_name(op), kernel_name ? kernel_name : "");
  });
}

kiln_status kiln_load_plugin(const char* path) {
  return guarded([&] {
    require(path, "path");
    kiln::Registry::global();  // plugins from KILN_PLUGIN_PATH first
    kiln::load_plugin(path);
  });
}

void kiln_free_string(char* s) { std::free(s); }

kiln_status kiln_set_scratch_allocator(kiln_scratch_allocate_fn allocate, kiln_scratch_release_fn release, void* user) {
  return guarded([&] {
    kiln::ScratchAllocator a;
    a.allocate = allocate;
    a.release = release;
    a.user = user;
    kiln::set_scratch_allocator(a);
  });
}

kiln_status kiln_prepare_only(int32_t enter) {
  // The C face of kiln::PrepareOnly: one scope per unmatched enter, per thread.
  thread_local std::vector<std::unique_ptr<kiln::PrepareOnly>> scopes;
  return guarded([&] {
    if (enter != 0) {
      scopes.push_back(std::make_unique<kiln::PrepareOnly>());
    } else if (scopes.empty()) {
      throw kiln::Error(kiln::ErrorCode::kInvalidArgument, "enter: 0 ends a prepare-only mode, and this thread is in none");
    } else {
      scopes.pop_back();
    }
  });
}

kiln_status kiln_set_log_callback(kiln_log_fn callback, void* user) {
  return guarded([&] {
    if (callback == nullptr) {
      kiln::set_log_callback(nullptr);
    } else {
      kiln::set_log_callback([callback, user](kiln::LogLevel level, const std::string& message) {
        callback(static_cast<int32_t>(level), message.c_str(), user);
      });
    }
  });
}

kiln_status kiln_set_log_level(int32_t level) {
  return guarded([&] {
    if (level < 0 || level > static_cast<int32_t>(kiln::LogLevel::kOff)) {
      throw kiln::Error(kiln::ErrorCode::kInvalidArgument, fmt::format("level: {} is outside 0 (debug) .. 4 (off)", level));
    }
    kiln::set_log_level(static_cast<kiln::LogLevel>(level));
  });
}

kiln_status kiln_set_jit(int32_t compile) {
  return guarded([&] {
    if (compile != 0 && compile != 1) {
      throw kiln::Error(kiln::ErrorCode::kInvalidArgument, fmt::format("compile: must be 0 (off) or 1 (on), got {}", compile));
    }
    kiln::JitSettings settings = kiln::jit_settings();
    settings.compile = compile == 1;
    kiln::set_jit_settings(settings);
  });
}

kiln_status kiln_cache_stats_json(char** json_out) {
  return guarded([&] {
    require(json_out, "json_out");
    *json_out = copy_string(kiln::detail::cache_stats_json(kiln::cache_stats()).dump());
  });
}

kiln_status kiln_warmup_json(const char* manifest, const char* targets, int32_t jobs, char** report_json) {
  return guarded([&] {
    require(manifest, "manifest");
    require(targets, "targets");
    require(report_json, "report_json");
    if (jobs < 0) throw kiln::Error(kiln::ErrorCode::kInvalidArgument, fmt::format("jobs: {} is negative (0: one per core)", jobs));
    kiln::WarmupOptions options;
    options.targets = kiln::detail::parse_target_list(targets, "targets");
    options.jobs = jobs;
    const kiln::Manifest m = kiln::load_manifest(manifest);
    nlohmann::json out = kiln::detail::warmup_report_json(kiln::warmup(m, options));
    out["model"] = m.model;
    out["targets"] = options.targets;
    *report_json = copy_string(out.dump());
  });
}

}  // extern "C"
