// Out-of-tree kernels: shared libraries exporting kiln_plugin_entry (kiln/plugin.h).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/env.hpp"
#include "core/file_trust.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "kiln/plugin.h"
#include "kiln/registry.hpp"
#include "platform/vendors.hpp"
#include "registry/plugin_loader.hpp"

namespace kiln {
namespace detail {
Registry& registry_instance();
}  // namespace detail

namespace {

Error plugin_error(const std::string& path, const std::string& what) {
  return Error(ErrorCode::kPluginError, fmt::format("plugin {}: {}", path, what));
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, sep)) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// The fields every ABI version's kernels share, checked the same way.
struct KernelFields {
  const char *name, *family, *mode, *vendor;
  int32_t min_arch, max_arch;
  const char* features;
  int32_t priority, specificity;
  const char* source;
};

std::string required(const std::string& path, const char* value, uint32_t index, const char* what) {
  if (value == nullptr || *value == '\0') throw plugin_error(path, fmt::format("kernel #{}: {} is missing", index, what));
  return value;
}

KernelSpec spec_from_fields(const std::string& path, const KernelFields& k, uint32_t index) {
  KernelSpec spec;
  spec.name = required(path, k.name, index, "name");
  spec.family = required(path, k.family, index, "family");
  spec.mode = required(path, k.mode, index, "mode");
  const std::string op_name = operator_name({spec.family, spec.mode});
  if (op_name.find('.') != std::string::npos) {
    throw plugin_error(path, fmt::format("kernel '{}': family/mode '{}.{}' is no kiln operator", spec.name, spec.family, spec.mode));
  }
  const std::string vendor = required(path, k.vendor, index, "vendor");
  if (vendor == "nvidia") {
    spec.requirements.vendor = Vendor::kNvidia;
    spec.backend = Backend::kCuda;
  } else if (vendor == "amd") {
    spec.requirements.vendor = Vendor::kAmd;
    spec.backend = Backend::kHip;
  } else if (auto plugin_vendor = detail::vendor_named(vendor)) {
    spec.requirements.vendor = *plugin_vendor;  // a backend plugin's: its backend has its number
    spec.backend = static_cast<Backend>(*plugin_vendor);
  } else {
    throw plugin_error(path, fmt::format("kernel '{}': vendor '{}' is not nvidia, amd or a loaded backend plugin's", spec.name, vendor));
  }
  if (k.min_arch > 0) spec.requirements.min_arch = k.min_arch;
  if (k.max_arch > 0) spec.requirements.max_arch = k.max_arch;
  if (k.features != nullptr) spec.requirements.features = split(k.features, ',');
  if (k.priority < 0 || k.priority > static_cast<int>(Priority::kPlugin)) {
    throw plugin_error(path, fmt::format("kernel '{}': priority {} is outside 0..4", spec.name, k.priority));
  }
  spec.priority = static_cast<Priority>(k.priority);
  spec.specificity = k.specificity;
  spec.source = required(path, k.source, index, "source");
  spec.source_is_text = true;
  spec.origin = path;
  return spec;
}

using AcceptsFn = int (*)(const char*, char*, size_t);

std::optional<std::string> ask_accepts(AcceptsFn accepts, const Signature& sig) {
  char reason[512] = {0};
  if (accepts(sig.canonical().c_str(), reason, sizeof(reason)) == 1) return std::nullopt;
  reason[sizeof(reason) - 1] = '\0';
  return std::string(reason[0] ? reason : "refused by plugin (no reason given)");
}

// Properties a call carries only when it opts into other numerics (moe_apply's act_dtype=e4m3,
// W4A8). A plugin kernel written before them would otherwise take such a call and compute the
// default numerics silently: it runs one only where its constraints name the property.
std::optional<std::string> undeclared_opt_in(const Signature& sig, const std::set<std::string>& constrained) {
  for (const char* key : {"act_dtype"}) {
    if (sig.has(key) && !constrained.count(key)) {
      return fmt::format("{}={} needs a kernel whose signature constraints name {}", key, sig.get(key), key);
    }
  }
  return std::nullopt;
}

KernelSpec spec_from_plugin(const std::string& path, const kiln_plugin_kernel& k, uint32_t index) {
  KernelSpec spec = spec_from_fields(
      path, {k.name, k.family, k.mode, k.vendor, k.min_arch, k.max_arch, k.features, k.priority, k.specificity, k.source}, index);
  const std::string name_expression = required(path, k.name_expression, index, "name_expression");
  if (k.accepts == nullptr) throw plugin_error(path, fmt::format("kernel '{}': accepts is missing", spec.name));
  spec.accepts = [accepts = k.accepts](const Signature& sig) -> std::optional<std::string> {
    if (auto why = undeclared_opt_in(sig, {})) return why;
    return ask_accepts(accepts, sig);
  };
  if (k.launch_shape == nullptr) throw plugin_error(path, fmt::format("kernel '{}': launch_shape is missing", spec.name));
  auto launch_shape = k.launch_shape;
  const std::string kernel_name = spec.name;
  spec.launch_shape = [launch_shape, kernel_name](const void* params, const Platform& platform) {
    LaunchShape shape;
    if (launch_shape(params, platform.arch.c_str(), shape.grid, shape.block, &shape.dynamic_shared_bytes) != 0) {
      throw Error(ErrorCode::kUnsupported, fmt::format("plugin kernel '{}' declined this call's launch on {}", kernel_name, platform.arch));
    }
    return shape;
  };
  spec.specialize = [name_expression](const Signature&, const Platform&) { return Specialization{name_expression, {}}; };
  return spec;
}

// A version 2 kernel's accepted signatures: each constraint a property and the values it may take.
using SignatureConstraints = std::vector<std::pair<std::string, std::set<std::string>>>;

SignatureConstraints parse_constraints(const std::string& path, const std::string& kernel, const char* text) {
  SignatureConstraints constraints;
  if (text == nullptr) return constraints;
  for (const std::string& item : split(text, ';')) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (eq == std::string::npos || key.empty() || eq + 1 == item.size()) {
      throw plugin_error(path, fmt::format("kernel '{}': signatures: '{}' is not property=value|value...", kernel, item));
    }
    const auto values = split(item.substr(eq + 1), '|');
    constraints.emplace_back(key, std::set<std::string>(values.begin(), values.end()));
  }
  return constraints;
}

// Why the signature breaks a constraint, or nullopt. The canonical text is op:key=value,...
std::optional<std::string> constraint_problem(const SignatureConstraints& constraints, const Signature& sig) {
  const std::string canonical = sig.canonical();
  std::map<std::string, std::string> properties;
  for (const std::string& item : split(canonical.substr(canonical.find(':') + 1), ',')) {
    const size_t eq = item.find('=');
    if (eq != std::string::npos) properties[item.substr(0, eq)] = item.substr(eq + 1);
  }
  for (const auto& [key, values] : constraints) {
    const auto it = properties.find(key);
    if (it == properties.end()) return fmt::format("the signature has no property '{}' (the plugin's constraint)", key);
    if (!values.count(it->second)) {
      return fmt::format("{}={} is not one of the plugin's {}={}", key, it->second, key, fmt::join(values, "|"));
    }
  }
  return std::nullopt;
}

KernelSpec spec_from_plugin_v2(const std::string& path, const kiln_plugin_kernel_v2& k, uint32_t index) {
  KernelSpec spec = spec_from_fields(
      path, {k.name, k.family, k.mode, k.vendor, k.min_arch, k.max_arch, k.features, k.priority, k.specificity, k.source}, index);
  const std::string kernel_name = spec.name;
  const SignatureConstraints constraints = parse_constraints(path, kernel_name, k.signatures);
  std::set<std::string> constrained;
  for (const auto& constraint : constraints) constrained.insert(constraint.first);
  spec.accepts = [constraints, constrained, accepts = k.accepts](const Signature& sig) -> std::optional<std::string> {
    if (auto why = undeclared_opt_in(sig, constrained)) return why;
    if (auto why = constraint_problem(constraints, sig)) return why;
    return accepts != nullptr ? ask_accepts(accepts, sig) : std::nullopt;
  };
  if (k.specialize == nullptr) {
    const std::string name_expression = required(path, k.name_expression, index, "name_expression (or specialize)");
    spec.specialize = [name_expression](const Signature&, const Platform&) { return Specialization{name_expression, {}}; };
  } else {
    spec.specialize = [specialize = k.specialize, kernel_name](const Signature& sig, const Platform& platform) {
      std::vector<char> name(1024, '\0'), options(4096, '\0');
      if (specialize(sig.canonical().c_str(), platform.arch.c_str(), name.data(), name.size(), options.data(), options.size()) != 0) {
        name.back() = '\0';
        throw Error(ErrorCode::kUnsupported, fmt::format("plugin kernel '{}' cannot specialize '{}' for {}: {}", kernel_name,
                                                         sig.canonical(), platform.arch, name[0] ? name.data() : "no reason given"));
      }
      name.back() = '\0';
      options.back() = '\0';
      Specialization s{name.data(), {}};
      if (s.name_expression.empty()) {
        throw Error(ErrorCode::kPluginError, fmt::format("plugin kernel '{}': specialize returned an empty name expression", kernel_name));
      }
      for (std::string line : split(options.data(), '\n')) {
        line.erase(line.find_last_not_of(" \t\r") + 1);
        if (!line.empty()) s.options.push_back(line);
      }
      return s;
    };
  }
  if (k.workspace_bytes != nullptr) {
    spec.workspace_bytes = [workspace = k.workspace_bytes](const void* params, const Platform& platform) {
      return static_cast<size_t>(workspace(params, platform.arch.c_str()));
    };
  }
  if (k.launch == nullptr) throw plugin_error(path, fmt::format("kernel '{}': launch is missing", kernel_name));
  spec.launch_shape = [launch = k.launch, kernel_name](const void* params, const Platform& platform) {
    kiln_plugin_launch l{{1, 1, 1}, {1, 1, 1}, 0, {0, 0, 0}, 0};
    if (launch(params, platform.arch.c_str(), &l) != 0) {
      throw Error(ErrorCode::kUnsupported, fmt::format("plugin kernel '{}' declined this call's launch on {}", kernel_name, platform.arch));
    }
    LaunchShape shape;
    for (int i = 0; i < 3; ++i) {
      shape.grid[i] = l.grid[i];
      shape.block[i] = l.block[i];
      shape.cluster[i] = l.cluster[i];
    }
    shape.dynamic_shared_bytes = l.dynamic_shared_bytes;
    shape.cooperative = l.cooperative != 0;
    return shape;
  };
  return spec;
}

std::atomic<detail::BackendPluginHook> backend_plugin_hook{nullptr};

std::mutex& loaded_mutex() {
  static std::mutex m;
  return m;
}
std::set<std::string>& loaded_paths() {
  static std::set<std::string> paths;
  return paths;
}

}  // namespace

namespace detail {

void set_backend_plugin_hook(BackendPluginHook hook) { backend_plugin_hook.store(hook); }

void register_plugin(const std::string& origin, const kiln_plugin* plugin, Registry& registry) {
  if (plugin == nullptr) throw plugin_error(origin, "kiln_plugin_entry returned NULL");
  if (plugin->abi_version < KILN_PLUGIN_ABI_MIN_VERSION || plugin->abi_version > KILN_PLUGIN_ABI_VERSION) {
    throw plugin_error(origin, fmt::format("built for plugin ABI version {}, this kiln speaks versions {} to {}", plugin->abi_version,
                                           KILN_PLUGIN_ABI_MIN_VERSION, KILN_PLUGIN_ABI_VERSION));
  }
  // A version 1 plugin's struct ends before kernels_v2: it is not read.
  const bool v2 = plugin->abi_version >= 2;
  if (plugin->num_kernels > 0 && (v2 ? plugin->kernels_v2 == nullptr : plugin->kernels == nullptr)) {
    throw plugin_error(origin, fmt::format("num_kernels > 0 but {} is NULL", v2 ? "kernels_v2" : "kernels"));
  }
  // Convert and check every kernel before registering any, so a bad plugin adds nothing.
  std::vector<KernelSpec> specs;
  std::set<std::string> names;
  for (uint32_t i = 0; i < plugin->num_kernels; ++i) {
    specs.push_back(v2 ? spec_from_plugin_v2(origin, plugin->kernels_v2[i], i) : spec_from_plugin(origin, plugin->kernels[i], i));
    if (!names.insert(specs.back().name).second || registry.find(specs.back().name) != nullptr) {
      throw plugin_error(origin, fmt::format("kernel name '{}' is already taken", specs.back().name));
    }
  }
  for (auto& spec : specs) {
    try {
      registry.add(std::move(spec));
    } catch (const Error& e) {
      throw plugin_error(origin, e.message());
    }
  }
}

}  // namespace detail

void load_plugin(const std::string& path) {
  // dlopen("") returns the main program, whose symbols are no plugin.
  if (path.empty()) throw plugin_error(path, "the path is empty");
  // A plugin runs inside the process and its kernels on the GPU: the cache's trust rules apply.
  if (auto why = detail::untrusted_code_path(path, "plugin")) throw plugin_error(path, *why);
  std::error_code ec;
  const std::string canonical = std::filesystem::weakly_canonical(path, ec).string();
  std::lock_guard<std::mutex> lock(loaded_mutex());
  if (loaded_paths().count(canonical)) return;  // loading twice would duplicate kernel names

  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) throw plugin_error(path, std::string("dlopen failed: ") + dlerror());
  auto entry = reinterpret_cast<kiln_plugin_entry_fn>(dlsym(handle, "kiln_plugin_entry"));
  void* backend_entry = dlsym(handle, "kiln_backend_plugin_entry");
  bool backend_registered = false;
  try {
    if (entry == nullptr && backend_entry == nullptr)
      throw plugin_error(path, "exports neither kiln_plugin_entry nor kiln_backend_plugin_entry");
    // The backend first: the library's kernels name it as their vendor.
    if (backend_entry != nullptr) {
      const detail::BackendPluginHook hook = backend_plugin_hook.load();
      if (hook == nullptr) throw plugin_error(path, "this kiln was built without backend plugin support");
      hook(path, backend_entry);
      backend_registered = true;
    }
    if (entry != nullptr) {
      const kiln_plugin* plugin = entry();
      detail::register_plugin(path, plugin, detail::registry_instance());
      log(LogLevel::kInfo,
          fmt::format("loaded plugin '{}' from {} ({} kernels)", plugin->name ? plugin->name : "?", path, plugin->num_kernels));
    }
  } catch (...) {
    if (!backend_registered) dlclose(handle);  // nothing of it was registered; a registered backend lives in it
    if (backend_registered) loaded_paths().insert(canonical);
    throw;
  }
  // Never closed once registered: the kernels' callbacks live in it.
  loaded_paths().insert(canonical);
}

std::vector<std::string> load_plugins_from_env() {
  std::vector<std::string> refused;
  auto value = detail::env_string("KILN_PLUGIN_PATH");
  if (!value) return refused;
  for (const auto& entry : split(*value, ':')) {
    std::vector<std::string> files;
    std::error_code ec;
    if (std::filesystem::is_directory(entry, ec)) {
      for (const auto& f : std::filesystem::directory_iterator(entry, ec)) {
        if (f.path().extension() == ".so") files.push_back(f.path().string());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(entry);
    }
    for (const auto& f : files) {
      try {
        load_plugin(f);
      } catch (const Error& e) {
        refused.emplace_back(e.what());
      }
    }
  }
  return refused;
}

}  // namespace kiln
