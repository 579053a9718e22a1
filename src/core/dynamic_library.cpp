#include "core/dynamic_library.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include "kiln/error.hpp"

namespace kiln::detail {

DynamicLibrary::DynamicLibrary(std::string what, const std::vector<std::string>& candidates) : what_(std::move(what)) {
  std::string tried;
  for (const auto& c : candidates) {
    handle_ = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) {
      path_ = c;
      return;
    }
    const char* err = dlerror();
    tried += fmt::format("\n  {}: {}", c, err ? err : "not found");
  }
  throw Error(ErrorCode::kDriverError, fmt::format("cannot load {}; tried:{}", what_, tried));
}

DynamicLibrary::~DynamicLibrary() {
  // Vendor libraries stay loaded for the life of the process: their state (contexts, modules)
  // may outlive any one owner, and unloading the driver at exit races with its own teardown.
}

void* DynamicLibrary::symbol(const char* name) const {
  dlerror();
  void* sym = dlsym(handle_, name);
  if (sym == nullptr) {
    throw Error(ErrorCode::kDriverError, fmt::format("{} ({}) has no symbol {}: it is too old for kiln", what_, path_, name));
  }
  return sym;
}

OptionalLibrary load_optional_library(std::string what, const std::vector<std::string>& candidates) {
  OptionalLibrary l;
  try {
    l.library = std::make_unique<DynamicLibrary>(std::move(what), candidates);
  } catch (const Error& e) {
    l.failure = e.message();
  }
  return l;
}

}  // namespace kiln::detail
