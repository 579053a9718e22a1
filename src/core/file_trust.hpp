// Whether a file kiln loads or runs as code (a plugin, kernel sources, the compile worker) can be
// trusted: the cache's rule, applied to every other place code comes from.
#pragma once

#include <optional>
#include <string>

namespace kiln::detail {

// Why `path` (followed through links) may not be trusted, or nullopt: it, or the directory that
// holds it, belongs to a user other than this one and root, or can be written by other users (a
// directory with the sticky bit, such as /tmp, does not let them replace what is not theirs).
// `what` names the setting in the message: "KILN_PLUGIN_PATH".
std::optional<std::string> untrusted_code_path(const std::string& path, const std::string& what);

}  // namespace kiln::detail
