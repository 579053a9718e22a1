// The remote (Redis) tier against a real redis-server per test: entries verified before use,
// signatures, leases, faults (dead, restarted, wrong password, full, slow, killed mid-transfer,
// garbage), and real kiln processes on several "nodes" (cache directories) sharing one server.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cache/remote_tier.hpp"
#include "cache/row_signing.hpp"
#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "support/compile_race.hpp"
#include "support/redis_server.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using test::RedisServer;

using test::file_bytes;
using test::kPrefillSig;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

class RemoteCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(RedisServer::installed()) << "redis-server is not installed: scripts/install-deps.sh installs it (Debian: redis-server)";
    dir_ = fs::temp_directory_path() /
           ("kiln-remotetest-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    set_log_callback([this](LogLevel, const std::string& m) {
      std::lock_guard<std::mutex> lock(log_mutex_);
      log_.push_back(m);
    });
  }
  void TearDown() override {
    set_log_callback(nullptr);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir(const std::string& sub) const { return (dir_ / sub).string(); }

  bool logged(const std::string& needle) {
    std::lock_guard<std::mutex> lock(log_mutex_);
    return std::any_of(log_.begin(), log_.end(), [&](const std::string& m) { return m.find(needle) != std::string::npos; });
  }

  static RemoteSettings settings(const RedisServer& server, const std::string& password = "") {
    RemoteSettings s;
    s.endpoint = server.endpoint(password);
    s.prefix = "test:";
    s.lease = milliseconds(1000);
    s.cooldown = milliseconds(0);
    return s;
  }

  static CacheRow row(uint64_t n, size_t size = 4000) {
    CacheRow r;
    r.key = {n, n * 7 + 1};
    r.kernel = "k" + std::to_string(n);
    r.op = "mha_prefill";
    r.signature = "attention.prefill:head_dim=" + std::to_string(n);
    r.target = "sm_90a";
    r.backend = "cuda";
    r.compiler = "nvrtc 13.0 test";
    r.options = "-std=c++17";
    r.entry = "entry" + std::to_string(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    r.binary.resize(size);
    for (auto& b : r.binary) b = static_cast<uint8_t>(rng());
    r.compile_ms = 12.5;
    return r;
  }

  // Runs the kiln command line under a time limit (`environment`: VAR=value ... before it);
  // returns stdout, and stderr in *err.
  std::string cli(const std::string& args, int* rc, const std::string& environment, std::string* err = nullptr, int timeout_s = 120) const {
    static int n = 0;
    const std::string out = (dir_ / fmt::format("cli.{}.out", ++n)).string();
    const std::string errors = out + ".err";
    const int status = std::system(
        fmt::format("ASAN_OPTIONS=detect_leaks=0 {} timeout {} {} {} > {} 2> {}", environment, timeout_s, KILN_TEST_CLI, args, out, errors)
            .c_str());
    *rc = WEXITSTATUS(status);
    last_err_ = file_bytes(errors);
    if (err != nullptr) *err = last_err_;
    return file_bytes(out);
  }

  fs::path dir_;
  mutable std::string last_err_;  // the last command's stderr
  std::mutex log_mutex_;
  std::vector<std::string> log_;
};

// ---- the tier in this process -----------------------------------------------------------------

TEST_F(RemoteCacheTest, EntriesRoundTripAndOnlyTheRightOnesLoad) {
  RedisServer server(dir("redis"));
  RemoteTier tier(settings(server));
  const CacheRow r = row(1);
  tier.publish_now(r, nullptr);
  auto got = tier.fetch(r.key, r.target, r.compiler);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->binary, r.binary);
  EXPECT_EQ(got->entry, r.entry);
  EXPECT_EQ(got->signature, r.signature);
  EXPECT_FALSE(tier.fetch(row(2).key, r.target, r.compiler)) << "absent";
  EXPECT_FALSE(tier.fetch(r.key, "sm_100a", r.compiler)) << "another target";
  EXPECT_FALSE(tier.fetch(r.key, r.target, "nvrtc 12.9 test")) << "another compiler";
  EXPECT_EQ(tier.counters().refused, 2u);
  EXPECT_TRUE(logged("built for sm_90a, not sm_100a"));
  EXPECT_EQ(tier.compiler_identities("sm_90a"), std::vector<std::string>{r.compiler});
}

TEST_F(RemoteCacheTest, GarbageTruncatedAndForgedEntriesAreRefused) {
  RedisServer server(dir("redis"));
  RemoteTier tier(settings(server));
  const CacheRow r = row(3);
  const std::string key = "test:row:" + r.key.hex();
  const std::string good = encode_remote_entry(r, nullptr);
  struct Case {
    std::string name, value, why;
  };
  std::string flipped = good;
  flipped[flipped.size() - 10] ^= 0x40;                      // a bit of the binary: the checksum no longer matches
  std::string moved = encode_remote_entry(row(4), nullptr);  // another key's entry under this key
  const std::vector<Case> cases = {{"garbage", "hello world", "not a kiln entry"},
                                   {"truncated", good.substr(0, good.size() / 2), "truncated"},
                                   {"trailing", good + "x", "truncated"},
                                   {"flipped", flipped, "checksum"},
                                   {"moved", moved, "another key"},
                                   {"empty", "", "not a kiln entry"}};
  for (const Case& c : cases) {
    server.admin({"SET", key, c.value});
    EXPECT_FALSE(tier.fetch(r.key, r.target, r.compiler)) << c.name;
  }
  // Another type under the key: Redis answers WRONGTYPE.
  server.admin({"DEL", key});
  server.admin({"HSET", key, "a", "b"});
  EXPECT_FALSE(tier.fetch(r.key, r.target, r.compiler));
  EXPECT_GE(tier.counters().refused, cases.size() - 1);
  // Refusals are warned about once per key.
  EXPECT_TRUE(logged("refused the entry for key " + r.key.hex()));
  // The honest row, published again, replaces what was there.
  server.admin({"DEL", key});
  tier.publish_now(r, nullptr);
  EXPECT_TRUE(tier.fetch(r.key, r.target, r.compiler));
}

TEST_F(RemoteCacheTest, WithTrustedKeysOnlyEntriesSignedByThemLoad) {
  RedisServer server(dir("redis"));
  const PublicKey trusted_public = generate_signing_key(dir("release"));
  generate_signing_key(dir("other"));
  const SigningKey release = read_signing_key(dir("release.key"));
  const SigningKey other = read_signing_key(dir("other.key"));
  RemoteSettings s = settings(server);
  s.trusted_keys = {trusted_public};
  RemoteTier tier(s);
  RemoteTier publisher(settings(server));

  const CacheRow unsigned_row = row(5);
  publisher.publish_now(unsigned_row, nullptr);
  EXPECT_FALSE(tier.fetch(unsigned_row.key, unsigned_row.target, unsigned_row.compiler));
  EXPECT_TRUE(logged("not signed"));

  const CacheRow signed_row = row(6);
  publisher.publish_now(signed_row, &release);
  EXPECT_TRUE(tier.fetch(signed_row.key, signed_row.target, signed_row.compiler));

  const CacheRow stranger = row(7);
  publisher.publish_now(stranger, &other);
  EXPECT_FALSE(tier.fetch(stranger.key, stranger.target, stranger.compiler));

  // Tampered: another binary with its own (valid) checksum, under the trusted signature.
  CacheRow forged = signed_row;
  forged.binary[0] ^= 1;
  const std::string good = encode_remote_entry(signed_row, &release);
  const std::string swapped = encode_remote_entry(forged, nullptr);
  auto decoded_good = std::get<DecodedEntry>(decode_remote_entry(good));
  // Rebuild the forged entry with the genuine signature fields.
  std::string tampered = swapped;
  const size_t binary_field = tampered.size() - forged.binary.size() - 4;
  const size_t signature_fields = binary_field - 8;  // two empty fields (4-byte lengths)
  std::string signature_bytes;
  auto put = [&](const void* p, uint32_t n) {
    signature_bytes.append(reinterpret_cast<const char*>(&n), 4);
    signature_bytes.append(static_cast<const char*>(p), n);
  };
  put(decoded_good.signature->first.data(), 32);
  put(decoded_good.signature->second.data(), 64);
  tampered.replace(signature_fields, 8, signature_bytes);
  ASSERT_TRUE(std::holds_alternative<DecodedEntry>(decode_remote_entry(tampered)));
  server.admin({"SET", "test:row:" + signed_row.key.hex(), tampered});
  EXPECT_FALSE(tier.fetch(signed_row.key, signed_row.target, signed_row.compiler));
  EXPECT_EQ(tier.counters().hits, 0u) << "fetch() does not count hits; the pipeline does";
  EXPECT_EQ(tier.counters().refused, 3u);
}

TEST_F(RemoteCacheTest, OneLeaseHolderAndItsReleaseAfterThePublish) {
  RedisServer server(dir("redis"));
  RemoteTier a(settings(server));
  RemoteTier b(settings(server));
  const CacheRow r = row(8);
  EXPECT_EQ(a.take_lease(r.key), RemoteTier::Lease::kTaken);
  EXPECT_EQ(b.take_lease(r.key), RemoteTier::Lease::kHeldElsewhere);
  EXPECT_TRUE(b.lease_held(r.key));
  // Renewed while held: still there well past its 1 s life.
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_TRUE(b.lease_held(r.key));
  a.publish_later(r);
  const auto start = Clock::now();
  while (b.lease_held(r.key) && seconds_since(start) < 5) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(b.lease_held(r.key));
  EXPECT_TRUE(b.fetch(r.key, r.target, r.compiler)) << "the row is written before the lease goes";
  // B cannot release A's lease: only the holder's token does.
  EXPECT_EQ(a.take_lease(row(9).key), RemoteTier::Lease::kTaken);
  b.release_lease(row(9).key);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_TRUE(b.lease_held(row(9).key));
}

TEST_F(RemoteCacheTest, DeadAndRestartedServerNeverStallsACaller) {
  auto server = std::make_unique<RedisServer>(dir("redis"));
  RemoteSettings s = settings(*server);
  s.cooldown = milliseconds(300);
  RemoteTier tier(s);
  const CacheRow r = row(10);
  tier.publish_now(r, nullptr);
  server->kill(SIGKILL);
  auto start = Clock::now();
  EXPECT_FALSE(tier.fetch(r.key, r.target, r.compiler));
  EXPECT_FALSE(tier.fetch(r.key, r.target, r.compiler));  // skipped: the breaker is open
  EXPECT_EQ(tier.take_lease(r.key), RemoteTier::Lease::kUnavailable);
  EXPECT_LT(seconds_since(start), 0.5);
  EXPECT_GE(tier.counters().skipped, 1u);
  EXPECT_TRUE(logged("unavailable"));
  EXPECT_THROW(tier.publish_now(r, nullptr), Error);
  server->restart();
  std::this_thread::sleep_for(milliseconds(400));  // past the cool-down
  EXPECT_FALSE(tier.fetch(r.key, r.target, r.compiler)) << "the restarted server is empty";
  tier.publish_now(r, nullptr);
  EXPECT_TRUE(tier.fetch(r.key, r.target, r.compiler));
}

TEST_F(RemoteCacheTest, WrongPasswordIsAnErrorNeverACrash) {
  RedisServer server(dir("redis"), {"--requirepass", "right"});
  RemoteTier wrong(settings(server, "wrong"));
  EXPECT_FALSE(wrong.fetch(row(11).key, "sm_90a", "c"));
  EXPECT_EQ(wrong.take_lease(row(11).key), RemoteTier::Lease::kUnavailable);
  EXPECT_GE(wrong.counters().errors, 1u);
  EXPECT_TRUE(logged("AUTH refused")) << "the reason is in the warning";
  RemoteTier none(settings(server, ""));
  EXPECT_FALSE(none.fetch(row(11).key, "sm_90a", "c"));
  EXPECT_TRUE(logged("NOAUTH"));
  RemoteTier right(settings(server, "right"));
  right.publish_now(row(11), nullptr);
  EXPECT_TRUE(right.fetch(row(11).key, row(11).target, row(11).compiler));
}

TEST_F(RemoteCacheTest, FullServerRefusesWritesAndReadsGoOn) {
  RedisServer server(dir("redis"), {"--maxmemory-policy", "noeviction"});
  RemoteTier tier(settings(server));
  const CacheRow small = row(12, 1000);
  tier.publish_now(small, nullptr);
  // A budget below what the server already holds: every write is refused (OOM), as when full.
  ASSERT_FALSE(server.admin({"CONFIG", "SET", "maxmemory", "100000"}).is_error());
  ASSERT_TRUE(server.admin({"SET", "one-more", "x"}).is_error());
  EXPECT_THROW(tier.publish_now(row(13, 100000), nullptr), Error);
  EXPECT_EQ(tier.take_lease(row(13).key), RemoteTier::Lease::kUnavailable);
  EXPECT_TRUE(logged("OOM")) << "the refusal is named";
  tier.publish_later(row(14, 100000));  // dropped by the writer, counted, never thrown
  EXPECT_TRUE(tier.fetch(small.key, small.target, small.compiler)) << "reads still work";
}

TEST_F(RemoteCacheTest, SlowServerCostsAtMostTheTimeout) {
  RedisServer server(dir("redis"));
  RemoteSettings s = settings(server);
  s.timeout = milliseconds(20);
  s.cooldown = milliseconds(5000);
  RemoteTier tier(s);
  const CacheRow r = row(15);
  tier.publish_now(r, nullptr);
  std::thread sleeper([&] {
    try {
      server.admin({"DEBUG", "SLEEP", "1.5"});
    } catch (const Error&) {
    }
  });
  std::this_thread::sleep_for(milliseconds(100));  // the server is asleep
  const auto start = Clock::now();
  EXPECT_FALSE(tier.fetch(r.key, r.target, r.compiler));
  EXPECT_EQ(tier.take_lease(r.key), RemoteTier::Lease::kUnavailable);  // skipped now, not waited for
  EXPECT_LT(seconds_since(start), 0.3);
  sleeper.join();
}

TEST_F(RemoteCacheTest, ServerKilledMidTransferNeverLoadsAPartialEntry) {
  RedisServer server(dir("redis"));
  RemoteSettings s = settings(server);
  s.timeout = milliseconds(2000);
  RemoteTier tier(s);
  const CacheRow big = row(16, 64 << 20);
  tier.publish_now(big, nullptr);
  for (int delay_us : {0, 200, 1000, 3000}) {
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      server.kill(SIGKILL);
    });
    const auto got = tier.fetch(big.key, big.target, big.compiler);
    killer.join();
    if (got) {
      EXPECT_EQ(got->binary, big.binary) << "a row that loads is the whole row";
    }
    server.restart();
    std::this_thread::sleep_for(milliseconds(50));
    tier.publish_now(big, nullptr);
  }
}

TEST(RemoteSettingsTest, UrlsAndSettingsAreCheckedByName) {
  EXPECT_EQ(parse_redis_url("redis://h:7000/3", "X").port, 7000);
  EXPECT_EQ(parse_redis_url("redis://h:7000/3", "X").db, 3);
  const RedisEndpoint e = parse_redis_url("redis://me:p%40ss@[::1]:6380", "X");
  EXPECT_EQ(e.user, "me");
  EXPECT_EQ(e.password, "p@ss");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.redacted.find("p%40ss"), std::string::npos) << e.redacted;
  for (const char* bad : {"http://h", "redis://", "redis://h:0", "redis://h:99999", "redis://h:x", "redis://h/abc", "redis://[::1"}) {
    try {
      parse_redis_url(bad, "KILN_CACHE_REMOTE");
      ADD_FAILURE() << bad;
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(err.message().find("KILN_CACHE_REMOTE"), std::string::npos) << err.message();
    }
  }
  try {
    parse_redis_url("rediss://h", "KILN_CACHE_REMOTE");
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_NE(err.message().find("TLS"), std::string::npos);
  }
}

// ---- kiln processes on several nodes ----------------------------------------------------------

// The remote setting of the tests with kiln processes: these are about leases, fetches and
// reports, not timeouts (SlowServerCostsAtMostTheTimeout is), and a 2-core machine running the suite two
// tests at a time can take longer than the 10 ms default to answer, which then reads as a
// failure and sends a node to compile on its own.
std::string remote_env(const RedisServer& server) { return "KILN_CACHE_REMOTE_TIMEOUT_MS=2000 KILN_CACHE_REMOTE=" + server.url(); }

// Process i uses node (i / 4) % nodes: a cache directory of its own under `base`.
std::vector<std::string> race(const fs::path& base, int nodes, const std::vector<std::string>& sigs, const std::string& env) {
  return test::race_compiles(
      base, sigs, [&](size_t i) { return fmt::format("{}/node{}", base.string(), (i / 4) % nodes); }, env);
}

TEST_F(RemoteCacheTest, SixteenProcessesOnTwoNodesCompileEachKeyOnce) {
  RedisServer server(dir("redis"));
  const std::string env = remote_env(server);
  auto origins = race(dir_, 2, std::vector<std::string>(16, kPrefillSig), env);
  EXPECT_EQ(std::count(origins.begin(), origins.end(), "compiled"), 1) << ::testing::PrintToString(origins);
  EXPECT_EQ(std::count(origins.begin(), origins.end(), "compiled") + std::count(origins.begin(), origins.end(), "disk") +
                std::count(origins.begin(), origins.end(), "remote"),
            16)
      << ::testing::PrintToString(origins);

  std::vector<std::string> sigs;
  for (int i = 0; i < 16; ++i) {
    sigs.push_back(fmt::format("dtype=f16,head_dim={},group=4,causal=1,window=0,sinks=0,softcap=0,lse=0", 32 * (1 + i % 4)));
  }
  fs::remove_all(dir("node0"));
  fs::remove_all(dir("node1"));
  origins = race(dir_, 2, sigs, env);
  EXPECT_EQ(std::count(origins.begin(), origins.end(), "compiled"), 4) << ::testing::PrintToString(origins);
  EXPECT_GE(std::count(origins.begin(), origins.end(), "remote"), 1) << "the other node fetched" << ::testing::PrintToString(origins);
  const nlohmann::json fleet = [&] {
    int rc = -1;
    return nlohmann::json::parse(cli(fmt::format("--cache {} cache stats --json", dir("node0")), &rc, env))["remote_server"]["fleet"];
  }();
  EXPECT_EQ(fleet.value("compiles", 0), 5) << fleet.dump();
}

TEST_F(RemoteCacheTest, LeaseHolderKilledMidCompileAnotherNodeTakesOver) {
  RedisServer server(dir("redis"));
  const std::string env = remote_env(server) + " KILN_CACHE_REMOTE_LEASE_MS=1500";
  // Node A's compile hangs (the fake worker) while it holds the lease; kill -9 its process group.
  const std::string cmd = fmt::format(
      "{} KILN_CACHE_DIR={} KILN_COMPILE_WORKER={} setsid {} compile mha_prefill --target sm_90a --sig {} > /dev/null 2>&1 & echo $!", env,
      dir("nodeA"), KILN_TEST_FAKE_WORKER_HANG, KILN_TEST_CLI, kPrefillSig);
  FILE* p = popen(cmd.c_str(), "r");
  int pid = 0;
  ASSERT_EQ(fscanf(p, "%d", &pid), 1);
  pclose(p);
  std::this_thread::sleep_for(milliseconds(2000));  // compiling, lease held and renewed past its life
  ASSERT_EQ(server.admin({"KEYS", "kiln:lease:*"}).elements.size(), 1u) << "node A holds the lease";
  ASSERT_EQ(::kill(-pid, SIGKILL), 0);
  const auto start = Clock::now();
  int rc = -1;
  std::string err;
  const std::string out = cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("nodeB"), kPrefillSig), &rc,
                              env + " KILN_LOG=info", &err);
  ASSERT_EQ(rc, 0) << out << err;
  EXPECT_EQ(nlohmann::json::parse(out)["origin"], "compiled");
  EXPECT_NE(err.find("another node is compiling"), std::string::npos) << err;
  EXPECT_LT(seconds_since(start), 30);
  EXPECT_EQ(server.admin({"KEYS", "kiln:lease:*"}).elements.size(), 0u) << "B released its lease after publishing";
  EXPECT_EQ(server.admin({"KEYS", "kiln:row:*"}).elements.size(), 1u);
}

TEST_F(RemoteCacheTest, ANodeWithoutACompilerServesGptOss120bFromRedis) {
  RedisServer server(dir("redis"));
  const std::string env = remote_env(server);
  int rc = -1;
  std::string out = cli(fmt::format("--cache {} warmup --manifest gpt-oss-120b --target sm_90a -j2 --json", dir("nodeA")), &rc, env);
  ASSERT_EQ(rc, 0) << out << last_err_;
  const nlohmann::json warmed = nlohmann::json::parse(out);
  EXPECT_GT(warmed["compiled"].get<int>(), 0);

  // Node B: an empty cache, the JIT off; every signature comes from Redis, nothing compiles.
  out = cli(fmt::format("--cache {} warmup --check --manifest gpt-oss-120b --target sm_90a --json", dir("nodeB")), &rc,
            env + " KILN_JIT=off");
  ASSERT_EQ(rc, 0) << out << last_err_;
  const nlohmann::json served = nlohmann::json::parse(out);
  EXPECT_EQ(served["compiled"], 0);
  EXPECT_EQ(served["failed"], 0);
  size_t remote = 0;
  for (const auto& item : served["items"]) {
    EXPECT_NE(item["origin"], "compiled");
    remote += item["origin"] == "remote";
  }
  EXPECT_GT(remote, 0u);

  // Node C pulls the model, then serves it with the remote gone.
  out = cli(fmt::format("--cache {} cache pull --manifest gpt-oss-120b --target sm_90a --json", dir("nodeC")), &rc, env);
  ASSERT_EQ(rc, 0) << out << last_err_;
  const nlohmann::json pulled = nlohmann::json::parse(out);
  EXPECT_EQ(pulled["missing"], 0);
  EXPECT_GT(pulled["fetched"].get<int>(), 0);
  server.kill(SIGKILL);
  out = cli(fmt::format("--cache {} warmup --check --manifest gpt-oss-120b --target sm_90a --json", dir("nodeC")), &rc, "KILN_JIT=off");
  ASSERT_EQ(rc, 0) << out << last_err_;
  const nlohmann::json local = nlohmann::json::parse(out);
  for (const auto& item : local["items"]) EXPECT_NE(item["origin"], "remote");
}

TEST_F(RemoteCacheTest, PushUploadsALocalCacheAndPullNamesWhatIsMissing) {
  RedisServer server(dir("redis"));
  const std::string env = remote_env(server);
  int rc = -1;
  std::string out = cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("build"), kPrefillSig), &rc, "");
  ASSERT_EQ(rc, 0) << out << last_err_;
  EXPECT_EQ(server.admin({"DBSIZE"}).integer, 0) << "no remote configured: nothing published";
  out = cli(fmt::format("--cache {} cache push --json", dir("build")), &rc, env);
  ASSERT_EQ(rc, 0) << out << last_err_;
  EXPECT_EQ(nlohmann::json::parse(out)["pushed"], 1);
  out = cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("node"), kPrefillSig), &rc,
            env + " KILN_JIT=off");
  ASSERT_EQ(rc, 0) << out << last_err_;
  EXPECT_EQ(nlohmann::json::parse(out)["origin"], "remote");
  // Nothing of Llama is there: pull lists it and fails, compiling nothing.
  out = cli(fmt::format("--cache {} cache pull --manifest llama-3.1-8b --target sm_90a", dir("node")), &rc, env);
  EXPECT_EQ(rc, 1) << out << last_err_;
  EXPECT_NE(out.find("missing:"), std::string::npos) << out << last_err_;
  // Without a remote, or with a malformed one, push says so.
  std::string err;
  cli(fmt::format("--cache {} cache push", dir("build")), &rc, "", &err);
  EXPECT_EQ(rc, 6) << err;
  EXPECT_NE(err.find("KILN_CACHE_REMOTE"), std::string::npos) << err;
  cli(fmt::format("--cache {} cache push", dir("build")), &rc, "KILN_CACHE_REMOTE=redis://127.0.0.1:notaport", &err);
  EXPECT_EQ(rc, 2) << err;
  EXPECT_NE(err.find("KILN_CACHE_REMOTE"), std::string::npos) << err;
}

TEST_F(RemoteCacheTest, SignedFleetPublishesFromTheBuildBoxOnly) {
  RedisServer server(dir("redis"));
  int rc = -1;
  std::string out = cli(fmt::format("cache keygen {}", dir("release")), &rc, "");
  ASSERT_EQ(rc, 0) << out << last_err_;
  const std::string key = file_bytes(dir("release.pub")).substr(0, 64);
  const std::string remote = remote_env(server);
  // A node without the secret key publishes unsigned rows; a node that trusts the key refuses them.
  out = cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("rogue"), kPrefillSig), &rc, remote);
  ASSERT_EQ(rc, 0) << out << last_err_;
  std::string err;
  out = cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("node"), kPrefillSig), &rc,
            remote + " KILN_JIT=off KILN_CACHE_TRUSTED_KEYS=" + key, &err);
  EXPECT_EQ(rc, 3) << out << err;
  EXPECT_NE(err.find("not signed"), std::string::npos) << err;
  // The build box signs what it publishes; the node loads that.
  out = cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("build"), kPrefillSig), &rc,
            remote + " KILN_CACHE_SIGNING_KEY=" + dir("release.key") + " KILN_CACHE_TRUSTED_KEYS=" + key);
  ASSERT_EQ(rc, 0) << out << last_err_;
  out = cli(fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("node"), kPrefillSig), &rc,
            remote + " KILN_JIT=off KILN_CACHE_TRUSTED_KEYS=" + key, &err);
  ASSERT_EQ(rc, 0) << out << err;
  EXPECT_EQ(nlohmann::json::parse(out)["origin"], "remote");
}

TEST_F(RemoteCacheTest, EnvAndStatsReportTheRemoteInTextAndJson) {
  RedisServer server(dir("redis"));
  const std::string env = remote_env(server);
  int rc = -1;
  std::string out = cli(fmt::format("--cache {} env", dir("node")), &rc, env);
  ASSERT_EQ(rc, 0) << out << last_err_;
  EXPECT_NE(out.find("\"reachable\":true"), std::string::npos) << out;
  out = cli(fmt::format("--cache {} env --json", dir("node")), &rc, env);
  ASSERT_EQ(rc, 0) << out << last_err_;
  EXPECT_EQ(nlohmann::json::parse(out)["settings"]["remote"]["url"], server.url() + "/0");
  out = cli(fmt::format("--cache {} cache stats", dir("node")), &rc, env);
  ASSERT_EQ(rc, 0) << out << last_err_;
  EXPECT_NE(out.find("round trip"), std::string::npos) << out;
  // Unreachable: said, not fatal.
  out = cli(fmt::format("--cache {} env", dir("node")), &rc, "KILN_CACHE_REMOTE=redis://127.0.0.1:1");
  ASSERT_EQ(rc, 0) << out << last_err_;
  EXPECT_NE(out.find("cannot connect"), std::string::npos) << out;
  out = cli(fmt::format("--cache {} cache stats --json", dir("node")), &rc, "KILN_CACHE_REMOTE=redis://127.0.0.1:1");
  ASSERT_EQ(rc, 0) << out << last_err_;
  EXPECT_EQ(nlohmann::json::parse(out)["remote_server"]["reachable"], false);
}

TEST_F(RemoteCacheTest, CommandsKeepWorkingWhenTheRemoteIsDownOrRefusesUs) {
  RedisServer server(dir("redis"), {"--requirepass", "right"});
  for (const std::string& url : {server.url("wrong"), std::string("redis://127.0.0.1:1")}) {
    const auto start = Clock::now();
    int rc = -1;
    std::string err;
    const std::string out = cli(
        fmt::format("--cache {} compile mha_prefill --target sm_90a --json --sig {}", dir("n" + std::to_string(url.size())), kPrefillSig),
        &rc, "KILN_CACHE_REMOTE=" + url, &err);
    ASSERT_EQ(rc, 0) << out << err;
    EXPECT_EQ(nlohmann::json::parse(out)["origin"], "compiled");
    EXPECT_NE(err.find("unavailable"), std::string::npos) << err;
    EXPECT_LT(seconds_since(start), 60);
  }
}

}  // namespace
}  // namespace kiln::detail
