// The on-disk cache: schema golden, verification of rows, tiers, eviction, bundles, degraded
// modes, permission refusals, and real processes racing, killed mid-compile and mid-write.
#include <gtest/gtest.h>

#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cache/cache_directory.hpp"
#include "cache/kernel_cache.hpp"
#include "cache/key_lock.hpp"
#include "cache/schema.hpp"
#include "core/env.hpp"
#include "core/process_singleton.hpp"
#include "kiln/cache.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "support/compile_race.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;
using Mode = KernelCache::Mode;

const std::string kCompiler = "nvrtc 13.0 test";

using test::file_bytes;
using test::kPrefillSig;

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt_dir();
    fs::remove_all(dir_);
    set_log_callback([this](LogLevel, const std::string& m) { warnings_.push_back(m); });
  }
  void TearDown() override {
    set_log_callback(nullptr);
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  static std::string fmt_dir() {
    return "kiln-cachetest-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  std::string dir(const std::string& sub = "cache") const { return (dir_ / sub).string(); }

  static CacheRow row(uint64_t n, const std::string& target = "sm_90a", size_t size = 1000) {
    CacheRow r;
    r.key = {n, n * 7 + 1};
    r.kernel = "k" + std::to_string(n);
    r.op = "mha_prefill";
    r.signature = "attention.prefill:head_dim=" + std::to_string(n);
    r.target = target;
    r.backend = "cuda";
    r.compiler = kCompiler;
    r.options = "-std=c++17";
    r.entry = "entry" + std::to_string(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    r.binary.resize(size);
    for (auto& b : r.binary) b = static_cast<uint8_t>(rng());
    r.compile_ms = 12.5;
    return r;
  }

  // Runs SQL directly on a database, as another program (or an attacker) would.
  static void raw_sql(const std::string& db_path, const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
  }

  // Runs the kiln command line (`environment`: VAR=value ... before it) under a time limit;
  // returns its output, stdout and stderr together.
  std::string cli(const std::string& args, int* rc, const std::string& environment = "", int timeout_s = 60) const {
    const std::string out = (dir_ / "cli.out").string();
    const int status = std::system(fmt::format("{} timeout {} {} {} > {} 2>&1", environment, timeout_s, KILN_TEST_CLI, args, out).c_str());
    *rc = WEXITSTATUS(status);
    return file_bytes(out);
  }

  bool warned(const std::string& needle) const {
    for (const auto& w : warnings_) {
      if (w.find(needle) != std::string::npos) return true;
    }
    return false;
  }

  fs::path dir_;
  std::vector<std::string> warnings_;
};

TEST(CacheSchemaGolden, VersionAndText) {
  // Changing cache/schema.sql must be deliberate: bump kSchemaVersion, add a migration, update this.
  EXPECT_EQ(kSchemaVersion, 2);
  const std::string sql = cache_schema_sql();
  EXPECT_EQ(XXH3_64bits(sql.data(), sql.size()), 12585783253748532670ull)
      << "schema.sql changed; hash now " << XXH3_64bits(sql.data(), sql.size());
}

TEST_F(CacheTest, CreatesAPrivateDirectoryAndDatabase) {
  KernelCache cache(dir("a/b/cache"), {}, 1 << 30, Mode::kServe);
  ASSERT_TRUE(cache.persistent()) << cache.degraded_reason();
  for (const std::string& p : {dir("a"), dir("a/b"), dir("a/b/cache")}) {
    EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, fs::perms::owner_all) << p;
  }
  const auto mode = fs::status(dir("a/b/cache") + "/kiln.db").permissions() & fs::perms::all;
  EXPECT_EQ(mode, fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(CacheTest, PublishedRowsAreFoundAndVerified) {
  KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
  const CacheRow r = row(1);
  EXPECT_FALSE(cache.lookup(r.key, "sm_90a", kCompiler));
  cache.publish(r);
  auto found = cache.lookup(r.key, "sm_90a", kCompiler);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->tier, KernelCache::Tier::kDisk);
  EXPECT_EQ(found->row.binary, r.binary);
  EXPECT_EQ(found->row.entry, r.entry);
  EXPECT_EQ(cache.list().front().hits, 1u);
  // A row is only ever used for the target and compiler it was built for.
  EXPECT_FALSE(cache.lookup(r.key, "sm_100a", kCompiler));
  EXPECT_TRUE(warned("built for sm_90a, not sm_100a"));
  EXPECT_EQ(cache.list().size(), 0u) << "the mismatching row is dropped";
  cache.publish(r);
  EXPECT_FALSE(cache.lookup(r.key, "sm_90a", "nvrtc 12.8 other"));
}

TEST_F(CacheTest, FlippedAndTruncatedBlobsAreDroppedAndWarned) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    cache.publish(row(1));
    cache.publish(row(2));
  }
  const std::string db = dir() + "/kiln.db";
  // Flip one byte of row 1's binary; truncate row 2's.
  raw_sql(db, "UPDATE kernels SET binary = substr(binary, 1, 10) || x'ff' || substr(binary, 12) WHERE kernel = 'k1'");
  raw_sql(db, "UPDATE kernels SET binary = substr(binary, 1, 500) WHERE kernel = 'k2'");
  EXPECT_EQ(cache_verify(false, dir()).problems.size(), 2u);
  KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(cache.lookup(row(1).key, "sm_90a", kCompiler));
  EXPECT_TRUE(warned("checksum mismatch"));
  EXPECT_FALSE(cache.lookup(row(2).key, "sm_90a", kCompiler));
  EXPECT_TRUE(warned("binary has 500 bytes, the row says 1000"));
  EXPECT_EQ(cache.counters().bad_entries.load(), 2u);
  EXPECT_TRUE(cache.list().empty());
  cache.publish(row(1));  // rebuilt
  EXPECT_TRUE(cache.lookup(row(1).key, "sm_90a", kCompiler));
}

TEST_F(CacheTest, VerifyRepairRemovesBadRows) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    for (uint64_t i = 1; i <= 3; ++i) cache.publish(row(i));
  }
  raw_sql(dir() + "/kiln.db", "UPDATE kernels SET checksum = checksum + 1 WHERE kernel = 'k2'");
  const CacheVerifyReport r = cache_verify(true, dir());
  EXPECT_EQ(r.checked, 3u);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("k2"), std::string::npos);
  EXPECT_EQ(r.removed, 1u);
  EXPECT_TRUE(cache_verify(false, dir()).problems.empty());
  EXPECT_EQ(cache_list(dir()).size(), 2u);
}

TEST_F(CacheTest, EvictsLeastRecentlyUsedFirst) {
  KernelCache cache(dir(), {}, 3500, Mode::kServe);  // room for three 1000-byte rows
  for (uint64_t i = 1; i <= 3; ++i) cache.publish(row(i));
  raw_sql(dir() + "/kiln.db",
          "UPDATE kernels SET last_used = 100 WHERE kernel = 'k1';"
          "UPDATE kernels SET last_used = 300 WHERE kernel = 'k2';"
          "UPDATE kernels SET last_used = 200 WHERE kernel = 'k3'");
  cache.publish(row(4));  // over budget: k1 (oldest) goes
  std::set<std::string> left;
  for (const auto& e : cache.list()) left.insert(e.kernel);
  EXPECT_EQ(left, (std::set<std::string>{"k2", "k3", "k4"}));
  EXPECT_EQ(cache.counters().evictions.load(), 1u);
  EXPECT_EQ(cache_prune(1500, dir()), 2u);  // keep one row: the most recently used, k4
  EXPECT_EQ(cache_list(dir()).front().kernel, "k4");
}

TEST_F(CacheTest, ExportImportRoundTripWithTargetFilter) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    cache.publish(row(1, "sm_90a"));
    cache.publish(row(2, "sm_100a"));
    cache.publish(row(3, "sm_90a"));
  }
  const std::string bundle = dir("bundle.kiln");
  EXPECT_EQ(cache_export(bundle, "sm_90a", "", dir()), 2u);
  EXPECT_THROW(cache_export(bundle, "", "", dir()), Error) << "never overwrites";
  const CacheImportReport r = cache_import(bundle, dir("other"));
  EXPECT_EQ(r.imported, 2u);
  EXPECT_TRUE(r.rejected.empty());
  EXPECT_EQ(cache_import(bundle, dir("other")).already_present, 2u);
  KernelCache other(dir("other"), {}, 1 << 30, Mode::kServe);
  auto found = other.lookup(row(3).key, "sm_90a", kCompiler);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->row.binary, row(3).binary);
  EXPECT_FALSE(other.lookup(row(2).key, "sm_100a", kCompiler));
}

TEST_F(CacheTest, ImportRejectsTamperedRowsAndForeignFiles) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    cache.publish(row(1));
    cache.publish(row(2));
  }
  const std::string bundle = dir("bundle.kiln");
  cache_export(bundle, "", "", dir());
  raw_sql(bundle, "UPDATE kernels SET binary = zeroblob(1000) WHERE kernel = 'k1'");
  raw_sql(bundle, "UPDATE kernels SET size = 5 WHERE kernel = 'k2'");
  const CacheImportReport r = cache_import(bundle, dir("other"));
  EXPECT_EQ(r.imported, 0u);
  ASSERT_EQ(r.rejected.size(), 2u);
  std::ofstream(dir("garbage.kiln")) << "this is not a database at all, just text that goes on for a while";
  EXPECT_THROW(cache_import(dir("garbage.kiln"), dir("other")), Error);
  raw_sql(dir("foreign.db"), "CREATE TABLE t (x)");
  try {
    cache_import(dir("foreign.db"), dir("other"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCacheError);
    EXPECT_NE(std::string(e.what()).find("not a kiln cache"), std::string::npos) << e.what();
  }
}

TEST_F(CacheTest, SeedTierIsReadAfterTheWritableOneAndNeverWritten) {
  {
    KernelCache seed_source(dir("seedsrc"), {}, 1 << 30, Mode::kServe);
    seed_source.publish(row(1));
    seed_source.publish(row(2));
  }
  const std::string seed = dir("seed.kiln");
  cache_export(seed, "", "", dir("seedsrc"));
  const std::string before = file_bytes(seed);
  KernelCache cache(dir(), {seed}, 1 << 30, Mode::kServe);
  auto found = cache.lookup(row(1).key, "sm_90a", kCompiler);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->tier, KernelCache::Tier::kSeed);
  cache.publish(row(1));  // now also in the writable database, which wins
  EXPECT_EQ(cache.lookup(row(1).key, "sm_90a", kCompiler)->tier, KernelCache::Tier::kDisk);
  EXPECT_FALSE(cache.lookup(row(2).key, "sm_100a", kCompiler));  // mismatch in a seed: ignored, not deleted
  EXPECT_TRUE(file_bytes(seed) == before);
  EXPECT_FALSE(fs::exists(seed + "-wal"));
}

TEST_F(CacheTest, GarbageTruncatedAndForeignDatabasesAreLeftAloneAndServedFromMemory) {
  fs::create_directories(dir());
  fs::permissions(dir(), fs::perms::owner_all);
  const std::string db = dir() + "/kiln.db";
  const std::map<std::string, std::function<void()>> cases = {
      {"garbage", [&] { std::ofstream(db) << std::string(5000, 'x'); }},
      {"truncated",
       [&] {
         {
           KernelCache c(dir(), {}, 1 << 30, Mode::kServe);
           for (uint64_t i = 1; i <= 20; ++i) c.publish(row(i, "sm_90a", 5000));
         }
         fs::resize_file(db, 1000);
       }},
      {"foreign", [&] { raw_sql(db, "CREATE TABLE t (x); PRAGMA application_id = 42"); }},
      {"newer schema",
       [&] {
         { KernelCache c(dir(), {}, 1 << 30, Mode::kServe); }
         raw_sql(db, "PRAGMA user_version = 99");
       }},
  };
  for (const auto& [name, make] : cases) {
    fs::remove(db);
    fs::remove(db + "-wal");
    fs::remove(db + "-shm");
    make();
    fs::permissions(db, fs::perms::owner_read | fs::perms::owner_write);
    const std::string before = file_bytes(db);
    warnings_.clear();
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    EXPECT_FALSE(cache.persistent()) << name;
    EXPECT_FALSE(cache.degraded_reason().empty()) << name;
    EXPECT_FALSE(cache.lookup(row(1).key, "sm_90a", kCompiler)) << name;
    cache.publish(row(1));  // no crash, no write
    EXPECT_EQ(warnings_.size(), 1u) << name << ": warns once";
    EXPECT_TRUE(file_bytes(db) == before) << name << ": the file is untouched";
    EXPECT_THROW(KernelCache(dir(), {}, 1 << 30, Mode::kStrict), Error) << name;
  }
}

TEST_F(CacheTest, RefusesWhatOtherUsersCanWrite) {
  fs::create_directories(dir());
  fs::permissions(dir(), fs::perms::all);  // 0777
  KernelCache open_dir(dir(), {}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(open_dir.persistent());
  EXPECT_NE(open_dir.degraded_reason().find("writable by other users"), std::string::npos) << open_dir.degraded_reason();
  try {
    cache_list(dir());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chmod go-w"), std::string::npos);
  }

  fs::permissions(dir(), fs::perms::owner_all);
  { KernelCache ok(dir(), {}, 1 << 30, Mode::kServe); }
  fs::permissions(dir() + "/kiln.db", fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_write);
  KernelCache open_db(dir(), {}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(open_db.persistent());
  EXPECT_NE(open_db.degraded_reason().find("kiln.db is writable by other users"), std::string::npos);

  // kiln.db as a symlink out of the cache directory.
  fs::remove(dir() + "/kiln.db");
  { KernelCache elsewhere(dir("elsewhere"), {}, 1 << 30, Mode::kServe); }
  fs::create_symlink(dir("elsewhere") + "/kiln.db", dir() + "/kiln.db");
  KernelCache linked(dir(), {}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(linked.persistent());
  EXPECT_NE(linked.degraded_reason().find("symbolic link"), std::string::npos);
}

// Whoever can write the directory that holds the cache can swap the cache; the root directory is
// no cache directory; a lock file replaced by a link turns locking off, and kiln says so.
TEST_F(CacheTest, ChecksTheDirectoryThatHoldsItTheRootAndTheLockFile) {
  fs::create_directories(dir());
  fs::permissions(dir_, fs::perms::all);  // 0777 without the sticky bit
  KernelCache swappable(dir(), {}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(swappable.persistent());
  EXPECT_NE(swappable.degraded_reason().find(dir_.string() + " is writable by other users"), std::string::npos)
      << swappable.degraded_reason();
  fs::permissions(dir_, fs::perms::all | fs::perms::sticky_bit);  // as /tmp: others cannot replace what is not theirs
  {
    KernelCache sticky(dir(), {}, 1 << 30, Mode::kServe);
    EXPECT_TRUE(sticky.persistent()) << sticky.degraded_reason();
  }
  fs::permissions(dir_, fs::perms::owner_all);

  KernelCache root("/", {}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(root.persistent());
  EXPECT_NE(root.degraded_reason().find("/ is the root directory"), std::string::npos) << root.degraded_reason();
  EXPECT_FALSE(fs::exists("/kiln.db"));

  fs::create_symlink(dir("elsewhere-locks"), dir() + "/locks");
  warnings_.clear();
  for (int i = 0; i < 2; ++i) {
    KeyLock lock(dir(), KernelKey{1, 2}, 1.0);
    EXPECT_FALSE(lock.acquired());
  }
  size_t said = 0;
  for (const auto& w : warnings_) said += w.find("locks is not a regular file (a symbolic link)") != std::string::npos;
  EXPECT_EQ(said, 1u) << "warned once";
  EXPECT_FALSE(fs::exists(dir("elsewhere-locks"))) << "the link was not followed";
  fs::remove(dir() + "/locks");
  fs::create_directory(dir() + "/locks");
  KeyLock in_directory(dir(), KernelKey{1, 2}, 1.0);
  EXPECT_FALSE(in_directory.acquired());
}

// A Kubernetes fsGroup volume: a setgid directory with group write, owned by another user of the
// group. Refused by default, naming the policy that allows it; with KILN_CACHE_SHARED=group it is
// a persistent cache whose files kiln creates group-readable and writable. Other users' write
// permission is refused under either policy.
TEST_F(CacheTest, AGroupMayShareTheCacheWhenTheOperatorSaysSo) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to give the volume another owner";
  fs::create_directories(dir());
  // The volume: owned by `nobody`, group root (a group this process is in), mode 2775.
  ASSERT_EQ(::chown(dir().c_str(), 65534, 0), 0);
  ASSERT_EQ(::chmod(dir().c_str(), 02775), 0);
  {
    KernelCache by_default(dir(), {}, 1 << 30, Mode::kServe);
    EXPECT_FALSE(by_default.persistent());
    EXPECT_NE(by_default.degraded_reason().find("KILN_CACHE_SHARED=group"), std::string::npos) << by_default.degraded_reason();
  }
  ::setenv("KILN_CACHE_SHARED", "group", 1);
  {
    KernelCache shared(dir(), {}, 1 << 30, Mode::kServe);
    EXPECT_TRUE(shared.persistent()) << shared.degraded_reason();
    EXPECT_TRUE(shared.publish(row(1)));
  }
  struct stat st {};
  ASSERT_EQ(::stat((dir() + "/kiln.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  ASSERT_EQ(::chmod(dir().c_str(), 02777), 0);  // writable by anyone: refused even for a group
  {
    KernelCache open_to_all(dir(), {}, 1 << 30, Mode::kServe);
    EXPECT_FALSE(open_to_all.persistent());
    EXPECT_NE(open_to_all.degraded_reason().find("writable by users outside its group"), std::string::npos)
        << open_to_all.degraded_reason();
  }
  ::setenv("KILN_CACHE_SHARED", "everyone", 1);
  EXPECT_THROW(cache_sharing(), Error);
  ::unsetenv("KILN_CACHE_SHARED");
}

// Commands that only read (cache stats, cache ls) create and write nothing: not the directory,
// not the database, not a journal; and they read a cache they cannot write.
TEST_F(CacheTest, ReadingCommandsCreateAndWriteNothing) {
  const CacheStats absent = cache_stats_of(dir());
  EXPECT_FALSE(absent.persistent);
  EXPECT_TRUE(cache_list(dir()).empty());
  EXPECT_FALSE(fs::exists(dir())) << "a read created the directory";
  {
    KernelCache filled(dir(), {}, 1 << 30, Mode::kServe);
    ASSERT_TRUE(filled.publish(row(1)));
  }
  const std::string db = dir() + "/kiln.db";
  const auto before = file_bytes(db);
  fs::permissions(dir(), fs::perms::owner_read | fs::perms::owner_exec);
  fs::permissions(db, fs::perms::owner_read);
  EXPECT_EQ(cache_list(dir()).size(), 1u);
  EXPECT_EQ(cache_stats_of(dir()).entries, 1u);
  fs::permissions(dir(), fs::perms::owner_all);
  EXPECT_TRUE(file_bytes(db) == before) << "a read wrote the database";
  EXPECT_FALSE(fs::exists(db + "-wal"));
  EXPECT_FALSE(fs::exists(db + "-journal"));
}

// A link in the cache directory's path (~/.cache linked to scratch) is followed; a linked
// database file is still refused.
TEST_F(CacheTest, ALinkInTheDirectoryPathWorksALinkedDatabaseDoesNot) {
  fs::create_directories(dir("real"));
  fs::permissions(dir("real"), fs::perms::owner_all);
  fs::create_directory_symlink(dir("real"), dir("linked"));
  {
    KernelCache through_link(dir("linked"), {}, 1 << 30, Mode::kServe);
    EXPECT_TRUE(through_link.persistent()) << through_link.degraded_reason();
    ASSERT_TRUE(through_link.publish(row(1)));
  }
  EXPECT_TRUE(fs::is_regular_file(dir("real") + "/kiln.db"));
  KernelCache direct(dir("real"), {}, 1 << 30, Mode::kServe);
  EXPECT_TRUE(direct.lookup(row(1).key, "sm_90a", kCompiler).has_value());
  fs::rename(dir("real") + "/kiln.db", dir() + "-moved.db");
  fs::create_symlink(dir() + "-moved.db", dir("real") + "/kiln.db");
  KernelCache linked_db(dir("linked"), {}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(linked_db.persistent());
  EXPECT_NE(linked_db.degraded_reason().find("symbolic link"), std::string::npos) << linked_db.degraded_reason();
}

TEST(CacheDirectory, SizesTakeBinaryUnits) {
  EXPECT_EQ(parse_size("1048576", "X"), 1048576);
  EXPECT_EQ(parse_size("4G", "X"), int64_t{4} << 30);
  EXPECT_EQ(parse_size("512MiB", "X"), int64_t{512} << 20);
  EXPECT_EQ(parse_size("3kb", "X"), 3072);
  for (const char* bad : {"", "G", "-1", "1.5G", "4X", "4GB2", "99999999999T", "1234567890123456789"}) {
    EXPECT_THROW(parse_size(bad, "KILN_CACHE_MAX_BYTES"), Error) << bad;
  }
}

TEST(CacheDirectory, NetworkFilesystemsAreRecognized) {
  EXPECT_TRUE(is_network_filesystem_magic(0x6969));       // NFS
  EXPECT_TRUE(is_network_filesystem_magic(0x0bd00bd0));   // Lustre
  EXPECT_TRUE(is_network_filesystem_magic(0x47504653));   // GPFS
  EXPECT_FALSE(is_network_filesystem_magic(0xef53));      // ext4
  EXPECT_FALSE(is_network_filesystem_magic(0x01021994));  // tmpfs
}

// The per-process objects (KernelCache::process, RemoteTier::process): one per process, a fresh
// one in a child after fork() that the child deletes at exit, the parent's untouched; a make
// that throws is tried again, one that returns null is not.
struct SingletonProbe {
  explicit SingletonProbe(std::string deleted_marker) : marker(std::move(deleted_marker)) {}
  ~SingletonProbe() {
    if (!marker.empty()) std::ofstream(marker) << ::getpid();
  }
  std::string marker;
};
struct ThrowingProbe {};
struct NullProbe {};

TEST(ProcessSingleton, OnePerProcessRemadeAfterForkDeletedAtExit) {
  int makes = 0;
  auto make = [&] {
    ++makes;
    return new SingletonProbe("");
  };
  SingletonProbe* first = ProcessSingleton<SingletonProbe>::get(make);
  EXPECT_EQ(ProcessSingleton<SingletonProbe>::get(make), first);
  EXPECT_EQ(makes, 1);
  const std::string marker = testing::TempDir() + "/kiln-singleton-" + std::to_string(::getpid());
  fs::remove(marker);
  const pid_t child = fork();
  if (child == 0) {
    SingletonProbe* mine = ProcessSingleton<SingletonProbe>::get([&] { return new SingletonProbe(marker); });
    std::exit(mine != first && mine->marker == marker ? 0 : 1);  // std::exit runs the deleting handler
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(fs::exists(marker)) << "the child's object was not deleted at its exit";
  EXPECT_EQ(ProcessSingleton<SingletonProbe>::get(make), first);
  EXPECT_EQ(makes, 1);

  EXPECT_THROW(ProcessSingleton<ThrowingProbe>::get([]() -> ThrowingProbe* { throw std::runtime_error("no"); }), std::runtime_error);
  EXPECT_NE(ProcessSingleton<ThrowingProbe>::get([] { return new ThrowingProbe; }), nullptr);
  EXPECT_EQ(ProcessSingleton<NullProbe>::get([]() -> NullProbe* { return nullptr; }), nullptr);
  EXPECT_EQ(ProcessSingleton<NullProbe>::get([] { return new NullProbe; }), nullptr);
}

TEST_F(CacheTest, WriterKilledMidTransactionLeavesNoPartialRowAndNoLock) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    cache.publish(row(1));
  }
  const std::string db = dir() + "/kiln.db";
  const pid_t child = fork();
  if (child == 0) {
    sqlite3* raw = nullptr;
    sqlite3_open(db.c_str(), &raw);
    sqlite3_exec(raw,
                 "BEGIN IMMEDIATE; INSERT INTO kernels (key, kernel, operator, signature, target, backend, compiler, "
                 "options, entry, binary, size, checksum, compile_ms, created, last_used) VALUES (x'00112233445566778899aabbccddeeff',"
                 " 'partial', 'op', 's', 'sm_90a', 'cuda', 'c', '', 'e', zeroblob(100000), 100000, 0, 0, 0, 0)",
                 nullptr, nullptr, nullptr);
    ::kill(::getpid(), SIGKILL);  // holding the write lock, uncommitted
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
  ASSERT_TRUE(cache.persistent());
  const auto start = std::chrono::steady_clock::now();
  cache.publish(row(2));  // the dead writer's lock is gone
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  std::set<std::string> kernels;
  for (const auto& e : cache.list()) kernels.insert(e.kernel);
  EXPECT_EQ(kernels, (std::set<std::string>{"k1", "k2"}));
  EXPECT_TRUE(cache_verify(false, dir()).problems.empty());
}

// ---- real kiln processes ------------------------------------------------------------------------

// Every process on the one cache directory `cache_dir`, their output files beside it.
std::vector<std::string> race(const std::string& cache_dir, const std::vector<std::string>& sigs, const std::string& env = "") {
  return test::race_compiles(
      fs::path(cache_dir).parent_path(), sigs, [&](size_t) { return cache_dir; }, env);
}

TEST_F(CacheTest, SixteenProcessesOneKeyCompileOnce) {
  fs::create_directories(dir_);
  const auto origins = race(dir(), std::vector<std::string>(16, kPrefillSig));
  EXPECT_EQ(std::count(origins.begin(), origins.end(), "compiled"), 1) << ::testing::PrintToString(origins);
  EXPECT_EQ(std::count(origins.begin(), origins.end(), "disk"), 15) << ::testing::PrintToString(origins);
  EXPECT_EQ(cache_list(dir()).size(), 1u);
}

TEST_F(CacheTest, SixteenProcessesFourKeysCompileEachOnce) {
  fs::create_directories(dir_);
  std::vector<std::string> sigs;
  for (int i = 0; i < 16; ++i) {
    sigs.push_back(fmt::format("dtype=bf16,head_dim={},group=4,causal=1,window=0,sinks=0,softcap=0,lse=0", 32 * (1 + i % 4)));
  }
  const auto origins = race(dir(), sigs);
  EXPECT_EQ(std::count(origins.begin(), origins.end(), "compiled"), 4) << ::testing::PrintToString(origins);
  EXPECT_EQ(std::count(origins.begin(), origins.end(), "disk"), 12) << ::testing::PrintToString(origins);
  EXPECT_EQ(cache_list(dir()).size(), 4u);
}

TEST_F(CacheTest, ProcessKilledMidCompileLeavesNoLock) {
  fs::create_directories(dir());
  fs::permissions(dir(), fs::perms::owner_all);
  // A process whose compile hangs (the fake worker) holds the key's lock; kill -9 its group.
  const std::string cmd = fmt::format(
      "KILN_CACHE_DIR={} KILN_COMPILE_WORKER={} setsid {} compile mha_prefill --target sm_90a --sig {} "
      "> /dev/null 2>&1 & echo $!",
      dir(), KILN_TEST_FAKE_WORKER_HANG, KILN_TEST_CLI, kPrefillSig);
  FILE* p = popen(cmd.c_str(), "r");
  int pid = 0;
  ASSERT_EQ(fscanf(p, "%d", &pid), 1);
  pclose(p);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // it is compiling, lock held
  ASSERT_EQ(::kill(-pid, SIGKILL), 0);
  const auto start = std::chrono::steady_clock::now();
  const auto origins = race(dir(), {kPrefillSig});
  EXPECT_EQ(origins, std::vector<std::string>{"compiled"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  EXPECT_TRUE(cache_verify(false, dir()).problems.empty());
}

TEST_F(CacheTest, FullDiskKeepsServingFromMemory) {
  fs::create_directories(dir_);
  // A file-size limit of 48 KiB: the database can be created but the 15 KiB CUBIN row cannot be
  // written. SIGXFSZ is ignored so the write fails with EFBIG, as on a full disk.
  const std::string cmd = fmt::format(
      "bash -c 'trap \"\" XFSZ; ulimit -f 48; KILN_CACHE_DIR={} {} compile mha_prefill --target sm_90a "
      "--json --sig {} > {}/out 2> {}/err'",
      dir(), KILN_TEST_CLI, kPrefillSig, dir_.string(), dir_.string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << file_bytes(dir_.string() + "/err");
  EXPECT_EQ(nlohmann::json::parse(file_bytes(dir_.string() + "/out"))["origin"], "compiled");
  const std::string err = file_bytes(dir_.string() + "/err");
  EXPECT_NE(err.find("kept in memory only"), std::string::npos) << err;
  EXPECT_TRUE(cache_verify(false, dir()).problems.empty());
}

// Files as the operator names them: a FIFO is refused at once (it used to block the import
// forever), a bundle whose name holds URI characters opens that very file, and `cache ls` prints a
// key as `compile` does.
TEST_F(CacheTest, BundleFilesAreRegularFilesNamedExactlyAndKeysPrintAlike) {
  fs::create_directories(dir_);
  int rc = -1;
  const std::string compiled =
      cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("a"), kPrefillSig), &rc);
  ASSERT_EQ(rc, 0) << compiled;
  const std::string listed = cli(fmt::format("--cache {} cache ls --json", dir("a")), &rc);
  ASSERT_EQ(rc, 0) << listed;
  EXPECT_EQ(nlohmann::json::parse(listed).at("entries").at(0).at("key"), nlohmann::json::parse(compiled).at("key"));

  const std::string odd = (dir_ / "pct%41?x#y.kiln").string();
  std::string out = cli(fmt::format("--cache {} cache export '{}'", dir("a"), odd), &rc);
  ASSERT_EQ(rc, 0) << out;
  out = cli(fmt::format("--cache {} cache import '{}'", dir("b"), odd), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("imported 1 entries"), std::string::npos) << out;

  const std::string fifo = (dir_ / "pipe.kiln").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  out = cli(fmt::format("--cache {} cache import {}", dir("b"), fifo), &rc);
  EXPECT_EQ(rc, 6) << out;
  EXPECT_NE(out.find("not a regular file"), std::string::npos) << out;
}

// The operator's signing workflow through the command line, on a kernel NVRTC really compiled:
// keygen on the build box, export --sign, import on a node that trusts the key, served from disk.
TEST_F(CacheTest, SignedBundleWorkflowThroughTheCommandLine) {
  fs::create_directories(dir_);
  int rc = -1;
  std::string out =
      cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("build"), kPrefillSig), &rc, "", 120);
  ASSERT_EQ(rc, 0) << out;
  out = cli(fmt::format("cache keygen {}", dir("release")), &rc, "", 120);
  ASSERT_EQ(rc, 0) << out;
  const std::string key = file_bytes(dir("release.pub")).substr(0, 64);
  EXPECT_NE(out.find("KILN_CACHE_TRUSTED_KEYS=" + key), std::string::npos) << out;
  out = cli(fmt::format("--cache {} cache export {} --sign {}", dir("build"), dir("signed.kiln"), dir("release.key")), &rc, "", 120);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("exported 1 entries"), std::string::npos) << out;
  out = cli(fmt::format("--cache {} cache export {}", dir("build"), dir("plain.kiln")), &rc, "", 120);
  ASSERT_EQ(rc, 0) << out;

  const std::string trusting = "KILN_CACHE_TRUSTED_KEYS=" + key;
  out = cli(fmt::format("--cache {} cache import {}", dir("node"), dir("plain.kiln")), &rc, "", 120);
  EXPECT_EQ(rc, 0) << "without keys an unsigned bundle imports: " << out;
  out = cli(fmt::format("--cache {} cache import {}", dir("node2"), dir("plain.kiln")), &rc, trusting);
  EXPECT_EQ(rc, 6) << out;
  EXPECT_NE(out.find("not signed"), std::string::npos) << out;
  out = cli(fmt::format("--cache {} cache import {}", dir("node3"), dir("signed.kiln")), &rc, trusting);
  ASSERT_EQ(rc, 0) << out;
  out = cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("node3"), kPrefillSig), &rc, trusting);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["origin"], "disk") << "served as imported, not recompiled";
}

TEST_F(CacheTest, ReadOnlyDirectoryServesWhatItHoldsAndCompilesTheRest) {
  fs::create_directories(dir_);
  ASSERT_EQ(race(dir(), {kPrefillSig}), std::vector<std::string>{"compiled"});
  // Another user can read but not write this root-owned 0755 directory: as far as that user is
  // concerned it is read-only. setpriv switches to `nobody` for the child process.
  fs::permissions(dir_,
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(dir(),
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(dir() + "/kiln.db", fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  if (::geteuid() != 0 || std::system("command -v setpriv > /dev/null") != 0) GTEST_SKIP() << "needs root and setpriv";
  const std::string out = "/tmp/kiln-ro-" + std::to_string(::getpid());
  fs::create_directories(out);
  fs::permissions(out, fs::perms::all);
  auto run_as_nobody = [&](const std::string& sig, const std::string& tag) {
    const std::string cmd = fmt::format(
        "setpriv --reuid=nobody --regid=nogroup --clear-groups env HOME=/nonexistent KILN_CACHE_DIR={} "
        "KILN_COMPILE_ISOLATION=inprocess {} compile mha_prefill --target sm_90a --json --sig {} > {}/{}.out 2> {}/{}.err",
        dir(), KILN_TEST_CLI, sig, out, tag, out, tag);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << file_bytes(out + "/" + tag + ".err");
    return nlohmann::json::parse(file_bytes(out + "/" + tag + ".out"))["origin"].get<std::string>();
  };
  EXPECT_EQ(run_as_nobody(kPrefillSig, "hit"), "disk");
  EXPECT_EQ(run_as_nobody("dtype=f16,head_dim=64,group=4,causal=1,window=0,sinks=0,softcap=0,lse=0", "miss"), "compiled");
  EXPECT_NE(file_bytes(out + "/miss.err").find("read-only"), std::string::npos) << file_bytes(out + "/miss.err");
  EXPECT_EQ(cache_list(dir()).size(), 1u) << "nothing was written by the read-only user";
  fs::remove_all(out);
}

// ---- signed bundles and seeds (Ed25519 through libsodium) ---------------------------------------

// Rewrites a bundle row's binary with its size and XXH3 checksum made to match, as someone who
// wants kiln to load other code would: only a signature can tell.
void forge_binary(const std::string& bundle, const std::string& kernel, const std::vector<uint8_t>& binary) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(bundle.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE kernels SET binary = ?, size = ?, checksum = ? WHERE kernel = ?", -1, &st, nullptr), SQLITE_OK);
  sqlite3_bind_blob(st, 1, binary.data(), static_cast<int>(binary.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, static_cast<sqlite3_int64>(binary.size()));
  sqlite3_bind_int64(st, 3, static_cast<sqlite3_int64>(XXH3_64bits(binary.data(), binary.size())));
  sqlite3_bind_text(st, 4, kernel.c_str(), -1, SQLITE_TRANSIENT);
  EXPECT_EQ(sqlite3_step(st), SQLITE_DONE);
  EXPECT_EQ(sqlite3_changes(db), 1);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

bool any_contains(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& line : lines) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST_F(CacheTest, VerifyWithoutRepairOnlyReads) {
  EXPECT_THROW(cache_verify(false, dir("absent")), Error);
  EXPECT_FALSE(fs::exists(dir("absent"))) << "verify created the directory it was asked about";
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    cache.publish(row(1));
  }
  std::vector<std::string> before;
  for (const auto& e : fs::directory_iterator(dir())) before.push_back(e.path().filename().string());
  const CacheVerifyReport r = cache_verify(false, dir());
  EXPECT_EQ(r.checked, 1u);
  EXPECT_TRUE(r.problems.empty());
  std::vector<std::string> after;
  for (const auto& e : fs::directory_iterator(dir())) after.push_back(e.path().filename().string());
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, before) << "verify without --repair wrote a file";
}

TEST_F(CacheTest, SchemaOneDatabasesGainRowSignaturesAndKeepTheirRows) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    cache.publish(row(1));
  }
  raw_sql(dir() + "/kiln.db", "DROP TABLE row_signatures; PRAGMA user_version = 1;");
  KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
  ASSERT_TRUE(cache.persistent()) << cache.degraded_reason();
  EXPECT_TRUE(cache.lookup(row(1).key, "sm_90a", kCompiler));
  cache_export(dir("signed.kiln"), "", "", dir());  // the bundle has the table too
  raw_sql(dir() + "/kiln.db", "SELECT count(*) FROM row_signatures");
  raw_sql(dir("signed.kiln"), "SELECT count(*) FROM row_signatures");
  // Bundles and seeds written by a kiln of schema 1 are read as they are (read-only, never upgraded).
  const std::string old_bundle = dir("schema1.kiln");
  cache_export(old_bundle, "", "", dir());
  raw_sql(old_bundle, "DROP TABLE row_signatures; PRAGMA user_version = 1;");
  EXPECT_EQ(cache_import(old_bundle, dir("importer")).imported, 1u);
  KernelCache seeded(dir("seeded"), {old_bundle}, 1 << 30, Mode::kServe);
  EXPECT_TRUE(seeded.lookup(row(1).key, "sm_90a", kCompiler));
  ScopedEnv trusted("KILN_CACHE_TRUSTED_KEYS", std::string(64, 'c'));
  KernelCache trusting(dir("trusting"), {old_bundle}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(trusting.lookup(row(1).key, "sm_90a", kCompiler)) << "a schema-1 row carries no signature";
}

TEST_F(CacheTest, ImportTakesOnlyRowsSignedByATrustedKeyWhenKeysAreSet) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    for (uint64_t n = 1; n <= 3; ++n) cache.publish(row(n));
  }
  fs::create_directories(dir("keys"));
  const std::string build_key = cache_keygen(dir("keys/build"));
  const std::string other_key = cache_keygen(dir("keys/other"));
  EXPECT_EQ(build_key.size(), 64u);
  struct stat st {};
  ASSERT_EQ(::stat(dir("keys/build.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the secret key is the owner's alone";
  const std::string signed_bundle = dir("signed.kiln"), plain = dir("plain.kiln"), by_other = dir("other.kiln");
  EXPECT_EQ(cache_export(signed_bundle, "", "", dir(), dir("keys/build.key")), 3u);
  EXPECT_EQ(cache_export(plain, "", "", dir()), 3u);
  EXPECT_EQ(cache_export(by_other, "", "", dir(), dir("keys/other.key")), 3u);
  const std::string forged = dir("forged.kiln");
  fs::copy_file(signed_bundle, forged);
  forge_binary(forged, "k2", row(9).binary);

  // Without trusted keys a forged row with a matching checksum is indistinguishable: imported.
  EXPECT_EQ(cache_import(forged, dir("open")).imported, 3u);

  ScopedEnv trusted("KILN_CACHE_TRUSTED_KEYS", build_key + "," + dir("keys/unused.pub"));
  std::ofstream(dir("keys/unused.pub")) << other_key.substr(0, 60) << "\n";
  EXPECT_THROW(cache_import(signed_bundle, dir("a")), Error) << "a .pub file without a whole key is an error";
  std::ofstream(dir("keys/unused.pub"), std::ios::trunc) << std::string(64, 'a') << "\n";

  CacheImportReport r = cache_import(signed_bundle, dir("a"));
  EXPECT_EQ(r.imported, 3u);
  EXPECT_TRUE(r.rejected.empty());
  KernelCache imported(dir("a"), {}, 1 << 30, Mode::kServe);
  ASSERT_TRUE(imported.lookup(row(2).key, "sm_90a", kCompiler));
  EXPECT_EQ(imported.lookup(row(2).key, "sm_90a", kCompiler)->row.binary, row(2).binary);

  r = cache_import(plain, dir("b"));
  EXPECT_EQ(r.imported, 0u);
  ASSERT_EQ(r.rejected.size(), 3u);
  EXPECT_TRUE(any_contains(r.rejected, "not signed")) << r.rejected[0];

  r = cache_import(forged, dir("c"));
  EXPECT_EQ(r.imported, 2u);
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_TRUE(any_contains(r.rejected, "k2")) << r.rejected[0];
  EXPECT_TRUE(any_contains(r.rejected, "does not verify")) << r.rejected[0];
  KernelCache after_forgery(dir("c"), {}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(after_forgery.lookup(row(2).key, "sm_90a", kCompiler));

  r = cache_import(by_other, dir("d"));
  EXPECT_EQ(r.imported, 0u);
  EXPECT_TRUE(any_contains(r.rejected, "not in KILN_CACHE_TRUSTED_KEYS")) << r.rejected[0];
}

TEST_F(CacheTest, SeedsServeOnlySignedRowsWhenKeysAreSet) {
  {
    KernelCache source(dir("source"), {}, 1 << 30, Mode::kServe);
    source.publish(row(1));
  }
  fs::create_directories(dir("keys"));
  const std::string key = cache_keygen(dir("keys/build"));
  const std::string signed_seed = dir("signed.kiln"), plain_seed = dir("plain.kiln");
  cache_export(signed_seed, "", "", dir("source"), dir("keys/build.key"));
  cache_export(plain_seed, "", "", dir("source"));
  ScopedEnv trusted("KILN_CACHE_TRUSTED_KEYS", dir("keys/build.pub"));
  {
    KernelCache cache(dir("one"), {signed_seed}, 1 << 30, Mode::kServe);
    auto found = cache.lookup(row(1).key, "sm_90a", kCompiler);
    ASSERT_TRUE(found);
    EXPECT_EQ(found->tier, KernelCache::Tier::kSeed);
  }
  {
    KernelCache cache(dir("two"), {plain_seed}, 1 << 30, Mode::kServe);
    EXPECT_FALSE(cache.lookup(row(1).key, "sm_90a", kCompiler));
    EXPECT_TRUE(warned("not signed")) << "the skipped seed row is named in a warning";
  }
  forge_binary(signed_seed, "k1", row(5).binary);
  KernelCache cache(dir("three"), {signed_seed}, 1 << 30, Mode::kServe);
  EXPECT_FALSE(cache.lookup(row(1).key, "sm_90a", kCompiler));
  EXPECT_TRUE(warned("does not verify"));
}

TEST_F(CacheTest, KeysAndBundlesOthersCanWriteAreRefusedByName) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    cache.publish(row(1));
  }
  fs::create_directories(dir("keys"));
  cache_keygen(dir("keys/build"));
  EXPECT_THROW(cache_keygen(dir("keys/build")), Error) << "never overwrites a key";
  ASSERT_EQ(::chmod(dir("keys/build.key").c_str(), 0644), 0);
  try {
    cache_export(dir("b.kiln"), "", "", dir(), dir("keys/build.key"));
    FAIL() << "a secret key others can read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir("b.kiln")));
  const std::string bundle = dir("plain.kiln");
  cache_export(bundle, "", "", dir());
  ASSERT_EQ(::chmod(bundle.c_str(), 0666), 0);
  try {
    cache_import(bundle, dir("other"));
    FAIL() << "a bundle anyone can write";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCacheError);
    EXPECT_NE(std::string(e.what()).find("bundle"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::chmod(bundle.c_str(), 0644), 0);
  ScopedEnv garbage("KILN_CACHE_TRUSTED_KEYS", "not-a-key");
  try {
    cache_import(bundle, dir("other"));
    FAIL() << "unreadable trusted keys";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CACHE_TRUSTED_KEYS"), std::string::npos) << e.what();
  }
  KernelCache serving(dir("serving"), {bundle}, 1 << 30, Mode::kServe);  // serving degrades, closed
  EXPECT_FALSE(serving.lookup(row(1).key, "sm_90a", kCompiler));
}

TEST_F(CacheTest, TrustedKeysWithoutLibsodiumTrustNothing) {
  {
    KernelCache cache(dir(), {}, 1 << 30, Mode::kServe);
    cache.publish(row(1));
  }
  const std::string bundle = dir("plain.kiln");
  cache_export(bundle, "", "", dir());
  ScopedEnv trusted("KILN_CACHE_TRUSTED_KEYS", std::string(64, 'b'));
  ScopedEnv no_sodium("KILN_LIBSODIUM", "/nonexistent/libsodium.so");
  const CacheImportReport r = cache_import(bundle, dir("other"));  // unsigned: refused before any verification
  EXPECT_EQ(r.imported, 0u);
  try {
    cache_keygen(dir("k"));
    FAIL() << "keygen without libsodium";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libsodium"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::detail
