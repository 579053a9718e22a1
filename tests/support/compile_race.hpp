// Real kiln processes racing for a cache (tests/test_cache.cpp, tests/test_remote_cache.cpp).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kiln::test {

// A prefill signature the race tests compile for sm_90a.
inline constexpr const char* kPrefillSig = "dtype=bf16,head_dim=64,group=4,causal=1,window=0,sinks=0,softcap=0,lse=0";

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `kiln compile mha_prefill --target sm_90a --json --sig S` for each signature in its own
// process, all at once, from `base` (which keeps their output files); process i uses the cache
// directory cache_dir(i), with `env` (VAR=value ...) before it. Returns each process's origin
// ("compiled", "disk", "remote"), or "rc=N" and its stderr on failure.
inline std::vector<std::string> race_compiles(const std::filesystem::path& base, const std::vector<std::string>& sigs,
                                              const std::function<std::string(size_t)>& cache_dir, const std::string& env = "") {
  std::filesystem::create_directories(base);
  std::string script = "cd " + base.string() + "; ";
  for (size_t i = 0; i < sigs.size(); ++i) {
    // Under the sanitizer build, LeakSanitizer's exit-time scan of these racing processes crashed
    // ("Tracer caught signal 11") on dynamic-TLS records that NVRTC, loaded in each to compute its
    // identity, leaves behind. The scan is a sanitizer runtime fault, not a leak; these tests are
    // about the cache, and the CLI's leak checks run in every other CLI test.
    script += fmt::format(
        "( ASAN_OPTIONS=detect_leaks=0 {} KILN_CACHE_DIR={} {} compile mha_prefill --target sm_90a --json --sig {} > out.{} 2> err.{}; "
        "echo $? > rc.{} ) & ",
        env, cache_dir(i), KILN_TEST_CLI, sigs[i], i, i, i);
  }
  script += "wait";
  EXPECT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0);
  std::vector<std::string> origins;
  for (size_t i = 0; i < sigs.size(); ++i) {
    const std::string rc = file_bytes((base / ("rc." + std::to_string(i))).string());
    if (std::stoi(rc) != 0) {
      origins.push_back("rc=" + rc + " " + file_bytes((base / ("err." + std::to_string(i))).string()));
      continue;
    }
    origins.push_back(nlohmann::json::parse(file_bytes((base / ("out." + std::to_string(i))).string()))["origin"]);
  }
  return origins;
}

}  // namespace kiln::test
