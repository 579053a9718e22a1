// Whether a path kiln reads code from can be trusted: the cache (kiln.db and its directory), a
// plugin, kernel sources, the compile worker. One rule for all of them.
#pragma once

#include <sys/stat.h>

#include <optional>
#include <string>

namespace kiln::detail {

// Why a file or directory with status `st` may not be trusted, or nullopt: it belongs to a user
// other than this one and root, or other users can write it (a directory with the sticky bit,
// such as /tmp, does not let them replace what is not theirs). `consequence` ends the message:
// what kiln does about it and why.
std::optional<std::string> ownership_problem(const std::string& path, const struct stat& st, bool directory,
                                             const std::string& consequence);

// The same rule with a group trusted as well (a cache shared by a group, KILN_CACHE_SHARED=group):
// what belongs to a group this process is in may belong to any member and be group-writable.
// Other users still may not write it.
std::optional<std::string> group_ownership_problem(const std::string& path, const struct stat& st, bool directory,
                                                   const std::string& consequence);

// Whether this process is in group `gid` (effective or supplementary).
bool in_group(gid_t gid);

// The rule above for `path` (followed through links) and the directory that holds it. `what`
// names the setting in the message: "KILN_PLUGIN_PATH".
std::optional<std::string> untrusted_code_path(const std::string& path, const std::string& what);

}  // namespace kiln::detail
