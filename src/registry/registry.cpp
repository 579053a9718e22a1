// The kernel registry and the selector: filter by platform, then by signature; rank by priority
// band, then specificity, then name (so the choice is deterministic); cache the decision.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/env.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "kiln/registry.hpp"
#include "platform/vendors.hpp"

namespace kiln {
namespace {

std::string override_env_name(const OperatorId& op) {
  std::string name = "KILN_OVERRIDE_" + op.family + "_" + op.mode;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return name;
}

// Why a kernel cannot run on a platform, or nullopt.
std::optional<std::string> platform_refusal(const KernelSpec& spec, const Platform& p) {
  const Requirements& r = spec.requirements;
  if (r.vendor != p.vendor) {
    return fmt::format("needs a device of vendor {}; target {} is {}", vendor_name(r.vendor), p.arch, vendor_name(p.vendor));
  }
  if (p.arch_version < r.min_arch) {
    return fmt::format("needs arch version >= {}; {} is {}", r.min_arch, p.arch, p.arch_version);
  }
  if (p.arch_version > r.max_arch) {
    return fmt::format("needs arch version <= {}; {} is {}", r.max_arch, p.arch, p.arch_version);
  }
  for (const auto& f : r.features) {
    if (!p.has_feature(f)) return fmt::format("needs feature {}, which {} lacks", f, p.arch);
  }
  return std::nullopt;
}

bool is_builtin(const KernelSpec& k) { return k.origin == "builtin"; }

// Built-in kernels outrank plugin kernels unless the operator opts in (plugins_outrank): a plugin
// is code from outside the build, and one that claimed PLUGIN priority would otherwise take every
// call it accepts. Then priority, specificity, name.
bool ranks_before(const KernelSpec& a, const KernelSpec& b, bool plugins_outrank) {
  if (!plugins_outrank && is_builtin(a) != is_builtin(b)) return is_builtin(a);
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.specificity != b.specificity) return a.specificity > b.specificity;
  return a.name < b.name;
}

}  // namespace

const char* priority_name(Priority p) {
  switch (p) {
    case Priority::kReference: return "REFERENCE";
    case Priority::kPortable: return "PORTABLE";
    case Priority::kPerformant: return "PERFORMANT";
    case Priority::kSpecialized: return "SPECIALIZED";
    case Priority::kPlugin: return "PLUGIN";
  }
  return "?";
}

// A backend plugin's backend takes its vendor's number and name (platform/vendors.hpp).
const char* backend_name(Backend b) {
  if (b == Backend::kCuda) return "cuda";
  if (b == Backend::kHip) return "hip";
  return vendor_name(static_cast<Vendor>(b));
}

struct Registry::State {
  std::atomic<int> plugins_outrank{-1};  // -1: as KILN_PLUGINS_OUTRANK says
  mutable std::shared_mutex mutex;       // guards everything below
  std::vector<std::shared_ptr<const KernelSpec>> kernels;
  std::unordered_map<std::string, std::string> overrides;  // "family.mode" -> kernel name
  std::unordered_map<std::string, std::shared_ptr<const KernelSpec>> decisions;
  std::atomic<uint64_t> generation{0};
};

Registry::Registry() : state_(std::make_unique<State>()) {}
Registry::~Registry() = default;

namespace detail {
Registry& registry_instance() {
  static Registry registry;
  return registry;
}
}  // namespace detail

namespace {

thread_local bool loading_plugins = false;  // this thread is inside the first global()

// The platform layer asks for plugins before it names targets; loading them names targets too.
void load_plugins_for_platform() {
  if (!loading_plugins) Registry::global();
}
const bool platform_loader_installed = [] {
  detail::set_plugin_loader(&load_plugins_for_platform);
  return true;
}();

}  // namespace

Registry& Registry::global() {
  (void)platform_loader_installed;
  Registry& r = detail::registry_instance();
  static std::once_flag plugins_loaded;
  std::call_once(plugins_loaded, [] {
    loading_plugins = true;
    for (const auto& message : load_plugins_from_env()) log(LogLevel::kError, message);
    loading_plugins = false;
  });
  return r;
}

detail::KernelRegistrar::KernelRegistrar(KernelSpec (*make)()) { detail::registry_instance().add(make()); }

void Registry::add(KernelSpec spec) {
  auto incomplete = [&](const char* what) {
    return Error(ErrorCode::kInvalidArgument, fmt::format("kernel '{}' (from {}): {} is missing", spec.name, spec.origin, what));
  };
  if (spec.name.empty()) throw incomplete("name");
  if (spec.family.empty() || spec.mode.empty()) throw incomplete("family or mode");
  if (spec.source.empty()) throw incomplete("source");
  if (!spec.accepts) throw incomplete("accepts()");
  if (!spec.specialize) throw incomplete("specialize()");
  if (!spec.launch_shape) throw incomplete("launch_shape()");
  std::unique_lock lock(state_->mutex);
  for (const auto& k : state_->kernels) {
    if (k->name == spec.name) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("kernel '{}' (from {}) is already registered (from {})", spec.name, spec.origin, k->origin));
    }
  }
  state_->kernels.push_back(std::make_shared<const KernelSpec>(std::move(spec)));
  state_->decisions.clear();
  state_->generation.fetch_add(1);
}

std::vector<std::shared_ptr<const KernelSpec>> Registry::kernels() const {
  std::shared_lock lock(state_->mutex);
  auto out = state_->kernels;
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a->family != b->family) return a->family < b->family;
    if (a->mode != b->mode) return a->mode < b->mode;
    return ranks_before(*a, *b, true);
  });
  return out;
}

std::shared_ptr<const KernelSpec> Registry::find(const std::string& name) const {
  std::shared_lock lock(state_->mutex);
  for (const auto& k : state_->kernels) {
    if (k->name == name) return k;
  }
  return nullptr;
}

void Registry::set_override(const OperatorId& op, const std::string& kernel_name) {
  std::unique_lock lock(state_->mutex);
  const std::string key = op.family + "." + op.mode;
  if (!kernel_name.empty()) {
    // A name that names nothing would only fail at the next call, far from the mistake.
    std::vector<std::string> names;
    bool found = false;
    for (const auto& k : state_->kernels) {
      if (k->family != op.family || k->mode != op.mode) continue;
      names.push_back(k->name);
      found |= k->name == kernel_name;
    }
    if (!found) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("override for {}: no kernel named '{}' (registered: {})", operator_name(op),
                                                           kernel_name, fmt::join(names, ", ")));
    }
  }
  if (kernel_name.empty()) {
    state_->overrides.erase(key);
  } else {
    state_->overrides[key] = kernel_name;
  }
  state_->decisions.clear();
  state_->generation.fetch_add(1);
}

uint64_t Registry::generation() const { return state_->generation.load(std::memory_order_acquire); }

void Registry::set_plugins_outrank_builtins(bool outrank) {
  std::unique_lock lock(state_->mutex);
  state_->plugins_outrank.store(outrank ? 1 : 0);
  state_->decisions.clear();
  state_->generation.fetch_add(1);
}

bool Registry::plugins_outrank_builtins() const {
  const int set = state_->plugins_outrank.load();
  if (set >= 0) return set == 1;
  return detail::env_int("KILN_PLUGINS_OUTRANK").value_or(0) != 0;
}

Explanation Registry::explain(const Signature& sig, const Platform& platform) const {
  Explanation ex;
  ex.signature = sig.canonical();
  ex.target = platform.arch;

  std::vector<std::shared_ptr<const KernelSpec>> kernels;
  std::string override_name;
  {
    std::shared_lock lock(state_->mutex);
    kernels = state_->kernels;
    auto it = state_->overrides.find(sig.op().family + "." + sig.op().mode);
    if (it != state_->overrides.end()) override_name = it->second;
  }
  const std::string env_name = override_env_name(sig.op());
  if (auto env = detail::env_string(env_name.c_str())) override_name = *env;

  const bool plugins_outrank = plugins_outrank_builtins();
  std::sort(kernels.begin(), kernels.end(), [&](const auto& a, const auto& b) { return ranks_before(*a, *b, plugins_outrank); });
  std::vector<size_t> eligible;
  for (const auto& k : kernels) {
    if (k->family != sig.op().family || k->mode != sig.op().mode) continue;
    CandidateVerdict v;
    v.kernel = k->name;
    v.priority = k->priority;
    if (auto why = platform_refusal(*k, platform)) {
      v.reason = "platform: " + *why;
    } else {
      std::optional<std::string> why_not;
      try {
        why_not = k->accepts(sig);
      } catch (const std::exception& e) {
        why_not = std::string("accepts() failed: ") + e.what();
      }
      if (why_not) {
        v.reason = "signature: " + *why_not;
      } else {
        v.eligible = true;
        eligible.push_back(ex.candidates.size());
      }
    }
    ex.candidates.push_back(std::move(v));
  }

  if (!override_name.empty()) {
    auto it = std::find_if(ex.candidates.begin(), ex.candidates.end(), [&](const auto& c) { return c.kernel == override_name; });
    if (it == ex.candidates.end()) {
      ex.warnings.push_back(fmt::format("override '{}' names no {} kernel", override_name, operator_name(sig.op())));
      return ex;
    }
    if (!it->eligible) {
      ex.warnings.push_back(fmt::format("override '{}' cannot run this call: {}", override_name, it->reason));
      return ex;
    }
    it->selected = true;
    it->reason = "forced by override";
    ex.selected = override_name;
    for (size_t i : eligible) {
      if (!ex.candidates[i].selected) ex.candidates[i].reason = "eligible; not the override";
    }
    return ex;
  }

  if (eligible.empty()) return ex;
  CandidateVerdict& best = ex.candidates[eligible[0]];
  best.selected = true;
  ex.selected = best.kernel;
  best.reason = fmt::format("highest rank ({})", priority_name(best.priority));
  auto spec_of = [&](const std::string& name) {
    return *std::find_if(kernels.begin(), kernels.end(), [&](const auto& k) { return k->name == name; });
  };
  const auto best_spec = spec_of(best.kernel);
  for (size_t n = 1; n < eligible.size(); ++n) {
    CandidateVerdict& c = ex.candidates[eligible[n]];
    const auto spec = spec_of(c.kernel);
    if (spec->priority == best_spec->priority && spec->specificity == best_spec->specificity) {
      c.reason = fmt::format("eligible; ties with {} on priority and specificity, loses by name", best.kernel);
      ex.warnings.push_back(
          fmt::format("equal-priority conflict: {} and {} both run this signature at {} with specificity {}; "
                      "chose {} (override to pick the other)",
                      best.kernel, c.kernel, priority_name(spec->priority), spec->specificity, best.kernel));
    } else if (!plugins_outrank && !is_builtin(*spec) && is_builtin(*best_spec) && spec->priority > best_spec->priority) {
      c.reason = fmt::format("eligible; outranked by {}: built-in kernels outrank plugins unless KILN_PLUGINS_OUTRANK=1", best.kernel);
    } else {
      c.reason = fmt::format("eligible; outranked by {}", best.kernel);
    }
  }
  return ex;
}

std::shared_ptr<const KernelSpec> Registry::select(const Signature& sig, const Platform& platform) {
  const std::string env_name = override_env_name(sig.op());
  const auto env_override = detail::env_string(env_name.c_str());
  const std::string cache_key = platform.arch + '|' + (env_override ? *env_override : "") + '|' + sig.canonical();
  {
    std::shared_lock lock(state_->mutex);
    auto it = state_->decisions.find(cache_key);
    if (it != state_->decisions.end()) return it->second;
  }
  Explanation ex = explain(sig, platform);
  if (!ex.selected) {
    throw Error(ErrorCode::kNoKernel, fmt::format("no kernel for {} on {}\n{}", ex.signature, ex.target, ex.to_text()));
  }
  for (const auto& w : ex.warnings) log(LogLevel::kWarn, w);
  auto spec = find(*ex.selected);
  std::unique_lock lock(state_->mutex);
  state_->decisions.emplace(cache_key, spec);
  return spec;
}

std::string Explanation::to_text() const {
  std::string out = fmt::format("signature {}\ntarget    {}\n", signature, target);
  for (const auto& c : candidates) {
    out +=
        fmt::format("  {} {:<44} {:<11} {}\n", c.selected ? "*" : (c.eligible ? "+" : "-"), c.kernel, priority_name(c.priority), c.reason);
  }
  if (candidates.empty()) out += "  (no kernel of this operator is registered)\n";
  for (const auto& w : warnings) out += "  warning: " + w + "\n";
  out += selected ? "selected: " + *selected + "\n" : "selected: none\n";
  return out;
}

std::string Explanation::to_json() const {
  nlohmann::json j;
  j["signature"] = signature;
  j["target"] = target;
  j["selected"] = selected ? nlohmann::json(*selected) : nlohmann::json(nullptr);
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : candidates) {
    j["candidates"].push_back({{"kernel", c.kernel},
                               {"priority", priority_name(c.priority)},
                               {"eligible", c.eligible},
                               {"selected", c.selected},
                               {"reason", c.reason}});
  }
  j["warnings"] = warnings;
  return j.dump(2);
}

}  // namespace kiln
