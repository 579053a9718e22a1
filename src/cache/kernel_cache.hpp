// The SQLite store behind kiln/cache.hpp: a writable database in the cache directory, read-only
// seed databases under it, verification of every row before use, LRU eviction, and degraded
// (memory-only) operation when the directory cannot be used.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cache/kernel_key.hpp"
#include "cache/row_signing.hpp"
#include "kiln/cache.hpp"

struct sqlite3;

namespace kiln::detail {

struct CacheRow {
  KernelKey key;
  std::string kernel, op, signature, target, backend, compiler, options, entry;
  std::vector<uint8_t> binary;
  double compile_ms = 0;
};

struct CacheCounters {
  std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, seed_hits{0}, misses{0}, compiles{0}, bytes_written{0}, evictions{0}, bad_entries{0},
      lock_waits{0};
  std::atomic<uint64_t> compile_us{0};
};

class KernelCache {
 public:
  enum class Mode {
    kServe,    // for kernels: any problem degrades to memory-only with one warning
    kStrict,   // for maintenance commands: any problem throws kiln::Error(kCacheError)
    kInspect,  // for commands that only read: creates nothing, writes nothing; an absent or
               // unusable directory or database is reported in degraded_reason()
  };
  KernelCache(std::string directory, std::vector<std::string> seeds, uint64_t max_bytes, Mode mode);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The cache of this process, from the environment; reopened in a child after fork().
  static KernelCache& process();
  // Makes process() open the cache in Mode::kInspect: for commands that only read (kiln devices,
  // env), which must create no directory or database. Call before anything uses the cache.
  static void inspect_only_process();

  enum class Tier { kDisk, kSeed };
  struct Found {
    CacheRow row;
    Tier tier;
  };
  // The verified row for `key`, built for exactly `target` by exactly `compiler`. A row that
  // fails verification is dropped (writable tier) or skipped (seed), counted and warned about.
  std::optional<Found> lookup(const KernelKey& key, const std::string& target, const std::string& compiler);
  // Removes a row of the writable database (e.g. one that failed to load).
  void drop(const KernelKey& key, const std::string& why);
  // The compiler identities of the rows for `target` in the directory's database and the seeds,
  // the most recently built first: the identities a node without a compiler looks kernels up by.
  std::vector<std::string> compiler_identities(const std::string& target);

  // Inserts or replaces one row in one transaction, then evicts down to the budget.
  // True when the row is in the database once it returns; false when the cache is memory only, the
  // write failed (the cache is then marked degraded) or the row's binary is empty.
  bool publish(const CacheRow& row);

  // Remembered derived values (the meta table of the writable database); best effort.
  std::optional<std::string> meta_get(const std::string& name);
  void meta_put(const std::string& name, const std::string& value);

  bool persistent() const { return db_ != nullptr && writable_; }
  const std::string& directory() const { return directory_; }
  std::string degraded_reason() const;
  CacheCounters& counters() { return counters_; }
  CacheStats stats();

  std::vector<CacheEntry> list();
  CacheVerifyReport verify(bool repair);
  uint64_t prune(uint64_t max_bytes);
  // Writes the rows (of one target and/or kernel where given) to a new bundle file, each signed by
  // `signing_key` where one is given.
  uint64_t export_to(const std::string& file, const std::string& target, const std::string& kernel,
                     const SigningKey* signing_key = nullptr);
  // With trusted keys (KILN_CACHE_TRUSTED_KEYS), imports only rows signed by one of them. Refuses a
  // bundle that other users can write.
  CacheImportReport import_from(const std::string& file);
  // Calls `visit` with each verified row (of one target where given), one at a time.
  void for_each_row(const std::string& target, const std::function<void(const CacheRow&)>& visit);

 private:
  void open_writable();
  void open_for_inspection();  // Mode::kInspect
  void open_seeds();
  void degrade(const std::string& category, const std::string& reason);
  void read_trusted_keys();
  // Why a row of `db` (a bundle or seed) is not trusted, or nullopt: with trusted keys set it must
  // carry a signature by one of them that verifies.
  std::optional<std::string> untrusted_reason(sqlite3* db, const CacheRow& row);
  uint64_t evict_locked(uint64_t max_bytes, const KernelKey* keep);

  std::string directory_;
  std::vector<std::string> seed_paths_;
  uint64_t max_bytes_;
  Mode mode_;
  sqlite3* db_ = nullptr;
  bool writable_ = false;
  std::vector<std::pair<std::string, sqlite3*>> seeds_;
  std::mutex mutex_;  // one connection, used by one thread at a time
  std::string degraded_reason_;
  std::set<std::string> warned_;
  CacheCounters counters_;
  std::vector<PublicKey> trusted_keys_;
  std::string trusted_keys_error_;  // KILN_CACHE_TRUSTED_KEYS set but unreadable: nothing is trusted
};

// Opens a database file as a kiln cache (schema created or migrated when writable). Throws
// kiln::Error(kCacheError) with the reason: garbage, another application, a newer schema.
// Read-only opens are immutable (no locks, no journal files), or with immutable false read
// through SQLite's locks, for a database another process may be writing.
sqlite3* open_cache_database(const std::string& path, bool writable, bool network_filesystem, bool immutable = true);

uint64_t default_cache_max_bytes();

}  // namespace kiln::detail
