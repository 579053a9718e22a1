#include "core/temporary_folder.hpp"

#include <stdlib.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "kiln/error.hpp"

namespace kiln::detail {

TemporaryFolder::TemporaryFolder(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) {
    throw Error(ErrorCode::kCompileFailed, fmt::format("cannot create a temporary folder {}: {}", pattern, strerror(errno)));
  }
  path_ = pattern;
}

TemporaryFolder::~TemporaryFolder() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace kiln::detail
