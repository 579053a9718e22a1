#include "jit/sources.hpp"

#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/embedded_file.hpp"
#include "core/env.hpp"
#include "core/file_trust.hpp"
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
    throw Error(ErrorCode::kInvalidArgument, fmt::format("kernel source '{}': must be a relative path inside kernel-sources/", name));
  }
  if (auto dir = env_string("KILN_KERNEL_SOURCES")) {
    if (auto why = untrusted_code_path(*dir, "KILN_KERNEL_SOURCES")) throw Error(ErrorCode::kInvalidArgument, *why);
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
  throw Error(ErrorCode::kInvalidArgument, fmt::format("kernel source '{}' is not embedded in this libkiln (set KILN_KERNEL_SOURCES to a "
                                                       "kernel-sources/ directory to use one from disk)",
                                                       name));
}

namespace {

// For a line `#include "name"` (or <name>): the delimiter ('"' or '<') and the name.
std::optional<std::pair<char, std::string>> include_of(const std::string& line) {
  size_t i = line.find_first_not_of(" \t");
  if (i == std::string::npos || line[i] != '#') return std::nullopt;
  i = line.find_first_not_of(" \t", i + 1);
  if (i == std::string::npos || line.compare(i, 7, "include") != 0) return std::nullopt;
  i = line.find_first_not_of(" \t", i + 7);
  if (i == std::string::npos || (line[i] != '"' && line[i] != '<')) return std::nullopt;
  const size_t end = line.find(line[i] == '"' ? '"' : '>', i + 1);
  if (end == std::string::npos || end == i + 1) return std::nullopt;
  return std::make_pair(line[i], line.substr(i + 1, end - i - 1));
}

}  // namespace

SourceSet resolve_includes(const std::string& origin, std::string text) {
  SourceSet set;
  std::map<std::string, std::string> headers;
  std::vector<std::pair<std::string, std::string>> pending = {{origin, text}};
  while (!pending.empty()) {
    auto [from, body] = std::move(pending.back());
    pending.pop_back();
    std::istringstream lines(body);
    std::string line;
    while (std::getline(lines, line)) {
      const auto include = include_of(line);
      if (!include) continue;
      if (include->first == '<') {
        throw Error(ErrorCode::kInvalidArgument, fmt::format("kernel source {}: '#include <{}>' is not allowed; kernels include only "
                                                             "kernel-sources/ headers, written \"like/this.cuh\"",
                                                             from, include->second));
      }
      const std::string& name = include->second;
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
