// dlopen of vendor libraries at first use, so libkiln loads on machines without them and says
// exactly which library or symbol is missing only when it is needed.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace kiln::detail {

class DynamicLibrary {
 public:
  // Tries each candidate (a soname or a path) in order; throws kiln::Error(kDriverError) naming
  // `what`, every candidate tried and dlerror() of each when none loads.
  DynamicLibrary(std::string what, const std::vector<std::string>& candidates);
  ~DynamicLibrary();
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  // Throws kiln::Error(kDriverError) naming the symbol and the library when it is absent.
  void* symbol(const char* name) const;
  const std::string& path() const { return path_; }

 private:
  std::string what_;
  std::string path_;
  void* handle_ = nullptr;
};

// A vendor library that may be absent, loaded once: the library, or the reason none of the
// candidates loaded, so every later use reports the same reason quickly.
struct OptionalLibrary {
  std::unique_ptr<DynamicLibrary> library;
  std::string failure;
};
OptionalLibrary load_optional_library(std::string what, const std::vector<std::string>& candidates);

}  // namespace kiln::detail
