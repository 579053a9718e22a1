#include "core/file_trust.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

namespace kiln::detail {

std::optional<std::string> ownership_problem(const std::string& path, const struct stat& st, bool directory,
                                             const std::string& consequence) {
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return fmt::format("{} belongs to user id {}, not to this user ({}) or root; {}", path, st.st_uid, me, consequence);
  }
  const bool sticky = directory && (st.st_mode & S_ISVTX) != 0;
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !sticky) {
    return fmt::format("{} is writable by other users (mode {:o}); {}", path, st.st_mode & 07777, consequence);
  }
  return std::nullopt;
}

bool in_group(gid_t gid) {
  if (gid == ::getegid()) return true;
  const int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  const int got = ::getgroups(n, groups.data());
  return got > 0 && std::find(groups.begin(), groups.begin() + got, gid) != groups.begin() + got;
}

std::optional<std::string> group_ownership_problem(const std::string& path, const struct stat& st, bool directory,
                                                   const std::string& consequence) {
  if (!in_group(st.st_gid)) return ownership_problem(path, st, directory, consequence);
  const bool sticky = directory && (st.st_mode & S_ISVTX) != 0;
  if ((st.st_mode & S_IWOTH) != 0 && !sticky) {
    return fmt::format("{} is writable by users outside its group (mode {:o}); {}", path, st.st_mode & 07777, consequence);
  }
  return std::nullopt;
}

std::optional<std::string> untrusted_code_path(const std::string& path, const std::string& what) {
  const std::string consequence = "kiln runs only code it can trust: chmod go-w it, or chown it";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;  // absent: whoever opens it reports that
  if (auto why = ownership_problem(path, st, S_ISDIR(st.st_mode), consequence)) return what + ": " + *why;
  std::error_code ec;
  const std::string parent = std::filesystem::absolute(path, ec).parent_path().string();
  if (ec || parent.empty()) return std::nullopt;
  struct stat dir {};
  if (::stat(parent.c_str(), &dir) != 0) return std::nullopt;
  if (auto why = ownership_problem(parent, dir, true, consequence)) return what + ": " + *why;
  return std::nullopt;
}

}  // namespace kiln::detail
