// Out-of-tree kernels: shared libraries exporting kiln_plugin_entry (kiln/plugin.h).
#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/env.hpp"
#include "core/file_trust.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "kiln/plugin.h"
#include "kiln/registry.hpp"
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

KernelSpec spec_from_plugin(const std::string& path, const kiln_plugin_kernel& k, uint32_t index) {
  auto field = [&](const char* value, const char* what) {
    if (value == nullptr || *value == '\0') {
      throw plugin_error(path, fmt::format("kernel #{}: {} is missing", index, what));
    }
    return std::string(value);
  };
  KernelSpec spec;
  spec.name = field(k.name, "name");
  spec.family = field(k.family, "family");
  spec.mode = field(k.mode, "mode");
  const std::string op_name = operator_name({spec.family, spec.mode});
  if (op_name.find('.') != std::string::npos) {
    throw plugin_error(path, fmt::format("kernel '{}': family/mode '{}.{}' is no kiln operator", spec.name, spec.family, spec.mode));
  }
  const std::string vendor = field(k.vendor, "vendor");
  if (vendor == "nvidia") {
    spec.requirements.vendor = Vendor::kNvidia;
    spec.backend = Backend::kCuda;
  } else if (vendor == "amd") {
    spec.requirements.vendor = Vendor::kAmd;
    spec.backend = Backend::kHip;
  } else {
    throw plugin_error(path, fmt::format("kernel '{}': vendor '{}' is not nvidia or amd", spec.name, vendor));
  }
  if (k.min_arch > 0) spec.requirements.min_arch = k.min_arch;
  if (k.max_arch > 0) spec.requirements.max_arch = k.max_arch;
  if (k.features != nullptr) spec.requirements.features = split(k.features, ',');
  if (k.priority < 0 || k.priority > static_cast<int>(Priority::kPlugin)) {
    throw plugin_error(path, fmt::format("kernel '{}': priority {} is outside 0..4", spec.name, k.priority));
  }
  spec.priority = static_cast<Priority>(k.priority);
  spec.specificity = k.specificity;
  spec.source = field(k.source, "source");
  spec.source_is_text = true;
  const std::string name_expression = field(k.name_expression, "name_expression");
  if (k.accepts == nullptr) throw plugin_error(path, fmt::format("kernel '{}': accepts is missing", spec.name));
  auto accepts = k.accepts;
  spec.accepts = [accepts](const Signature& sig) -> std::optional<std::string> {
    char reason[512] = {0};
    if (accepts(sig.canonical().c_str(), reason, sizeof(reason)) == 1) return std::nullopt;
    reason[sizeof(reason) - 1] = '\0';
    return std::string(reason[0] ? reason : "refused by plugin (no reason given)");
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
  spec.origin = path;
  return spec;
}

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

void register_plugin(const std::string& origin, const kiln_plugin* plugin, Registry& registry) {
  if (plugin == nullptr) throw plugin_error(origin, "kiln_plugin_entry returned NULL");
  if (plugin->abi_version != KILN_PLUGIN_ABI_VERSION) {
    throw plugin_error(
        origin, fmt::format("built for plugin ABI version {}, this kiln speaks version {}", plugin->abi_version, KILN_PLUGIN_ABI_VERSION));
  }
  if (plugin->num_kernels > 0 && plugin->kernels == nullptr) throw plugin_error(origin, "num_kernels > 0 but kernels is NULL");
  // Convert and check every kernel before registering any, so a bad plugin adds nothing.
  std::vector<KernelSpec> specs;
  std::set<std::string> names;
  for (uint32_t i = 0; i < plugin->num_kernels; ++i) {
    specs.push_back(spec_from_plugin(origin, plugin->kernels[i], i));
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
  try {
    if (entry == nullptr) throw plugin_error(path, "does not export kiln_plugin_entry");
    const kiln_plugin* plugin = entry();
    detail::register_plugin(path, plugin, detail::registry_instance());
    log(LogLevel::kInfo,
        fmt::format("loaded plugin '{}' from {} ({} kernels)", plugin->name ? plugin->name : "?", path, plugin->num_kernels));
  } catch (...) {
    dlclose(handle);  // nothing of it was registered
    throw;
  }
  // Never closed once registered: the kernels' accepts() and launch_shape() live in it.
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
