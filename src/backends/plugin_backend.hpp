// Backends that shared libraries bring (include/kiln/backend_plugin.h): the C table adapted to
// the backend interface, so everything above src/backends/ treats them as it treats CUDA and HIP.
#pragma once

#include <string>

namespace kiln::detail {

// Checks the table kiln_backend_plugin_entry (at `entry`) returns, then registers its vendor,
// targets and backend. Throws kiln::Error(kPluginError) naming `origin` and the problem; nothing
// is registered then.
void register_backend_plugin(const std::string& origin, void* entry);

}  // namespace kiln::detail
