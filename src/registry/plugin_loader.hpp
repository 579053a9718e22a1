// Registration of a plugin's kernels, separate from dlopen() so it can be tested and fuzzed with
// any kiln_plugin contents.
#pragma once

#include <string>

#include "kiln/plugin.h"
#include "kiln/registry.hpp"

namespace kiln::detail {

// Checks the ABI version and every kernel's metadata, then registers all of them or none.
// Throws kiln::Error(kPluginError) naming `origin` and the problem.
void register_plugin(const std::string& origin, const kiln_plugin* plugin, Registry& registry);

// Registers the backend of a library exporting kiln_backend_plugin_entry (`entry`, the symbol's
// address), before its kernels are read. The backends layer installs it (a layer above this one);
// throws kiln::Error(kPluginError) naming `origin` and the problem.
using BackendPluginHook = void (*)(const std::string& origin, void* entry);
void set_backend_plugin_hook(BackendPluginHook hook);

}  // namespace kiln::detail
