// The fleet tier of the kernel cache: a Redis server shared by many nodes (KILN_CACHE_REMOTE).
// Consulted only after the in-process table, the local database and the seeds miss, so the hit
// path never touches the network. Every entry fetched is verified (checksum, key, target,
// compiler identity, and an Ed25519 signature when trusted keys are set) before anything loads
// it. Compiled rows are published by a background writer; a lease per key (SET NX PX, renewed
// while compiling) makes one node compile a key while the others wait for its entry. Timeouts and
// a circuit breaker keep a slow, full or dead server from stalling a caller.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "cache/kernel_cache.hpp"
#include "cache/redis_client.hpp"
#include "cache/row_signing.hpp"
#include "kiln/cache.hpp"

namespace kiln::detail {

struct RemoteSettings {
  RedisEndpoint endpoint;
  std::string prefix = "kiln:";               // KILN_CACHE_REMOTE_PREFIX
  int64_t ttl_seconds = 30 * 24 * 3600;       // KILN_CACHE_REMOTE_TTL; 0: entries never expire
  std::chrono::milliseconds timeout{10};      // KILN_CACHE_REMOTE_TIMEOUT_MS: connect, and each read or write
  std::chrono::milliseconds lease{10000};     // KILN_CACHE_REMOTE_LEASE_MS: a compile lease's life between renewals
  std::chrono::milliseconds wait{300000};     // KILN_CACHE_REMOTE_WAIT_S: longest wait for another node's compile
  std::chrono::milliseconds cooldown{30000};  // KILN_CACHE_REMOTE_COOLDOWN_S: the remote is skipped this long after a failure
  std::optional<SigningKey> signing_key;      // KILN_CACHE_SIGNING_KEY: rows this node publishes are signed
  std::vector<PublicKey> trusted_keys;        // KILN_CACHE_TRUSTED_KEYS: entries must be signed by one
  std::string trusted_keys_error;             // the setting is there but unusable: nothing is trusted
  size_t queue_limit = 256;                   // rows waiting for the background writer
};

// From the environment; nullopt when KILN_CACHE_REMOTE is unset. A malformed setting throws
// kiln::Error(kInvalidArgument) naming the variable.
std::optional<RemoteSettings> remote_settings_from_environment();

// An entry as stored under a key: the row's fields, its checksum, its signature if any, its binary.
std::string encode_remote_entry(const CacheRow& row, const SigningKey* signing_key);
struct DecodedEntry {
  CacheRow row;
  uint64_t checksum = 0;
  std::optional<std::pair<PublicKey, RowSignature>> signature;
};
// The entry, or why it is not one (garbage, truncated, trailing bytes).
std::variant<DecodedEntry, std::string> decode_remote_entry(const std::string& bytes);

struct RemoteCounters {
  std::atomic<uint64_t> hits{0}, misses{0}, refused{0}, errors{0}, bytes_read{0}, bytes_written{0}, publishes{0}, publish_dropped{0},
      lease_waits{0}, lease_takeovers{0}, skipped{0}, compiles{0};  // keys this process compiled after the remote missed
};

class RemoteTier {
 public:
  // The tier of this process (KILN_CACHE_REMOTE), or nullptr without one. A malformed setting is
  // warned about once and leaves the process without a remote. Reopened in a child after fork().
  static RemoteTier* process();

  explicit RemoteTier(RemoteSettings settings);
  // Writes what is queued (for at most a few seconds), releases held leases, adds this process's
  // counts to the fleet's.
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  const RemoteSettings& settings() const { return settings_; }
  RemoteCounters& counters() { return counters_; }

  // The verified row stored for `key`, built for exactly `target` by exactly `compiler`; nullopt
  // when absent, refused (counted and warned about once) or the remote is unavailable. Never throws.
  std::optional<CacheRow> fetch(const KernelKey& key, const std::string& target, const std::string& compiler);
  // An entry that passed fetch() but was refused later (no binary for the target, does not load).
  void refuse(const KernelKey& key, const std::string& why);
  // Compiler identities with entries for `target` on the remote, most recently published first.
  std::vector<std::string> compiler_identities(const std::string& target);

  enum class Lease { kTaken, kHeldElsewhere, kUnavailable };
  Lease take_lease(const KernelKey& key);
  bool lease_held(const KernelKey& key);  // false also when the remote is unavailable
  // Releases this process's lease on `key` once everything queued before it is written.
  void release_lease(const KernelKey& key);

  // Queues the row for the background writer (never blocks on Redis); the key's lease, if held, is
  // released after the row is written. A full queue drops the row (counted).
  void publish_later(const CacheRow& row);
  // Writes the row now (kiln cache push), signed with `signing_key` when given (else with the
  // configured one). Throws kiln::Error(kCacheError) when it cannot.
  void publish_now(const CacheRow& row, const SigningKey* signing_key);

  RemoteCacheStats stats();
  // Reaches the server now: round-trip time and the fleet's counters. Throws kCacheError.
  RemoteCacheProbe probe();

 private:
  struct Job {
    std::optional<CacheRow> row;       // publish this
    std::optional<KernelKey> release;  // then release this key's lease
  };
  template <typename F>
  auto with_connection(F&& use) -> std::optional<decltype(use(std::declval<RedisConnection&>()))>;
  std::unique_ptr<RedisConnection> connect();
  void trip(const std::string& why);
  bool skipping() const;
  void warn_once(const std::string& category, const std::string& message);
  std::string entry_key(const KernelKey& key) const { return settings_.prefix + "row:" + key.hex(); }
  std::string lease_key(const KernelKey& key) const { return settings_.prefix + "lease:" + key.hex(); }
  // Why the server refused the row (a full server, say), or nullopt once it is written.
  std::optional<std::string> write_row(RedisConnection& connection, const CacheRow& row, const SigningKey* signing_key);
  void run_writer();
  void renew_leases(RedisConnection& connection);
  void flush_fleet_counts(RedisConnection& connection);
  bool counts_pending() const;

  RemoteSettings settings_;
  RemoteCounters counters_;
  std::string token_;  // this process's lease value: host, pid and a random part

  std::mutex connection_mutex_;  // the callers' connection, used by one thread at a time
  std::unique_ptr<RedisConnection> connection_;
  std::atomic<int64_t> skip_until_ns_{0};
  std::mutex warned_mutex_;
  std::map<std::string, bool> warned_;

  std::mutex jobs_mutex_;
  std::condition_variable jobs_ready_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::map<std::string, KernelKey> held_leases_;  // key hex -> key, under jobs_mutex_
  std::map<std::string, uint64_t> flushed_;       // counts already added to the fleet's, writer only
  uint64_t flushed_total_ = 0;
  std::thread writer_;
};

}  // namespace kiln::detail
