// kiln's on-disk kernel cache: one SQLite database (kiln.db) per cache directory, so a restarted
// process, or a fleet that ships the cache, starts warm.
//
// Directory: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln (created 0700).
// Size budget: KILN_CACHE_MAX_BYTES (default 4 GiB), enforced least-recently-used after each
// write. Read-only seed databases: KILN_CACHE_SEED (colon-separated kiln.db files or
// directories), consulted after the writable one and never written.
//
// Properties: one compile per key across the processes of a host (per-key locks that die with
// their process); no reader sees a partial entry (one transaction per write); every binary is
// verified (checksum, target, compiler) before it is loaded, and a bad row is dropped and
// rebuilt; a directory or database writable by other users is refused; an unusable directory
// (read-only, full, locked, garbage, another schema) leaves kiln working from memory with one
// warning, and kiln never deletes a file it did not create.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// The fleet tier (KILN_CACHE_REMOTE=redis://...): its settings and this process's counters.
struct RemoteCacheStats {
  std::string url;       // the server, password redacted; empty when no remote is configured
  std::string prefix;    // of every key kiln writes there
  std::string state;     // "off", "on", "skipping: <why>" (after a failure, for a cool-down) or "invalid: <why>"
  uint64_t hits = 0;     // verified entries loaded from the remote
  uint64_t misses = 0;   // keys the remote did not have
  uint64_t refused = 0;  // entries that failed verification: never loaded
  uint64_t errors = 0;   // failed commands or connections
  uint64_t skipped = 0;  // lookups not sent while the remote was being skipped
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t publishes = 0;        // rows written by the background writer or push
  uint64_t publish_dropped = 0;  // rows not written: queue full or remote unavailable
  uint64_t lease_waits = 0;      // waited for another node compiling the same key
  uint64_t lease_takeovers = 0;  // that node's lease lapsed without an entry: compiled here
};

// The remote server as reached now, with the counts every node has added (fleet-wide).
struct RemoteCacheProbe {
  std::string url;
  double round_trip_ms = 0;
  std::vector<std::pair<std::string, uint64_t>> fleet;  // hits, misses, compiles, publishes, refused, lease_waits, ...
};

struct CachePushReport {
  uint64_t pushed = 0;
  uint64_t bytes = 0;
  std::string url;
};

// Counters of this process since start, plus the state of the database.
struct CacheStats {
  std::string directory;        // empty when no directory is in use
  bool persistent = false;      // false: memory only (see degraded_reason)
  std::string degraded_reason;  // why the directory is not in use, if it is not
  std::vector<std::string> seeds;
  uint64_t entries = 0;  // rows in the writable database
  uint64_t bytes = 0;    // sum of their binary sizes
  uint64_t max_bytes = 0;
  // This process:
  uint64_t memory_hits = 0;  // binaries found in the process's own table
  uint64_t disk_hits = 0;    // ... in the writable database
  uint64_t seed_hits = 0;    // ... in a seed database
  uint64_t misses = 0;       // not found anywhere: compiled
  uint64_t compiles = 0;
  double compile_ms = 0;
  uint64_t bytes_written = 0;
  uint64_t evictions = 0;
  uint64_t bad_entries = 0;  // checksum, target or compiler mismatch, or failed load: dropped
  uint64_t lock_waits = 0;   // waited for another process compiling the same key
  RemoteCacheStats remote;
};

struct CacheEntry {
  std::string key;  // 32 hex digits
  std::string kernel, op, signature, target, backend, compiler;
  uint64_t size = 0;
  uint64_t hits = 0;
  int64_t created = 0, last_used = 0;  // unix seconds
  double compile_ms = 0;
};

struct CacheVerifyReport {
  uint64_t checked = 0;
  std::vector<std::string> problems;  // one line per bad row or database problem
  uint64_t removed = 0;               // with repair
};

struct CacheImportReport {
  uint64_t imported = 0;
  uint64_t already_present = 0;
  std::vector<std::string> rejected;  // one line per row refused (bad checksum, key, fields)
};

// The cache this process uses for its kernels.
CacheStats cache_stats();
// A cache directory's state (empty: this process's directory) as a command that only reads sees
// it: nothing is created or written, counters are zero, and `persistent` says whether a database
// is there to read. Throws kiln::Error(kCacheError) for a directory that cannot be trusted.
CacheStats cache_stats_of(const std::string& directory);

// Maintenance of a cache directory (empty: this process's directory). Each throws
// kiln::Error(kCacheError) naming the directory and the problem when it cannot be used.
std::vector<CacheEntry> cache_list(const std::string& directory = "");
CacheVerifyReport cache_verify(bool repair, const std::string& directory = "");
// Evicts least-recently-used rows until the database holds at most max_bytes; returns the count.
uint64_t cache_prune(uint64_t max_bytes, const std::string& directory = "");
// Writes the rows (optionally of one target and/or kernel) to `file`, a new kiln database; with
// `signing_key` (a secret key file from cache_keygen, mode 0600) each row is signed (Ed25519).
uint64_t cache_export(const std::string& file, const std::string& target = "", const std::string& kernel = "",
                      const std::string& directory = "", const std::string& signing_key = "");
// Imports a bundle's verified rows. With KILN_CACHE_TRUSTED_KEYS set (comma-separated Ed25519
// public keys, as hex or .pub files) only rows signed by one of them are imported, and seeds serve
// only such rows; the others are listed in `rejected`. A bundle other users can write is refused.
CacheImportReport cache_import(const std::string& file, const std::string& directory = "");
// Writes a new signing key pair, `prefix`.key (secret, mode 0600) and `prefix`.pub; returns the
// public key as 64 hex digits. Needs libsodium (Debian: libsodium23), loaded at first use.
std::string cache_keygen(const std::string& prefix);

// The fleet tier. Lookup order: in-process, the local database, seeds, the remote, then a compile.
// KILN_CACHE_REMOTE=redis://[user:password@]host[:port][/db] turns it on (hiredis is loaded then);
// KILN_CACHE_REMOTE_PREFIX (default "kiln:"), _TTL (seconds, default 30 days, 0: none),
// _TIMEOUT_MS (default 10), _LEASE_MS (default 10000), _WAIT_S (default 300), _COOLDOWN_S
// (default 30) tune it; KILN_CACHE_SIGNING_KEY signs what a node publishes; with
// KILN_CACHE_TRUSTED_KEYS set, only entries signed by one of those keys are loaded.
//
// Reaches the configured server now. Throws kiln::Error(kCacheError) when none is configured or
// it cannot be reached.
RemoteCacheProbe cache_remote_probe();
// Uploads the rows of a cache directory (optionally of one target) to the configured remote,
// signed with `signing_key` (a secret key file) when given.
CachePushReport cache_push(const std::string& target = "", const std::string& directory = "", const std::string& signing_key = "");

}  // namespace kiln
