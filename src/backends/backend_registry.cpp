// The registered backends, the one this process launches on, and detect_devices() over all of them.
#include <algorithm>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "backends/backend.hpp"
#include "backends/plugin_backend.hpp"
#include "kiln/error.hpp"
#include "kiln/registry.hpp"
#include "registry/plugin_loader.hpp"

namespace kiln::detail {
namespace {

struct Registered {
  std::mutex mutex;
  std::vector<std::pair<int, VendorBackend*>> ordered;
  std::vector<VendorBackend*> backends;
};
Registered& registered() {
  static Registered r;
  return r;
}

// Installed before anything can load a plugin: static initialization of this file, which every
// program using a backend links.
const bool plugin_hook_installed = [] {
  set_backend_plugin_hook(&register_backend_plugin);
  return true;
}();

template <typename Match>
VendorBackend& find_backend(Match match, const std::string& what) {
  for (VendorBackend* b : backends()) {
    if (match(*b)) return *b;
  }
  throw Error(ErrorCode::kInternal, fmt::format("no backend for {} is built into this kiln", what));
}

}  // namespace

namespace {

void add_backend(VendorBackend* backend, int order) {
  Registered& r = registered();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.ordered.emplace_back(order, backend);
  std::stable_sort(r.ordered.begin(), r.ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  r.backends.clear();
  for (const auto& entry : r.ordered) r.backends.push_back(entry.second);
}

}  // namespace

BackendRegistrar::BackendRegistrar(VendorBackend* backend, int order) { add_backend(backend, order); }

void register_plugin_backend(VendorBackend* backend) { add_backend(backend, 1000); }

std::vector<VendorBackend*> backends() {
  (void)plugin_hook_installed;
  Registry::global();  // loads KILN_PLUGIN_PATH once, backend plugins among them
  Registered& r = registered();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.backends;
}

VendorBackend& backend_for(Vendor vendor) {
  return find_backend([&](const VendorBackend& b) { return b.vendor() == vendor; }, vendor_name(vendor));
}

VendorBackend& backend_for(Backend kind) {
  return find_backend([&](const VendorBackend& b) { return b.kind() == kind; }, backend_name(kind));
}

VendorBackend& backend_for(CompilerKind compiler) {
  return find_backend([&](const VendorBackend& b) { return b.uses(compiler); }, compiler_kind_name(compiler));
}

VendorBackend& launch_backend() {
  static VendorBackend& chosen = []() -> VendorBackend& {
    std::vector<std::string> reasons;
    for (VendorBackend* b : backends()) {
      try {
        if (b->device_count() > 0) return *b;
        reasons.push_back(fmt::format("{}: no GPU", b->name()));
      } catch (const Error& e) {
        reasons.push_back(fmt::format("{}: {}", b->name(), e.message()));
      }
    }
    throw Error(ErrorCode::kDriverError, fmt::format("no GPU to launch on: {}", fmt::join(reasons, "; ")));
  }();
  return chosen;
}

}  // namespace kiln::detail

namespace kiln {

DeviceReport detect_devices() {
  DeviceReport report;
  for (detail::VendorBackend* b : detail::backends()) b->detect(report);
  return report;
}

}  // namespace kiln
