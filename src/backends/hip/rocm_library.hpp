// Where kiln looks for a ROCm library.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "core/env.hpp"

namespace kiln::detail::hip {

// Exactly the file `override_variable` names when it is set; else each soname in turn under
// ROCM_PATH/lib, /opt/rocm/lib, then on the loader's search path.
inline std::vector<std::string> rocm_library_candidates(const char* override_variable, std::initializer_list<const char*> sonames) {
  if (auto path = env_string(override_variable)) return {*path};
  std::vector<std::string> dirs;
  if (auto root = env_string("ROCM_PATH")) dirs.push_back(*root + "/lib/");
  dirs.push_back("/opt/rocm/lib/");
  dirs.push_back("");
  std::vector<std::string> candidates;
  for (const char* soname : sonames) {
    for (const auto& dir : dirs) candidates.push_back(dir + soname);
  }
  return candidates;
}

}  // namespace kiln::detail::hip
