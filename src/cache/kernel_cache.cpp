#include "cache/kernel_cache.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "cache/cache_directory.hpp"
#include "cache/schema.hpp"
#include "core/embedded_file.hpp"
#include "core/env.hpp"
#include "core/process_singleton.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"

namespace kiln::detail {

extern const EmbeddedFile kEmbeddedCacheSchema[];
extern const unsigned long kEmbeddedCacheSchemaCount;

std::string cache_schema_sql() {
  for (unsigned long i = 0; i < kEmbeddedCacheSchemaCount; ++i) {
    if (std::strcmp(kEmbeddedCacheSchema[i].name, "schema.sql") == 0) {
      return std::string(reinterpret_cast<const char*>(kEmbeddedCacheSchema[i].data), kEmbeddedCacheSchema[i].size);
    }
  }
  throw Error(ErrorCode::kInternal, "cache/schema.sql is not embedded in this libkiln");
}

uint64_t default_cache_max_bytes() {
  if (auto text = env_string("KILN_CACHE_MAX_BYTES")) {
    const int64_t v = parse_size(*text, "KILN_CACHE_MAX_BYTES");
    if (v <= 0) throw Error(ErrorCode::kInvalidArgument, "KILN_CACHE_MAX_BYTES must be > 0");
    return static_cast<uint64_t>(v);
  }
  return 4ULL << 30;
}

namespace {

constexpr int kBusyTimeoutMs = 10000;

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t checksum_of(const std::vector<uint8_t>& binary) { return static_cast<int64_t>(XXH3_64bits(binary.data(), binary.size())); }

Error cache_error(const std::string& what) { return Error(ErrorCode::kCacheError, what); }

// A prepared statement that finalizes itself; step() retries SQLITE_BUSY within the busy timeout
// (sqlite3_busy_timeout already waits; BUSY after that is reported to the caller as an error).
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
      throw cache_error(fmt::format("cannot prepare '{}': {}", sql, sqlite3_errmsg(db)));
    }
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Statement& bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  Statement& bind_blob(int i, const void* data, size_t n) {
    sqlite3_bind_blob64(stmt_, i, data, static_cast<sqlite3_uint64>(n), SQLITE_TRANSIENT);
    return *this;
  }
  // True while a row is available.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw cache_error(fmt::format("{} (SQLite code {})", sqlite3_errmsg(db_), rc));
  }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string text(int col) const {
    const auto* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col))) : "";
  }
  std::vector<uint8_t> blob(int col) const {
    const auto* p = static_cast<const uint8_t*>(sqlite3_column_blob(stmt_, col));
    return p ? std::vector<uint8_t>(p, p + sqlite3_column_bytes(stmt_, col)) : std::vector<uint8_t>{};
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

void exec(sqlite3* db, const std::string& sql) {
  char* message = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
    const std::string text = message ? message : sqlite3_errmsg(db);
    sqlite3_free(message);
    throw cache_error(fmt::format("'{}' failed: {}", sql.substr(0, 60), text));
  }
}

int64_t pragma_int(sqlite3* db, const char* pragma) {
  Statement s(db, (std::string("PRAGMA ") + pragma).c_str());
  return s.step() ? s.integer(0) : 0;
}

// One write transaction; rolled back unless committed.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) { exec(db_, "BEGIN IMMEDIATE"); }
  ~Transaction() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    exec(db_, "COMMIT");
    done_ = true;
  }

 private:
  sqlite3* db_;
  bool done_ = false;
};

// Throws unless the database is kiln's (or new and empty) and not from a newer kiln; returns
// its schema version.
int64_t check_ownership(sqlite3* db, const std::string& path) {
  // One statement, so one snapshot: another process may be creating the schema right now.
  Statement header(db,
                   "SELECT (SELECT application_id FROM pragma_application_id), (SELECT user_version FROM pragma_user_version), "
                   "(SELECT count(*) FROM sqlite_master WHERE type = 'table')");
  header.step();
  const int64_t app = header.integer(0);
  const int64_t version = header.integer(1);
  const int64_t tables = header.integer(2);
  if (app != kApplicationId && !(app == 0 && version == 0 && tables == 0)) {
    throw cache_error(fmt::format("{} is an SQLite database of another application (application_id {}); kiln leaves it alone", path, app));
  }
  if (version > kSchemaVersion) {
    throw cache_error(fmt::format("{} has cache schema {} from a newer kiln; this kiln reads schema {} and leaves it alone", path, version,
                                  kSchemaVersion));
  }
  return version;
}

// Brings a database to kSchemaVersion. Version 0 with no tables is a new database. Processes
// racing on a new database serialize on the write transaction and re-check inside it.
void migrate(sqlite3* db, const std::string& path) {
  if (check_ownership(db, path) == kSchemaVersion) return;
  Transaction t(db);
  const int64_t version = check_ownership(db, path);
  if (version == kSchemaVersion) return;
  // Every statement of the schema creates only what is missing: version 0 (a new database) gets
  // all of it, version 1 the row_signatures table. Later versions that alter tables add steps here.
  exec(db, cache_schema_sql());
  exec(db, fmt::format("PRAGMA application_id = {}", kApplicationId));
  exec(db, fmt::format("PRAGMA user_version = {}", kSchemaVersion));
  t.commit();
}

// The inverse of key_bytes(); a blob of another size (a damaged row) gives the zero key.
KernelKey key_of_blob(const std::vector<uint8_t>& blob) {
  KernelKey k;
  if (blob.size() == 16) {
    std::memcpy(&k.high, blob.data(), 8);
    std::memcpy(&k.low, blob.data() + 8, 8);
  }
  return k;
}

CacheRow read_row(const Statement& s) {
  // Column order of kRowColumns.
  CacheRow r;
  r.key = key_of_blob(s.blob(0));
  r.kernel = s.text(1);
  r.op = s.text(2);
  r.signature = s.text(3);
  r.target = s.text(4);
  r.backend = s.text(5);
  r.compiler = s.text(6);
  r.options = s.text(7);
  r.entry = s.text(8);
  r.binary = s.blob(9);
  r.compile_ms = s.real(12);
  return r;
}
constexpr const char* kRowColumns =
    "key, kernel, operator, signature, target, backend, compiler, options, entry, binary, size, checksum, compile_ms";

std::vector<uint8_t> key_bytes(const KernelKey& k) {
  std::vector<uint8_t> b(16);
  std::memcpy(b.data(), &k.high, 8);
  std::memcpy(b.data() + 8, &k.low, 8);
  return b;
}

// Binds parameters 1..13 of an INSERT in kInsertColumns order, the checksum computed here.
void bind_row(Statement& s, const CacheRow& row) {
  const std::vector<uint8_t> kb = key_bytes(row.key);
  s.bind_blob(1, kb.data(), kb.size()).bind(2, row.kernel).bind(3, row.op).bind(4, row.signature).bind(5, row.target);
  s.bind(6, row.backend).bind(7, row.compiler).bind(8, row.options).bind(9, row.entry);
  s.bind_blob(10, row.binary.data(), row.binary.size()).bind(11, static_cast<int64_t>(row.binary.size()));
  s.bind(12, checksum_of(row.binary)).bind(13, row.compile_ms);
}
constexpr const char* kInsertColumns =
    "(key, kernel, operator, signature, target, backend, compiler, options, entry, binary, size, checksum, compile_ms, "
    "created, last_used, hits) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";

void delete_key(sqlite3* db, const KernelKey& key) {
  const std::vector<uint8_t> kb = key_bytes(key);
  Statement del(db, "DELETE FROM kernels WHERE key = ?");
  del.bind_blob(1, kb.data(), kb.size());
  del.step();
}

void delete_ids(sqlite3* db, const std::vector<int64_t>& ids) {
  Transaction t(db);
  Statement del(db, "DELETE FROM kernels WHERE id = ?");
  for (int64_t id : ids) {
    del.reset();
    del.bind(1, id);
    del.step();
  }
  t.commit();
}

// Why a row read from a database must not be used, or nullopt.
std::optional<std::string> row_problem(const Statement& s, const CacheRow& r) {
  if (s.blob(0).size() != 16) return "key is not 16 bytes";
  if (static_cast<int64_t>(r.binary.size()) != s.integer(10))
    return fmt::format("binary has {} bytes, the row says {}", r.binary.size(), s.integer(10));
  if (r.binary.empty()) return "binary is empty";
  if (checksum_of(r.binary) != s.integer(11)) return "checksum mismatch (corrupted binary)";
  if (r.kernel.empty() || r.target.empty() || r.compiler.empty() || r.entry.empty()) return "required field is empty";
  return std::nullopt;
}

}  // namespace

namespace {

// `path` inside a file: URI: the characters a URI gives meaning to are percent-encoded, so that a
// file named "a%41.kiln" or "b?c" opens that file.
std::string uri_path(const std::string& path) {
  std::string out;
  for (const char c : path) {
    if (c == '%' || c == '?' || c == '#' || static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

sqlite3* open_cache_database(const std::string& path, bool writable, bool network_filesystem, bool immutable) {
  // A FIFO or device would block the open or feed garbage: only regular files are databases.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw cache_error(fmt::format("cannot use {}: not a regular file", path));
  }
  sqlite3* db = nullptr;
  int flags = SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_URI | SQLITE_OPEN_FULLMUTEX;
  flags |= writable ? (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) : SQLITE_OPEN_READONLY;
  // SQLite's NOFOLLOW refuses a link anywhere in the name; kiln refuses only a linked database
  // (or journal) file. A link in the directory's path (~/.cache linked to scratch) is resolved
  // first, so the database and its journals open under the real directory.
  std::error_code ec;
  const std::filesystem::path given(path);
  const std::filesystem::path real_directory = std::filesystem::canonical(given.parent_path().empty() ? "." : given.parent_path(), ec);
  const std::string file = ec ? path : (real_directory / given.filename()).string();
  // Read-only databases (seeds, read-only directories) are opened immutable: no locks, no
  // journal files created beside them.
  const std::string uri = writable ? file : "file:" + uri_path(file) + (immutable ? "?immutable=1" : "?mode=ro");
  int rc = sqlite3_open_v2(uri.c_str(), &db, flags, nullptr);
  auto fail = [&](const std::string& why) {
    sqlite3_close_v2(db);
    return cache_error(fmt::format("cannot use {}: {}", path, why));
  };
  if (rc != SQLITE_OK) throw fail(db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  try {
    // Reading the header proves the file is a database (garbage fails here, SQLITE_NOTADB).
    pragma_int(db, "schema_version");
    if (writable) {
      check_ownership(db, path);  // before anything below writes to a file that may not be ours
      if (network_filesystem) {
        // WAL needs shared memory that network filesystems do not provide; mmap is unsafe there.
        exec(db, "PRAGMA journal_mode = DELETE");
        exec(db, "PRAGMA mmap_size = 0");
        exec(db, "PRAGMA synchronous = FULL");
      } else {
        exec(db, "PRAGMA journal_mode = WAL");
        exec(db, "PRAGMA synchronous = NORMAL");
      }
      migrate(db, path);
    } else {
      const int64_t app = pragma_int(db, "application_id");
      const int64_t version = pragma_int(db, "user_version");
      if (app != kApplicationId) throw cache_error(fmt::format("not a kiln cache (application_id {})", app));
      // Read-only, every schema from 1 on reads: later versions only added tables (schema 1 has no
      // row_signatures, so none of its rows is signed).
      if (version < 1 || version > kSchemaVersion)
        throw cache_error(fmt::format("cache schema {}, this kiln reads 1 to {}", version, kSchemaVersion));
    }
  } catch (const Error& e) {
    throw fail(e.message());
  }
  return db;
}

KernelCache::KernelCache(std::string directory, std::vector<std::string> seeds, uint64_t max_bytes, Mode mode)
    : directory_(std::move(directory)), seed_paths_(std::move(seeds)), max_bytes_(max_bytes), mode_(mode) {
  read_trusted_keys();
  open_writable();
  open_seeds();
}

void KernelCache::read_trusted_keys() {
  try {
    trusted_keys_ = trusted_keys_from_environment();
  } catch (const Error& e) {
    if (mode_ == Mode::kStrict) throw;
    // Fail closed: with keys asked for but unreadable, no bundle or seed row is trusted.
    trusted_keys_error_ = e.message();
    degrade("trusted-keys", e.message() + "; no seed row is trusted");
  }
}

std::optional<std::string> KernelCache::untrusted_reason(sqlite3* db, const CacheRow& row) {
  if (!trusted_keys_error_.empty()) return trusted_keys_error_;
  if (trusted_keys_.empty()) return std::nullopt;
  const std::vector<uint8_t> kb = key_bytes(row.key);
  std::vector<uint8_t> signer, signature;
  try {
    Statement s(db, "SELECT signer, signature FROM row_signatures WHERE key = ?");
    s.bind_blob(1, kb.data(), kb.size());
    if (s.step()) {
      signer = s.blob(0);
      signature = s.blob(1);
    }
  } catch (const Error&) {  // a database from before signatures: no row of it is signed
  }
  if (signer.size() != 32 || signature.size() != 64)
    return "not signed, and KILN_CACHE_TRUSTED_KEYS admits only rows signed by its keys (kiln cache export --sign)";
  PublicKey who;
  RowSignature sig;
  std::copy(signer.begin(), signer.end(), who.begin());
  std::copy(signature.begin(), signature.end(), sig.begin());
  return signature_problem(row, trusted_keys_, who, sig);
}

KernelCache::~KernelCache() {
  if (db_) sqlite3_close_v2(db_);
  for (auto& [path, db] : seeds_) sqlite3_close_v2(db);
}

namespace {
std::atomic<bool> process_inspect_only{false};
}  // namespace

void KernelCache::inspect_only_process() { process_inspect_only.store(true); }

KernelCache& KernelCache::process() {
  // Closing at exit checkpoints the write-ahead log into kiln.db, so a cache directory left by a
  // finished process is one self-contained file (readable even where it cannot be written).
  return *ProcessSingleton<KernelCache>::get([] {
    return new KernelCache(default_cache_directory(), default_seed_databases(), default_cache_max_bytes(),
                           process_inspect_only.load() ? Mode::kInspect : Mode::kServe);
  });
}

void KernelCache::degrade(const std::string& category, const std::string& reason) {
  if (mode_ == Mode::kStrict) throw cache_error(reason);
  if (degraded_reason_.empty()) degraded_reason_ = reason;
  if (warned_.insert(category).second) log(LogLevel::kWarn, "kiln cache: " + reason);
}

std::string KernelCache::degraded_reason() const { return degraded_reason_; }

void KernelCache::open_writable() {
  if (mode_ == Mode::kInspect) {
    open_for_inspection();
    return;
  }
  if (auto why = prepare_cache_directory(directory_, mode_ == Mode::kServe)) {
    degrade("directory", *why + "; kernels are kept in memory only");
    return;
  }
  const std::string path = directory_ + "/kiln.db";
  if (auto why = unsafe_reason(path, false)) {
    degrade("database", *why + "; kernels are kept in memory only");
    return;
  }
  const bool network = is_network_filesystem(directory_);
  // Created by kiln, private to its user (or its sharing group) whatever the umask (SQLite would
  // use 0644 & ~umask, and a database with other modes would then be refused on the next open).
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, cache_file_mode());
  if (fd >= 0) {
    ::fchmod(fd, cache_file_mode());
    ::close(fd);
  }
  try {
    // Processes opening a new cache at once contend for the schema and journal-mode writes;
    // SQLite reports some of that contention at once rather than through the busy timeout.
    for (int attempt = 0;; ++attempt) {
      try {
        db_ = open_cache_database(path, true, network);
        break;
      } catch (const Error& e) {
        const bool contended = e.message().find("locked") != std::string::npos || e.message().find("busy") != std::string::npos;
        if (!contended || attempt >= 50) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    writable_ = true;
  } catch (const Error& writable_error) {
    // A read-only directory (or database) can still serve what it holds.
    if (std::filesystem::exists(path)) {
      try {
        db_ = open_cache_database(path, false, network);
        degrade("read-only",
                fmt::format("{} is read-only ({}); using its kernels, new ones are kept in memory only", path, writable_error.message()));
        return;
      } catch (const Error&) {
      }
    }
    degrade("open", writable_error.message() + "; kernels are kept in memory only");
  }
}

void KernelCache::open_for_inspection() {
  if (auto why = prepare_cache_directory(directory_, false)) {
    degraded_reason_ = *why;
    return;
  }
  const std::string path = directory_ + "/kiln.db";
  if (auto why = unsafe_reason(path, false)) {
    degraded_reason_ = *why;
    return;
  }
  if (!std::filesystem::exists(path)) {
    degraded_reason_ = path + " does not exist yet: no kernel has been stored here";
    return;
  }
  // A closed cache is whole in kiln.db: read it immutable, creating no journal. A live one (a
  // write-ahead log beside it, not yet folded in) reads right only through SQLite's locks, whose
  // files its writer has already made.
  const bool live = std::filesystem::exists(path + "-wal");
  try {
    db_ = open_cache_database(path, false, is_network_filesystem(directory_), !live);
  } catch (const Error& e) {
    degraded_reason_ = e.message();
  }
}

void KernelCache::open_seeds() {
  for (const auto& path : seed_paths_) {
    if (auto why = unsafe_reason(path, false)) {
      degrade("seed:" + path, "seed " + *why + "; not used");
      continue;
    }
    try {
      seeds_.emplace_back(path, open_cache_database(path, false, is_network_filesystem(path)));
    } catch (const Error& e) {
      degrade("seed:" + path, "seed " + e.message() + "; not used");
    }
  }
}

std::optional<KernelCache::Found> KernelCache::lookup(const KernelKey& key, const std::string& target, const std::string& compiler) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<uint8_t> kb = key_bytes(key);
  auto search = [&](sqlite3* db, Tier tier, const std::string& name) -> std::optional<Found> {
    try {
      Statement s(db, fmt::format("SELECT {} FROM kernels WHERE key = ?", kRowColumns).c_str());
      s.bind_blob(1, kb.data(), kb.size());
      if (!s.step()) return std::nullopt;
      CacheRow row = read_row(s);
      std::optional<std::string> problem = row_problem(s, row);
      if (!problem && row.target != target) problem = fmt::format("built for {}, not {}", row.target, target);
      if (!problem && row.compiler != compiler) problem = fmt::format("built by '{}', not '{}'", row.compiler, compiler);
      if (!problem && tier == Tier::kSeed) problem = untrusted_reason(db, row);
      if (problem) {
        counters_.bad_entries++;
        log(LogLevel::kWarn, fmt::format("kiln cache: entry {} ({}) in {} is unusable: {}; {}", key.hex(), row.kernel, name, *problem,
                                         tier == Tier::kDisk ? "dropped and rebuilt" : "ignored"));
        if (tier == Tier::kDisk && writable_) delete_key(db, key);
        return std::nullopt;
      }
      if (tier == Tier::kDisk && writable_) {
        try {  // LRU bookkeeping is best effort: a busy database must not turn a hit into a miss
          Statement touch(db, "UPDATE kernels SET last_used = ?, hits = hits + 1 WHERE key = ?");
          touch.bind(1, now_seconds()).bind_blob(2, kb.data(), kb.size());
          touch.step();
        } catch (const Error&) {
        }
      }
      return Found{std::move(row), tier};
    } catch (const Error& e) {
      degrade("lookup:" + name, fmt::format("lookup in {} failed: {}; compiling instead", name, e.message()));
      return std::nullopt;
    }
  };
  if (db_) {
    if (auto found = search(db_, Tier::kDisk, directory_ + "/kiln.db")) return found;
  }
  for (const auto& [path, db] : seeds_) {
    if (auto found = search(db, Tier::kSeed, path)) return found;
  }
  return std::nullopt;
}

std::vector<std::string> KernelCache::compiler_identities(const std::string& target) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<int64_t, std::string>> found;  // (newest row, identity)
  auto collect = [&](sqlite3* db, const std::string& name) {
    try {
      Statement s(db, "SELECT compiler, max(created) FROM kernels WHERE target = ? GROUP BY compiler");
      s.bind(1, target);
      while (s.step()) found.emplace_back(s.integer(1), s.text(0));
    } catch (const Error& e) {
      degrade("identities:" + name, fmt::format("cannot read compiler identities from {}: {}", name, e.message()));
    }
  };
  if (db_) collect(db_, directory_ + "/kiln.db");
  for (const auto& [path, db] : seeds_) collect(db, path);
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> identities;
  for (auto& [created, identity] : found) {
    if (std::find(identities.begin(), identities.end(), identity) == identities.end()) identities.push_back(std::move(identity));
  }
  return identities;
}

void KernelCache::drop(const KernelKey& key, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.bad_entries++;
  log(LogLevel::kWarn, fmt::format("kiln cache: entry {} dropped: {}", key.hex(), why));
  if (!db_ || !writable_) return;
  try {
    delete_key(db_, key);
  } catch (const Error& e) {
    degrade("write", "cannot write the cache: " + e.message());
  }
}

bool KernelCache::publish(const CacheRow& row) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!db_ || !writable_) return false;
  if (row.binary.empty()) {
    log(LogLevel::kWarn, fmt::format("kiln cache: {} for {} compiled to an empty binary; not stored", row.kernel, row.target));
    return false;
  }
  try {
    const int64_t now = now_seconds();
    Transaction t(db_);
    Statement s(db_, (std::string("INSERT OR REPLACE INTO kernels ") + kInsertColumns).c_str());
    bind_row(s, row);
    s.bind(14, now).bind(15, now).bind(16, int64_t{0});
    s.step();
    t.commit();
    counters_.bytes_written += row.binary.size();
  } catch (const Error& e) {
    degrade("write", fmt::format("cannot write {}/kiln.db ({}); new kernels are kept in memory only", directory_, e.message()));
    return false;
  }
  try {
    evict_locked(max_bytes_, &row.key);
  } catch (const Error& e) {
    degrade("evict", fmt::format("cannot evict from {}/kiln.db ({}); it may grow past its budget", directory_, e.message()));
  }
  return true;
}

std::optional<std::string> KernelCache::meta_get(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!db_) return std::nullopt;
  try {
    Statement s(db_, "SELECT value FROM meta WHERE name = ?");
    s.bind(1, name);
    if (s.step()) return s.text(0);
  } catch (const Error&) {
  }
  return std::nullopt;
}

void KernelCache::meta_put(const std::string& name, const std::string& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!db_ || !writable_) return;
  try {
    Statement s(db_, "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)");
    s.bind(1, name).bind(2, value);
    s.step();
  } catch (const Error&) {
  }
}

uint64_t KernelCache::evict_locked(uint64_t max_bytes, const KernelKey* keep) {
  Statement total(db_, "SELECT coalesce(sum(size), 0) FROM kernels");
  total.step();
  int64_t bytes = total.integer(0);
  if (static_cast<uint64_t>(bytes) <= max_bytes) return 0;
  const std::vector<uint8_t> kept = keep ? key_bytes(*keep) : std::vector<uint8_t>(16, 0);
  Statement oldest(db_, "SELECT id, size FROM kernels WHERE key != ? ORDER BY last_used ASC, id ASC");
  oldest.bind_blob(1, kept.data(), kept.size());
  std::vector<int64_t> victims;
  while (static_cast<uint64_t>(bytes) > max_bytes && oldest.step()) {
    victims.push_back(oldest.integer(0));
    bytes -= oldest.integer(1);
  }
  delete_ids(db_, victims);
  counters_.evictions += victims.size();
  return victims.size();
}

CacheStats KernelCache::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  CacheStats s;
  s.directory = directory_;
  // Inspecting, a database that is there to read counts: nothing is written in that mode anyway.
  s.persistent = db_ != nullptr && (writable_ || mode_ == Mode::kInspect);
  s.degraded_reason = degraded_reason_;
  for (const auto& [path, db] : seeds_) s.seeds.push_back(path);
  s.max_bytes = max_bytes_;
  if (db_) {
    try {
      Statement q(db_, "SELECT count(*), coalesce(sum(size), 0) FROM kernels");
      q.step();
      s.entries = static_cast<uint64_t>(q.integer(0));
      s.bytes = static_cast<uint64_t>(q.integer(1));
    } catch (const Error&) {
    }
  }
  s.memory_hits = counters_.memory_hits;
  s.disk_hits = counters_.disk_hits;
  s.seed_hits = counters_.seed_hits;
  s.misses = counters_.misses;
  s.compiles = counters_.compiles;
  s.compile_ms = static_cast<double>(counters_.compile_us.load()) / 1000.0;
  s.bytes_written = counters_.bytes_written;
  s.evictions = counters_.evictions;
  s.bad_entries = counters_.bad_entries;
  s.lock_waits = counters_.lock_waits;
  return s;
}

std::vector<CacheEntry> KernelCache::list() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CacheEntry> out;
  if (!db_) return out;
  Statement s(db_,
              "SELECT key, kernel, operator, signature, target, backend, compiler, size, hits, created, last_used, "
              "compile_ms FROM kernels ORDER BY last_used DESC, id DESC");
  while (s.step()) {
    CacheEntry e;
    e.key = key_of_blob(s.blob(0)).hex();  // as `kiln compile` and the logs print it
    e.kernel = s.text(1);
    e.op = s.text(2);
    e.signature = s.text(3);
    e.target = s.text(4);
    e.backend = s.text(5);
    e.compiler = s.text(6);
    e.size = static_cast<uint64_t>(s.integer(7));
    e.hits = static_cast<uint64_t>(s.integer(8));
    e.created = s.integer(9);
    e.last_used = s.integer(10);
    e.compile_ms = s.real(11);
    out.push_back(std::move(e));
  }
  return out;
}

CacheVerifyReport KernelCache::verify(bool repair) {
  std::lock_guard<std::mutex> lock(mutex_);
  CacheVerifyReport report;
  if (!db_) throw cache_error(fmt::format("no database in {}: {}", directory_, degraded_reason_));
  {
    Statement check(db_, "PRAGMA integrity_check");
    while (check.step()) {
      if (check.text(0) != "ok") report.problems.push_back("integrity: " + check.text(0));
    }
  }
  std::vector<int64_t> bad;
  Statement s(db_, fmt::format("SELECT {}, id FROM kernels", kRowColumns).c_str());
  while (s.step()) {
    ++report.checked;
    const CacheRow row = read_row(s);
    if (auto problem = row_problem(s, row)) {
      report.problems.push_back(fmt::format("row {} ({}, {}): {}", s.integer(13), row.kernel, row.target, *problem));
      bad.push_back(s.integer(13));
    }
  }
  if (repair && !bad.empty()) {
    if (!writable_) throw cache_error(fmt::format("{}/kiln.db is read-only; cannot repair", directory_));
    delete_ids(db_, bad);
    report.removed = bad.size();
  }
  return report;
}

uint64_t KernelCache::prune(uint64_t max_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!db_ || !writable_) throw cache_error(fmt::format("{}/kiln.db is not writable: {}", directory_, degraded_reason_));
  return evict_locked(max_bytes, nullptr);
}

void KernelCache::for_each_row(const std::string& target, const std::function<void(const CacheRow&)>& visit) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!db_) throw cache_error(fmt::format("no database in {}: {}", directory_, degraded_reason_));
  Statement rows(db_, fmt::format("SELECT {} FROM kernels WHERE (?1 = '' OR target = ?1)", kRowColumns).c_str());
  rows.bind(1, target);
  while (rows.step()) {
    const CacheRow row = read_row(rows);
    if (!row_problem(rows, row)) visit(row);  // never ship a bad row
  }
}

uint64_t KernelCache::export_to(const std::string& file, const std::string& target, const std::string& kernel,
                                const SigningKey* signing_key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!db_) throw cache_error(fmt::format("no database in {}: {}", directory_, degraded_reason_));
  if (std::filesystem::exists(file)) throw cache_error(fmt::format("export: {} exists; kiln does not overwrite files", file));
  sqlite3* out = open_cache_database(file, true, false);
  uint64_t copied = 0;
  try {
    exec(out, "PRAGMA journal_mode = DELETE");  // a bundle is one self-contained file
    Transaction t(out);
    Statement rows(db_, fmt::format("SELECT {}, created, last_used, hits FROM kernels WHERE (?1 = '' OR target = ?1) "
                                    "AND (?2 = '' OR kernel = ?2)",
                                    kRowColumns)
                            .c_str());
    rows.bind(1, target).bind(2, kernel);
    Statement ins(out, (std::string("INSERT INTO kernels ") + kInsertColumns).c_str());
    Statement sign(out, "INSERT INTO row_signatures (key, signer, signature) VALUES (?, ?, ?)");
    while (rows.step()) {
      const CacheRow row = read_row(rows);
      if (row_problem(rows, row)) continue;  // never ship a bad row
      ins.reset();
      bind_row(ins, row);
      ins.bind(14, rows.integer(13)).bind(15, rows.integer(14)).bind(16, rows.integer(15));
      ins.step();
      if (signing_key) {
        const RowSignature signature = sign_row(row, *signing_key);
        const std::vector<uint8_t> kb = key_bytes(row.key);
        sign.reset();
        sign.bind_blob(1, kb.data(), kb.size())
            .bind_blob(2, signing_key->public_key.data(), signing_key->public_key.size())
            .bind_blob(3, signature.data(), signature.size());
        sign.step();
      }
      ++copied;
    }
    t.commit();
  } catch (...) {
    sqlite3_close_v2(out);
    std::filesystem::remove(file);  // kiln created it
    throw;
  }
  sqlite3_close_v2(out);
  return copied;
}

CacheImportReport KernelCache::import_from(const std::string& file) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!db_ || !writable_) throw cache_error(fmt::format("{}/kiln.db is not writable: {}", directory_, degraded_reason_));
  if (auto why = unsafe_reason(file, false)) throw cache_error(fmt::format("import: bundle {}", *why));
  if (!trusted_keys_error_.empty()) throw cache_error("import: " + trusted_keys_error_);
  sqlite3* in = open_cache_database(file, false, is_network_filesystem(file));
  CacheImportReport report;
  try {
    Statement rows(in, fmt::format("SELECT {}, created FROM kernels", kRowColumns).c_str());
    Transaction t(db_);
    Statement ins(db_, (std::string("INSERT OR IGNORE INTO kernels ") + kInsertColumns).c_str());
    const int64_t now = now_seconds();
    while (rows.step()) {
      const CacheRow row = read_row(rows);
      std::optional<std::string> problem = row_problem(rows, row);
      if (!problem) problem = untrusted_reason(in, row);
      if (problem) {
        report.rejected.push_back(fmt::format("{} ({}): {}", row.kernel, row.target, *problem));
        continue;
      }
      ins.reset();
      bind_row(ins, row);
      ins.bind(14, rows.integer(13)).bind(15, now).bind(16, int64_t{0});
      ins.step();
      if (sqlite3_changes(db_) > 0) {
        ++report.imported;
      } else {
        ++report.already_present;
      }
    }
    t.commit();
    evict_locked(max_bytes_, nullptr);
  } catch (...) {
    sqlite3_close_v2(in);
    throw;
  }
  sqlite3_close_v2(in);
  return report;
}

}  // namespace kiln::detail
