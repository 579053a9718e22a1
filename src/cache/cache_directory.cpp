#include "cache/cache_directory.hpp"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "core/env.hpp"
#include "core/file_trust.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

std::string default_cache_directory() {
  if (auto dir = env_string("KILN_CACHE_DIR")) return *dir;
  if (auto xdg = env_string("XDG_CACHE_HOME")) return *xdg + "/kiln";
  if (auto home = env_string("HOME")) return *home + "/.cache/kiln";
  return "";
}

std::vector<std::string> default_seed_databases() {
  std::vector<std::string> seeds;
  auto value = env_string("KILN_CACHE_SEED");
  if (!value) return seeds;
  std::stringstream ss(*value);
  std::string entry;
  while (std::getline(ss, entry, ':')) {
    if (entry.empty()) continue;
    std::error_code ec;
    seeds.push_back(std::filesystem::is_directory(entry, ec) ? entry + "/kiln.db" : entry);
  }
  return seeds;
}

CacheSharing cache_sharing() {
  const auto value = env_string("KILN_CACHE_SHARED");
  if (!value || *value == "user") return CacheSharing::kUser;
  if (*value == "group") return CacheSharing::kGroup;
  throw Error(ErrorCode::kInvalidArgument, fmt::format("KILN_CACHE_SHARED='{}' must be 'user' or 'group'", *value));
}

unsigned cache_directory_mode() { return cache_sharing() == CacheSharing::kGroup ? 02770 : 0700; }
unsigned cache_file_mode() { return cache_sharing() == CacheSharing::kGroup ? 0660 : 0600; }

namespace {

// The rule for cache files and directories under the sharing policy, and what a refusal says.
std::optional<std::string> cache_ownership_problem(const std::string& path, const struct stat& st, bool directory, const char* subject) {
  if (cache_sharing() == CacheSharing::kGroup) {
    return group_ownership_problem(path, st, directory,
                                   fmt::format("{}; KILN_CACHE_SHARED=group trusts the members of a group this process is in, "
                                               "never other users: chmod o-w it",
                                               subject));
  }
  return ownership_problem(path, st, directory,
                           fmt::format("{}: chmod go-w it, use another KILN_CACHE_DIR, or share it with a group through "
                                       "KILN_CACHE_SHARED=group",
                                       subject));
}

}  // namespace

std::optional<std::string> unsafe_reason(const std::string& path, bool is_directory) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;  // absent: nothing to trust yet
  if (S_ISLNK(st.st_mode)) {
    if (!is_directory) return fmt::format("{} is a symbolic link; kiln does not follow links out of its cache", path);
    if (::stat(path.c_str(), &st) != 0) return fmt::format("{} is a dangling symbolic link", path);
  }
  if (is_directory && !S_ISDIR(st.st_mode)) return fmt::format("{} is not a directory", path);
  if (!is_directory && !S_ISREG(st.st_mode)) return fmt::format("{} is not a regular file", path);
  return cache_ownership_problem(path, st, false, "a cache holds code that runs on the GPU, so kiln uses only what it can trust");
}

std::optional<std::string> prepare_cache_directory(const std::string& directory, bool create) {
  if (directory.empty()) return "no cache directory: set KILN_CACHE_DIR, XDG_CACHE_HOME or HOME";
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(directory, ec)) {
    if (!create) return fmt::format("{} does not exist", directory);
    // Create each missing component with mode 0700.
    fs::path built;
    for (const auto& part : fs::path(directory)) {
      built /= part;
      if (fs::exists(built, ec)) continue;
      if (::mkdir(built.c_str(), cache_directory_mode()) != 0 && errno != EEXIST) {
        return fmt::format("cannot create {}: {}", built.string(), std::strerror(errno));
      }
      ::chmod(built.c_str(), cache_directory_mode());  // whatever the umask took off
    }
  }
  if (auto why = unsafe_reason(directory, true)) return why;
  // The directory that holds the cache: whoever can write it can swap the cache for another.
  const fs::path absolute = fs::absolute(directory, ec);
  if (ec) return fmt::format("{}: {}", directory, ec.message());
  const fs::path canonical = fs::weakly_canonical(absolute, ec);
  if (!ec && canonical == canonical.root_path()) {
    return fmt::format("{} is the root directory; kiln keeps its cache (kiln.db, locks) in a directory of its own", directory);
  }
  const fs::path parent = (ec ? absolute : canonical).parent_path();
  struct stat st {};
  if (!parent.empty() && ::stat(parent.c_str(), &st) == 0) {
    if (auto why = cache_ownership_problem(parent.string(), st, true,
                                           "whoever can write the directory that holds the cache can replace the cache")) {
      return why;
    }
  }
  return std::nullopt;
}

bool is_network_filesystem_magic(long magic) {
  switch (static_cast<unsigned long>(magic) & 0xffffffffUL) {
    case 0x6969UL:      // NFS
    case 0x0bd00bd0UL:  // Lustre
    case 0x47504653UL:  // GPFS
    case 0xff534d42UL:  // CIFS
    case 0xfe534d42UL:  // SMB2
    case 0x517bUL:      // SMB
    case 0x65735546UL:  // FUSE (sshfs, many cluster filesystems)
    case 0x00c36400UL:  // CephFS
    case 0x013111a8UL:  // IBRIX
    case 0x19830326UL:  // BeeGFS
      return true;
    default: return false;
  }
}

bool is_network_filesystem(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) return false;
  return is_network_filesystem_magic(static_cast<long>(fs.f_type));
}

}  // namespace kiln::detail
