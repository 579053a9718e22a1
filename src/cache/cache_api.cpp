// kiln/cache.hpp: the process's cache statistics and maintenance of cache directories.
#include "cache/cache_directory.hpp"
#include "cache/kernel_cache.hpp"
#include "cache/remote_tier.hpp"
#include "kiln/cache.hpp"
#include "kiln/error.hpp"

#include <memory>
#include <optional>

namespace kiln {
namespace {

// Maintenance never degrades silently: a directory that cannot be used is an error.
detail::KernelCache strict_cache(const std::string& directory) {
  return detail::KernelCache(directory.empty() ? detail::default_cache_directory() : directory, {}, detail::default_cache_max_bytes(),
                             detail::KernelCache::Mode::kStrict);
}

// Commands that only read create and write nothing: a directory without a database lists as
// empty; one that cannot be trusted or opened is an error, as for maintenance.
std::unique_ptr<detail::KernelCache> inspecting_cache(const std::string& directory) {
  auto cache = std::make_unique<detail::KernelCache>(directory.empty() ? detail::default_cache_directory() : directory,
                                                     detail::default_seed_databases(), detail::default_cache_max_bytes(),
                                                     detail::KernelCache::Mode::kInspect);
  const std::string why = cache->degraded_reason();
  if (!why.empty() && why.find("does not exist") == std::string::npos) throw Error(ErrorCode::kCacheError, why);
  return cache;
}

// The remote tier as this process has it: its counters when one is in use; its settings, or why
// they are refused, otherwise.
RemoteCacheStats remote_stats() {
  if (detail::RemoteTier* remote = detail::RemoteTier::process()) return remote->stats();
  RemoteCacheStats s;
  try {
    s.state = detail::remote_settings_from_environment() ? "on" : "off";
  } catch (const Error& e) {
    s.state = "invalid: " + e.message();
  }
  return s;
}

detail::RemoteTier& configured_remote() {
  detail::RemoteTier* remote = detail::RemoteTier::process();
  if (remote == nullptr) {
    detail::remote_settings_from_environment();  // throws the setting's own error, if that is why
    throw Error(ErrorCode::kCacheError, "no remote cache is configured: set KILN_CACHE_REMOTE=redis://host:port");
  }
  return *remote;
}

}  // namespace

CacheStats cache_stats() {
  CacheStats s = detail::KernelCache::process().stats();
  s.remote = remote_stats();
  return s;
}

CacheStats cache_stats_of(const std::string& directory) {
  CacheStats s = inspecting_cache(directory)->stats();
  s.remote = remote_stats();
  return s;
}

RemoteCacheProbe cache_remote_probe() { return configured_remote().probe(); }

CachePushReport cache_push(const std::string& target, const std::string& directory, const std::string& signing_key) {
  detail::RemoteTier& remote = configured_remote();
  std::optional<detail::SigningKey> key;
  if (!signing_key.empty()) key = detail::read_signing_key(signing_key);
  CachePushReport report;
  report.url = remote.settings().endpoint.redacted;
  strict_cache(directory).for_each_row(target, [&](const detail::CacheRow& row) {
    remote.publish_now(row, key ? &*key : nullptr);
    report.pushed++;
    report.bytes += row.binary.size();
  });
  return report;
}

std::vector<CacheEntry> cache_list(const std::string& directory) { return inspecting_cache(directory)->list(); }

// Without repair, verification only reads: it creates nothing and works on a read-only cache.
CacheVerifyReport cache_verify(bool repair, const std::string& directory) {
  return repair ? strict_cache(directory).verify(true) : inspecting_cache(directory)->verify(false);
}

uint64_t cache_prune(uint64_t max_bytes, const std::string& directory) { return strict_cache(directory).prune(max_bytes); }

uint64_t cache_export(const std::string& file, const std::string& target, const std::string& kernel, const std::string& directory,
                      const std::string& signing_key) {
  if (signing_key.empty()) return strict_cache(directory).export_to(file, target, kernel);
  const detail::SigningKey key = detail::read_signing_key(signing_key);
  return strict_cache(directory).export_to(file, target, kernel, &key);
}

std::string cache_keygen(const std::string& prefix) {
  const detail::PublicKey key = detail::generate_signing_key(prefix);
  return detail::to_hex(key.data(), key.size());
}

CacheImportReport cache_import(const std::string& file, const std::string& directory) {
  // Importing into a new directory creates it, like the first kernel compiled there would.
  const std::string dir = directory.empty() ? detail::default_cache_directory() : directory;
  if (auto why = detail::prepare_cache_directory(dir, true)) throw Error(ErrorCode::kCacheError, *why);
  return strict_cache(dir).import_from(file);
}

}  // namespace kiln
