// Kernel sources as the compiler sees them: embedded in libkiln at build time, or read from
// $KILN_KERNEL_SOURCES (a kernel-sources/ directory) for kernel development without a rebuild.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kiln::detail {

struct SourceSet {
  std::string main_text;
  // Every file the main text includes, transitively: include name -> text, sorted by name.
  std::vector<std::pair<std::string, std::string>> headers;
};

// The text of one file under kernel-sources/ ("attention/params.h"). Throws kiln::Error naming
// the file and where it looked.
std::string read_kernel_file(const std::string& name);

// `text` plus the closure of its `#include "..."` lines, resolved against kernel-sources/.
// Includes are written relative to kernel-sources/; angle-bracket includes are refused, since
// kernels must not depend on toolkit headers.
SourceSet resolve_includes(const std::string& origin, std::string text);

// The names of every embedded file (for tests and `kiln list --sources`).
std::vector<std::string> embedded_kernel_files();

}  // namespace kiln::detail
