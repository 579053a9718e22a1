#include "jit/sources.hpp"

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/embedded_file.hpp"
#include "core/env.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

// Generated at build time from kernel-sources/ (cmake/embed_files.cmake).
extern const EmbeddedFile kEmbeddedKernelSources[];
extern const unsigned long kEmbeddedKernelSourcesCount;

std::vector<std::string> embedded_kernel_files() {
  std::vector<std::string> names;
  for (unsigned long i = 0; i < kEmbeddedKernelSourcesCount; ++i) names.emplace_back(kEmbeddedKernelSources[i].name);
  return names;
}

std::string read_kernel_file(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.find("..") != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("kernel source '{}': must be a relative path inside kernel-sources/", name));
  }
  if (auto dir = env_string("KILN_KERNEL_SOURCES")) {
    const std::string path = *dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("kernel source '{}' not found at {} (KILN_KERNEL_SOURCES={})", name, path, *dir));
    }
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  for (unsigned long i = 0; i < kEmbeddedKernelSourcesCount; ++i) {
    const EmbeddedFile& f = kEmbeddedKernelSources[i];
    if (name == f.name) return std::string(reinterpret_cast<const char*>(f.data), f.size);
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("kernel source '{}' is not embedded in this libkiln (set KILN_KERNEL_SOURCES to a "
                          "kernel-sources/ directory to use one from disk)", name));
}

SourceSet resolve_includes(const std::string& origin, std::string text) {
  static const std::regex include_line(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  SourceSet set;
  std::map<std::string, std::string> headers;
  std::vector<std::pair<std::string, std::string>> pending = {{origin, text}};
  while (!pending.empty()) {
    auto [from, body] = std::move(pending.back());
    pending.pop_back();
    std::istringstream lines(body);
    std::string line;
    while (std::getline(lines, line)) {
      std::smatch m;
      if (!std::regex_search(line, m, include_line)) continue;
      if (m[1] == "<") {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("kernel source {}: '#include <{}>' is not allowed; kernels include only "
                                "kernel-sources/ headers, written \"like/this.cuh\"", from, m[2].str()));
      }
      const std::string name = m[2];
      if (headers.count(name)) continue;
      headers[name] = read_kernel_file(name);
      pending.emplace_back(name, headers[name]);
    }
  }
  set.main_text = std::move(text);
  set.headers.assign(headers.begin(), headers.end());
  return set;
}

}  // namespace kiln::detail
