// A private folder under the temporary directory ($TMPDIR), removed with everything in it on every
// path out of its scope.
#pragma once

#include <filesystem>
#include <string>

namespace kiln::detail {

class TemporaryFolder {
 public:
  // "<tmp>/<prefix>-XXXXXX". Throws kiln::Error(kCompileFailed) when it cannot be created.
  explicit TemporaryFolder(const std::string& prefix);
  ~TemporaryFolder();
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace kiln::detail
