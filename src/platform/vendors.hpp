// Vendors and targets that backend plugins bring (include/kiln/backend_plugin.h). Vendor is an
// open enumeration: kNvidia and kAmd are kiln's, and each backend plugin gets the next number from
// kFirstPluginVendor; its backend's and compiler's tags take the same number.
#pragma once

#include <optional>
#include <string>

#include "kiln/platform.hpp"

namespace kiln::detail {

inline constexpr int kFirstPluginVendor = 100;

// A vendor of a backend plugin: its name (kernels name it), what its multiprocessors are called,
// and its compiler's name. Throws kiln::Error(kInvalidArgument) when the name is taken.
Vendor add_vendor(const std::string& name, const std::string& compute_unit_name, const std::string& compiler_name);
std::optional<Vendor> vendor_named(const std::string& name);
bool is_plugin_vendor(Vendor vendor);
const char* plugin_compiler_name(Vendor vendor);
// Installed by the registry layer: loads KILN_PLUGIN_PATH once (a no-op while it is loading), so
// that platform_for_target() and known_targets() know the targets of backend plugins.
void set_plugin_loader(void (*load)());

// A target of a plugin vendor for platform_for_target() and known_targets(). Throws
// kiln::Error(kInvalidArgument) when the arch is taken.
void add_target(const Platform& target);

}  // namespace kiln::detail
