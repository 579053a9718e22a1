// kiln_stress: several processes, each with several threads, select and fetch-or-compile mixed
// signatures of all three operators against one cache whose size budget holds about one binary,
// so rows are evicted constantly. Every binary is checked against a reference compile made
// without the cache (same bytes, same entry). Exit status 0 only when every check passed and the
// cache verifies clean afterwards.
//
//   kiln_stress --cache DIR [--processes 4] [--threads 4] [--rounds 3] [--budget 40000]
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/nvrtc.hpp"
#include "jit/pipeline.hpp"
#include "kiln/author.hpp"
#include "kiln/kiln.hpp"
#include "support/signatures.hpp"

extern char** environ;

namespace {

using namespace kiln;

std::vector<Signature> signatures() {
  std::vector<Signature> out;
  for (const char* dtype : {"bf16", "f16"}) {
    for (int64_t d : {64, 128}) out.push_back(test::prefill_signature(dtype, d, 8));
  }
  out.push_back(test::decode_signature("bf16", "bf16", 64, 8));
  out.push_back(test::decode_signature("bf16", "e4m3", 128, 8));
  for (const char* weights : {"bf16", "mxfp4"}) {
    out.push_back(test::moe_signature(weights, 256, 128, 8, 2, "f32", "silu_glu", "concat", "none"));
  }
  return out;
}

std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  return fallback;
}

int child(const std::string& expect_file, int threads, unsigned seed) {
  std::map<std::string, std::pair<uint64_t, std::string>> expected;
  std::ifstream in(expect_file);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string sig, entry;
    uint64_t hash = 0;
    fields >> sig >> hash >> entry;
    expected[sig] = {hash, entry};
  }
  const auto sigs = signatures();
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937 rng(seed * 131 + static_cast<unsigned>(t));
      std::vector<size_t> order(sigs.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t i : order) {
        try {
          const CompiledKernel k = compile_for_target(sigs[i], "sm_90a");
          const auto& want = expected.at(sigs[i].canonical());
          if (XXH3_64bits(k.binary.data(), k.binary.size()) != want.first || k.lowered_name != want.second) {
            std::fprintf(stderr, "MISMATCH %s (origin %s)\n", sigs[i].canonical().c_str(), k.origin.c_str());
            ++failures;
          }
        } catch (const Error& e) {
          std::fprintf(stderr, "ERROR %s: %s\n", sigs[i].canonical().c_str(), e.what());
          ++failures;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  const CacheStats s = cache_stats();
  std::printf("%lu %lu %lu %lu\n", static_cast<unsigned long>(s.compiles), static_cast<unsigned long>(s.disk_hits),
              static_cast<unsigned long>(s.evictions), static_cast<unsigned long>(s.lock_waits));
  return failures.load() == 0 && s.persistent ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cache = arg(argc, argv, "--cache", "");
  if (cache.empty()) {
    std::fprintf(stderr, "usage: kiln_stress --cache DIR [--processes N] [--threads N] [--rounds N] [--budget BYTES]\n");
    return 2;
  }
  const int threads = std::stoi(arg(argc, argv, "--threads", "4"));
  const std::string expect_file = cache + ".expected";
  if (arg(argc, argv, "--child", "") == "1")
    return child(expect_file, threads, static_cast<unsigned>(std::stoul(arg(argc, argv, "--seed", "1"))));

  const int processes = std::stoi(arg(argc, argv, "--processes", "4"));
  const int rounds = std::stoi(arg(argc, argv, "--rounds", "3"));
  ::setenv("KILN_CACHE_DIR", cache.c_str(), 1);
  ::setenv("KILN_CACHE_MAX_BYTES", arg(argc, argv, "--budget", "40000").c_str(), 1);
  // Reference binaries, compiled here without the cache.
  {
    std::ofstream out(expect_file);
    for (const auto& sig : signatures()) {
      const Platform p = platform_for_target("sm_90a");
      const auto request = detail::build_request(*Registry::global().select(sig, p), sig, p);
      const detail::CompileResult r = detail::cuda::nvrtc_compile(request);
      out << sig.canonical() << " " << XXH3_64bits(r.binary.data(), r.binary.size()) << " " << r.lowered_name << "\n";
    }
  }
  unsigned long totals[4] = {0, 0, 0, 0};
  int failed = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::pair<pid_t, int>> kids;
    for (int p = 0; p < processes; ++p) {
      int fds[2];
      if (pipe(fds) != 0) return 1;
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
      posix_spawn_file_actions_addclose(&actions, fds[0]);
      const std::string seed = std::to_string(round * processes + p + 1);
      std::string t = std::to_string(threads);
      char* child_argv[] = {argv[0],
                            const_cast<char*>("--child"),
                            const_cast<char*>("1"),
                            const_cast<char*>("--cache"),
                            const_cast<char*>(cache.c_str()),
                            const_cast<char*>("--threads"),
                            t.data(),
                            const_cast<char*>("--seed"),
                            const_cast<char*>(seed.c_str()),
                            nullptr};
      pid_t pid = 0;
      if (posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, child_argv, environ) != 0) return 1;
      posix_spawn_file_actions_destroy(&actions);
      close(fds[1]);
      kids.emplace_back(pid, fds[0]);
    }
    for (auto [pid, fd] : kids) {
      char buf[256] = {0};
      const ssize_t n = read(fd, buf, sizeof(buf) - 1);
      close(fd);
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
      unsigned long v[4] = {0, 0, 0, 0};
      if (n > 0 && std::sscanf(buf, "%lu %lu %lu %lu", &v[0], &v[1], &v[2], &v[3]) == 4) {
        for (int i = 0; i < 4; ++i) totals[i] += v[i];
      }
    }
  }
  const CacheVerifyReport verify = cache_verify(false, cache);
  std::printf(
      "%d rounds x %d processes x %d threads, %zu signatures: %lu compiles, %lu disk hits, %lu evictions, "
      "%lu lock waits; %d process(es) failed; cache verify: %zu problem(s)\n",
      rounds, processes, threads, signatures().size(), totals[0], totals[1], totals[2], totals[3], failed, verify.problems.size());
  std::remove(expect_file.c_str());
  return failed == 0 && verify.problems.empty() && totals[2] > 0 ? 0 : 1;
}
