// Latency of the remote tier's fetch as kiln performs it (GET, decode, checksum, key, target and
// compiler checks, and the signature with KILN_CACHE_TRUSTED_KEYS) for every entry under the
// configured prefix. Prints JSON: per-entry sizes and the p50/p99 over all fetches.
// Run: KILN_CACHE_REMOTE=redis://127.0.0.1:6379 build/bin/kiln_bench_remote_fetch [repetitions]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/remote_tier.hpp"
#include "kiln/error.hpp"

int main(int argc, char** argv) {
  using namespace kiln::detail;
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  try {
    auto settings = remote_settings_from_environment();
    if (!settings) {
      std::fprintf(stderr, "set KILN_CACHE_REMOTE=redis://host:port\n");
      return 2;
    }
    RedisConnection admin(settings->endpoint, std::chrono::milliseconds(2000), std::chrono::milliseconds(5000));
    // Every entry under the prefix, and the target and compiler each was built for.
    struct Entry {
      KernelKey key;
      std::string target, compiler;
      size_t bytes;
    };
    std::vector<Entry> entries;
    std::string cursor = "0";
    do {
      const RedisReply page = admin.command({"SCAN", cursor, "MATCH", settings->prefix + "row:*", "COUNT", "1000"});
      cursor = page.elements.at(0).text;
      for (const RedisReply& name : page.elements.at(1).elements) {
        const RedisReply value = admin.command({"GET", name.text});
        const auto decoded = decode_remote_entry(value.text);
        if (const auto* e = std::get_if<DecodedEntry>(&decoded))
          entries.push_back({e->row.key, e->row.target, e->row.compiler, value.text.size()});
      }
    } while (cursor != "0");
    RemoteTier tier(*settings);
    std::vector<double> all;
    nlohmann::json per_entry = nlohmann::json::array();
    for (const Entry& e : entries) {
      std::vector<double> ms;
      for (int i = 0; i < repetitions; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const auto row = tier.fetch(e.key, e.target, e.compiler);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        if (!row) throw kiln::Error(kiln::ErrorCode::kCacheError, "entry " + e.key.hex() + " did not fetch");
      }
      std::sort(ms.begin(), ms.end());
      all.insert(all.end(), ms.begin(), ms.end());
      per_entry.push_back({{"key", e.key.hex()}, {"bytes", e.bytes}, {"p50_ms", ms[ms.size() / 2]}});
    }
    std::sort(all.begin(), all.end());
    auto quantile = [&](double q) {
      return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(q * static_cast<double>(all.size())))];
    };
    const nlohmann::json out = {{"entries", entries.size()},
                                {"fetches", all.size()},
                                {"p50_ms", quantile(0.5)},
                                {"p99_ms", quantile(0.99)},
                                {"max_ms", all.empty() ? 0.0 : all.back()},
                                {"per_entry", per_entry}};
    std::printf("%s\n", out.dump(2).c_str());
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
