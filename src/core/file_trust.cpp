#include "core/file_trust.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

namespace kiln::detail {
namespace {

std::optional<std::string> owner_or_mode_problem(const std::string& path, const struct stat& st, bool directory, const std::string& what) {
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return fmt::format("{}: {} belongs to user id {}, not to this user ({}) or root; kiln runs only code it can trust", what, path,
                       st.st_uid, me);
  }
  const bool sticky = directory && (st.st_mode & S_ISVTX) != 0;
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !sticky) {
    return fmt::format("{}: {} is writable by other users (mode {:o}); kiln runs only code it can trust: chmod go-w it", what, path,
                       st.st_mode & 07777);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> untrusted_code_path(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;  // absent: whoever opens it reports that
  const bool directory = S_ISDIR(st.st_mode);
  if (auto why = owner_or_mode_problem(path, st, directory, what)) return why;
  std::error_code ec;
  const std::string parent = std::filesystem::absolute(path, ec).parent_path().string();
  if (ec || parent.empty()) return std::nullopt;
  struct stat dir {};
  if (::stat(parent.c_str(), &dir) != 0) return std::nullopt;
  return owner_or_mode_problem(parent, dir, true, what);
}

}  // namespace kiln::detail
