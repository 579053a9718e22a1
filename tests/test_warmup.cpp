// Manifests (validation with file:line:field errors, expansion), warm-up of every built-in
// manifest, Ctrl-C during a warm-up, and shape capture from several processes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "kiln/error.hpp"
#include "kiln/kiln.h"
#include "kiln/warmup.hpp"
#include "moe/stream_workspace.h"
#include "tools/problems.hpp"
#include "warmup/capture.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string manifest_error(const std::string& text) {
  try {
    parse_manifest(text, "m.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.message();
  }
  ADD_FAILURE() << "accepted:\n" << text;
  return "";
}

const char* kValid = R"({
  "kiln_manifest": 1,
  "model": "toy",
  "operators": [
    {
      "op": "mha_decode_with_kvcache",
      "signature": {
        "dtype": "bf16", "kv_dtype": ["bf16", "e4m3"], "head_dim": 128, "group": 8,
        "page_size": [16, 32, 64], "q_len": 1, "window": false, "sinks": false, "softcap": false, "lse": false
      }
    }
  ],
  "buckets": {"decode_batch": [1, 8, 64]}
})";

TEST(Manifest, ArraysExpandToEveryCombination) {
  const Manifest m = parse_manifest(kValid, "m.json");
  EXPECT_EQ(m.model, "toy");
  ASSERT_EQ(m.signatures.size(), 6u);  // 2 kv dtypes x 3 page sizes
  EXPECT_EQ(m.signatures[0].canonical(),
            "attention.decode:dtype=bf16,group=8,head_dim=128,kv_dtype=bf16,lse=0,page_size=16,q_len=1,sinks=0,softcap=0,window=0");
  EXPECT_EQ(m.buckets.at("decode_batch"), (std::vector<int64_t>{1, 8, 64}));
}

TEST(Manifest, ErrorsNameFileLineAndField) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string t = kValid;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  EXPECT_EQ(manifest_error(with("\"head_dim\": 128", "\"head_dim\": -1")),
            "m.json:8: operators[0].signature.head_dim: -1 must be a string, a non-negative integer or a boolean");
  EXPECT_EQ(manifest_error(with("\"page_size\": [16, 32, 64]", "\"page_size\": []")),
            "m.json:9: operators[0].signature.page_size: an array of values must not be empty");
  EXPECT_EQ(manifest_error(with("\"q_len\": 1,", "\"q_len\": 1, \"qlen\": 2,")).substr(0, 45),
            "m.json:9: operators[0].signature.qlen: unknow");
  EXPECT_NE(manifest_error(with("\"lse\": false", "\"lse_\": false")).find("m.json:7: operators[0].signature: missing key 'lse'"),
            std::string::npos);
  EXPECT_EQ(manifest_error(with("mha_decode_with_kvcache", "mha_decode")).substr(0, 40), "m.json:6: operators[0].op: operator: unk");
  EXPECT_EQ(manifest_error(with("\"kiln_manifest\": 1", "\"kiln_manifest\": 2")),
            "m.json:2: kiln_manifest: must be 1, the manifest format this kiln reads");
  EXPECT_EQ(manifest_error(with("\"model\": \"toy\"", "\"modle\": \"toy\"")).substr(0, 27), "m.json:3: modle: unknown fi");
  EXPECT_EQ(manifest_error(with("[1, 8, 64]", "[1, 0]")), "m.json:13: buckets.decode_batch: 0 is not a positive integer");
  EXPECT_EQ(manifest_error(with("\"bf16\", \"e4m3\"", "\"bf16\", \"e4:m3\"")).substr(0, 47),
            "m.json:8: operators[0].signature.kv_dtype: sign");
  EXPECT_EQ(manifest_error(with("\"q_len\": 1,", "\"q_len\": 1,,")).substr(0, 30), "m.json:9: not valid JSON: [jso");
  EXPECT_EQ(manifest_error("[]"), "m.json:1: the manifest must be a JSON object");
  // Values go through the one signature validator the CLI and the C ABI use.
  EXPECT_EQ(manifest_error(with("\"group\": 8", "\"group\": 0")),
            "m.json:7: operators[0].signature: signature: group=0: expected a whole number of at least 1");
  EXPECT_EQ(manifest_error(with("\"lse\": false", "\"lse\": 7")),
            "m.json:7: operators[0].signature: signature: lse=7: a flag is 0 or 1 (or false, true)");
  EXPECT_NE(manifest_error(with("\"bf16\", \"e4m3\"", "\"bf16\", \"e4m4\"")).find("kv_dtype=e4m4: expected one of bf16, f16"),
            std::string::npos);
}

// The probe's manifests that took gigabytes, a stack overflow or 2.2e10 signatures: each is now
// refused at once, naming the bound (a manifest is parsed inside serving processes too).
TEST(Manifest, BoundsOnSizeDepthArraysAndExpansion) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(manifest_error(std::string(200000, '[')), "m.json: arrays and objects nested 200000 deep; a manifest may nest at most 16");
  EXPECT_EQ(manifest_error(std::string(5 << 20, ' ')), "m.json: 5242880 bytes; a manifest may have at most 4194304 bytes");
  std::string wide = kValid;
  std::string many = "[16";
  for (int i = 1; i < 1025; ++i) many += ", 16";
  wide.replace(wide.find("[16, 32, 64]"), 12, many + "]");
  EXPECT_EQ(manifest_error(wide), "m.json:9: operators[0].signature.page_size: 1025 values; a key may list at most 1024");
  // Seven keys of 30 values: 2.2e10 combinations.
  std::string huge = kValid;
  std::string thirty = "[0";
  for (int i = 1; i < 30; ++i) thirty += ", " + std::to_string(i);
  thirty += "]";
  for (const char* key : {"\"head_dim\": 128", "\"group\": 8", "\"q_len\": 1"}) {
    const std::string k(key);
    huge.replace(huge.find(k), k.size(), k.substr(0, k.find(':') + 2) + thirty);
  }
  huge.replace(huge.find("[16, 32, 64]"), 12, thirty);
  EXPECT_NE(manifest_error(huge).find("operators[0].signature: its arrays expand to more than the 65536 signatures"), std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  // A FIFO named as a manifest is refused instead of blocking the read.
  const std::string fifo = (fs::temp_directory_path() / ("kiln-manifest-fifo-" + std::to_string(::getpid()))).string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    load_manifest(fifo);
    ADD_FAILURE() << "accepted a FIFO";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("is not a regular file"), std::string::npos) << e.message();
  }
  fs::remove(fifo);
}

TEST(Manifest, BuiltinsCoverTheModels) {
  const auto names = builtin_manifests();
  for (const char* model : {"gpt-oss-120b", "gpt-oss-20b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "mixtral-8x7b"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), model), names.end()) << model;
    const Manifest m = load_manifest(model);
    EXPECT_EQ(m.model, model);
    EXPECT_GE(m.signatures.size(), 5u);
  }
  EXPECT_THROW(load_manifest("gpt-oss-121b"), Error);
}

// `kiln check` and `kiln bench --manifest` give every MoE signature of the built-in manifests a
// shape that reproduces it: enough tokens for the large-batch entries, the asked-for count else.
TEST(Manifest, MoeShapesReachTheirBatchClass) {
  int large = 0;
  for (const auto& name : builtin_manifests()) {
    for (const auto& sig : load_manifest(name).signatures) {
      if (sig.op().family != kFamilyMoe) continue;
      tools::ShapeArgs shape = tools::ShapeArgs::parse(tools::shape_for(sig, 8));
      const int64_t tokens = shape.integer("tokens", 0);
      EXPECT_EQ(kiln_moe_large_batch(tokens, sig.get_int("top_k"), sig.get_int("experts")) != 0, sig.has("large_batch"))
          << name << ": " << sig.canonical() << " at " << tokens << " tokens";
      if (sig.has("large_batch")) {
        ++large;
        EXPECT_FALSE(kiln_moe_large_batch(tokens - 1, sig.get_int("top_k"), sig.get_int("experts"))) << "the fewest tokens";
      } else {
        EXPECT_EQ(tokens, 8);
      }
    }
  }
  EXPECT_EQ(large, 4) << "GPT-OSS 120B and 20B, standard and prepared MXFP4";
}

// The progress a warm-up reports names each signature while it compiles, before it finishes.
TEST(WarmupProgress, NamesWhatIsCompilingBeforeItFinishes) {
  const Manifest m = parse_manifest(R"({"kiln_manifest": 1, "model": "p", "operators": [
      {"op": "kv_cache_append", "signature": {"dtype": ["bf16", "f16"], "kv_dtype": "e4m3"}}]})",
                                    "p.json");
  WarmupOptions options;
  options.targets = {"sm_90a"};
  options.jobs = 1;
  std::vector<std::pair<bool, std::string>> events;  // (finished, signature)
  options.on_progress = [&](const WarmupProgress& p) {
    if (p.last != nullptr) {
      events.emplace_back(true, p.last->signature);
      EXPECT_TRUE(p.running.empty()) << "one job: nothing else runs when an item finishes";
    }
    for (const auto& r : p.running) {
      EXPECT_EQ(r.target, "sm_90a");
      EXPECT_GE(r.seconds, 0.0);
      if (p.last == nullptr) events.emplace_back(false, r.signature);
    }
  };
  const WarmupReport report = warmup(m, options);
  ASSERT_EQ(report.failed, 0u);
  ASSERT_EQ(report.items.size(), 2u);
  for (const auto& item : report.items) {
    const auto started = std::find(events.begin(), events.end(), std::make_pair(false, item.signature));
    const auto finished = std::find(events.begin(), events.end(), std::make_pair(true, item.signature));
    ASSERT_NE(started, events.end()) << item.signature;
    ASSERT_NE(finished, events.end()) << item.signature;
    EXPECT_LT(started - events.begin(), finished - events.begin());
  }
}

class WarmupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln-warmup-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string run(const std::string& args, int* rc, const std::string& environment = "") const {
    int status = 0;
    const std::string out =
        shell(fmt::format("{} KILN_CACHE_DIR={}/cache {} {}", environment, dir_.string(), KILN_TEST_CLI, args), &status);
    *rc = WEXITSTATUS(status);
    return out;
  }
  // Runs a shell command with its output to a file; returns that output, `*status` as system() gave it.
  std::string shell(const std::string& command, int* status) const {
    const std::string out = (dir_ / "out").string();
    *status = std::system(fmt::format("{} > {} 2>&1", command, out).c_str());
    std::ifstream in(out);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

// Fewer threads than asked for (a process limit): the warm-up runs on those it got, instead of
// ending in std::terminate. Limits do not bind root, so the child runs as `nobody`.
TEST_F(WarmupTest, ThreadLimitRunsOnTheThreadsItGot) {
  if (::geteuid() != 0 || std::system("command -v setpriv > /dev/null && command -v prlimit > /dev/null") != 0) {
    GTEST_SKIP() << "needs root, setpriv and prlimit";
  }
  fs::create_directories(dir_ / "cache");
  ASSERT_EQ(std::system(fmt::format("chown -R nobody:nogroup {} && chmod 700 {}/cache", dir_.string(), dir_.string()).c_str()), 0);
  int status = 0;
  const std::string text = shell(
      fmt::format(
          "setpriv --reuid=nobody --regid=nogroup --clear-groups prlimit --nproc=12 env HOME=/nonexistent ASAN_OPTIONS=detect_leaks=0 "
          "KILN_CACHE_DIR={}/cache KILN_COMPILE_ISOLATION=inprocess {} warmup --manifest llama-3.1-8b "
          "--target sm_80,sm_86,sm_89,sm_90a -j 200",
          dir_.string(), KILN_TEST_CLI),
      &status);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_NE(text.find("worker threads"), std::string::npos) << "the limit should have bitten:\n" << text;
  EXPECT_NE(text.find("failed     0"), std::string::npos) << text;
}

// A warm-up whose writes fail (here a 200 KiB file-size limit, as on a nearly full disk: the
// database and its first rows fit, later commits fail) must not look like a complete cache: it
// exits 1 and names every signature that did not reach the disk.
TEST_F(WarmupTest, WritesThatFailAreReportedAndFailTheRun) {
  int status = 0;
  const std::string text = shell(fmt::format("bash -c 'trap \"\" XFSZ; ulimit -f 200; KILN_CACHE_DIR={}/cache {} warmup -j 1 "
                                             "--manifest gpt-oss-120b --target sm_90a'",
                                             dir_.string(), KILN_TEST_CLI),
                                 &status);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 1) << text;
  EXPECT_NE(text.find("NOT STORED"), std::string::npos) << text;
  EXPECT_NE(text.find("not stored: attention.decode:"), std::string::npos) << text;
  EXPECT_NE(text.find("failed     0"), std::string::npos) << "every compile itself succeeded\n" << text;
  EXPECT_NE(text.find("'COMMIT' failed"), std::string::npos) << "the database opened; a commit failed\n" << text;
}

TEST_F(WarmupTest, EveryBuiltinManifestWarmsForHopperThenIsCached) {
  for (const auto& model : builtin_manifests()) {
    int rc = -1;
    std::string out = run("warmup -j 2 --target sm_90a --manifest " + model, &rc);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("failed     0"), std::string::npos) << out;
    out = run("warmup --target sm_90a --manifest " + model, &rc);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("compiled   0"), std::string::npos) << model << ": a rerun compiles nothing\n" << out;
  }
}

// A serving node without a compiler: NVRTC unloadable and KILN_JIT=off. What a warm-up stored is
// served (by the compiler identity its rows record), `warmup --check` says so per signature and
// tier, a miss names the command that would store it, and --strict fails on REFERENCE kernels.
TEST_F(WarmupTest, WarmedCacheServesWithoutACompilerAndCheckSaysWhatWouldHit) {
  const std::string manifest = (dir_ / "serve.json").string();
  {
    std::ofstream m(manifest);
    m << R"({"kiln_manifest": 1, "model": "serve", "operators": [
      {"op": "mha_decode_with_kvcache", "signature": {"dtype": "bf16", "kv_dtype": "bf16", "head_dim": 64, "group": 8,
       "page_size": 16, "q_len": 1, "window": [0, 1], "sinks": 1, "softcap": 0, "lse": 0}},
      {"op": "mha_decode_with_kvcache", "signature": {"dtype": "bf16", "kv_dtype": "e4m3", "head_dim": 64, "group": 8,
       "page_size": 16, "q_len": 1, "window": 0, "sinks": 0, "softcap": 0, "lse": 0}},
      {"op": "kv_cache_append", "signature": {"dtype": "bf16", "kv_dtype": "bf16"}}]})";
  }
  int rc = -1;
  std::string out = run("warmup --manifest " + manifest + " --target sm_90a,sm_80", &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string no_compiler = "KILN_LIBNVRTC=/nonexistent KILN_JIT=off";
  out = run("warmup --check --manifest " + manifest + " --target sm_90a,sm_80", &rc, no_compiler);
  EXPECT_EQ(rc, 0) << out;
  // sm_80 decode from an e4m3 cache: the reference (its tensor-core kernel needs sm_89)
  EXPECT_NE(out.find("8 hit, 0 missed, 1 on REFERENCE kernels"), std::string::npos) << out;
  EXPECT_NE(out.find("hit  disk   sm_90a   attention.decode.mma_split"), std::string::npos) << out;
  out = run("warmup --check --strict --manifest " + manifest + " --target sm_90a,sm_80", &rc, no_compiler);
  EXPECT_EQ(rc, 1) << "--strict fails on REFERENCE kernels\n" << out;
  // The stored binary itself comes back, bit for bit, with the compiler unloadable.
  const std::string sig = "dtype=bf16,kv_dtype=bf16,head_dim=64,group=8,page_size=16,q_len=1,window=1,sinks=1,softcap=0,lse=0";
  run(fmt::format("compile mha_decode_with_kvcache --target sm_90a --sig {} -o {}/warm.cubin", sig, dir_.string()), &rc);
  ASSERT_EQ(rc, 0);
  out =
      run(fmt::format("compile mha_decode_with_kvcache --target sm_90a --sig {} -o {}/served.cubin", sig, dir_.string()), &rc, no_compiler);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(std::system(fmt::format("cmp -s {0}/warm.cubin {0}/served.cubin", dir_.string()).c_str()), 0);
  // A miss is an error naming the signature, the target and the command that fixes it.
  const std::string cold = "dtype=bf16,kv_dtype=bf16,head_dim=128,group=4,page_size=16,q_len=1,window=0,sinks=0,softcap=0,lse=0";
  out = run(fmt::format("compile mha_decode_with_kvcache --target sm_90a --sig {} -o {}/x.cubin", cold, dir_.string()), &rc, no_compiler);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("compiling is off (KILN_JIT=off)"), std::string::npos) << out;
  EXPECT_NE(out.find(fmt::format("warmup --op mha_decode_with_kvcache --sig '{}' --target sm_90a",
                                 "dtype=bf16,group=4,head_dim=128,"
                                 "kv_dtype=bf16,lse=0,page_size=16,"
                                 "q_len=1,sinks=0,softcap=0,window=0")),
            std::string::npos)
      << out;
  out = run("warmup --check --op mha_decode_with_kvcache --sig " + cold + " --target sm_90a", &rc, no_compiler);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("MISS"), std::string::npos) << out;
  // The command it names stores it; then the node serves it.
  out = run("warmup --op mha_decode_with_kvcache --sig " + cold + " --target sm_90a", &rc);
  EXPECT_EQ(rc, 0) << out;
  out = run("warmup --check --op mha_decode_with_kvcache --sig " + cold + " --target sm_90a", &rc, no_compiler);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(run("warmup --check --target sm_90a", &rc).find("give --manifest, or --op with --sig"), std::string::npos);
  EXPECT_EQ(rc, 2);
  out = run("warmup --check --op kv_cache_append --sig dtype=bf16,kv_dtype=bf16 --target sm_90", &rc, no_compiler);
  EXPECT_NE(out.find("--target: no GPU looks kernels up as sm_90: the GPUs of that family report sm_90a"), std::string::npos) << out;
  out = run("warmup --check --op kv_cache_append --sig dtype=bf16,kv_dtype=bf16 --target gfx942", &rc, no_compiler);
  EXPECT_NE(out.find("--target: AMD GPUs look kernels up under their target with feature flags (a MI300X reports "
                     "gfx942:sramecc+:xnack-)"),
            std::string::npos)
      << out;
  out = run("warmup --op kv_cache_append --sig dtype=bf16,kv_dtype=bf16 --target sm_90a", &rc, "KILN_JIT=maybe");
  EXPECT_NE(out.find("KILN_JIT='maybe' must be 'on' or 'off'"), std::string::npos) << out;
  EXPECT_NE(rc, 0);
}

// What peers of the command line do: --version, an unknown command named as such, global options
// after the subcommand.
TEST_F(WarmupTest, CommandLineConventions) {
  int rc = -1;
  std::string out = run("--version", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, std::string("kiln ") + kiln_version() + "\n");
  out = run("frobnicate", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("unknown command 'frobnicate' (commands: devices, list"), std::string::npos) << out;
  fs::create_directories(dir_ / "other");
  fs::permissions(dir_ / "other", fs::perms::owner_all);
  out = run(fmt::format("cache stats --cache {}/other", dir_.string()), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(fmt::format("directory  {}/other", dir_.string())), std::string::npos) << out;
  // Sizes take units; `cache clear` empties the database.
  run("warmup --op kv_cache_append --sig dtype=bf16,kv_dtype=bf16 --target sm_90a,sm_80", &rc);
  ASSERT_EQ(rc, 0);
  out = run("cache prune --max-size 4X", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("--max-size='4X' is not a size"), std::string::npos) << out;
  out = run("cache prune --max-size 1G", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("evicted 0 entries"), std::string::npos) << out;
  out = run("cache clear", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("removed 2 entries"), std::string::npos) << out;
  // Without a GPU the targets must be named.
  out = run("warmup --op kv_cache_append --sig dtype=bf16,kv_dtype=bf16", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--target: no GPU is usable here"), std::string::npos) << out;
  out = run("cache stats", &rc, "KILN_CACHE_MAX_BYTES=512M");
  EXPECT_NE(out.find("entries    0\nsize       0 B of 512.0 MiB"), std::string::npos) << out;
  // Every exit code is in --help.
  out = run("--help", &rc);
  EXPECT_EQ(rc, 0);
  for (const char* code : {"0 success", "1 internal", "2 bad usage", "3 no kernel", "4 compile failed", "5 driver", "6 the cache",
                           "7 kiln check", "130 warm-up interrupted"}) {
    EXPECT_NE(out.find(code), std::string::npos) << code << " missing from --help:\n" << out;
  }
  // `kiln env` (and `devices`) for a bug report: they read, and create no cache directory.
  const std::string fresh = (dir_ / "fresh").string();
  out = run(fmt::format("--cache {} env --json", fresh), &rc, "KILN_JIT=off");
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json env = nlohmann::json::parse(out);
  EXPECT_EQ(env.at("schema"), 1);
  EXPECT_EQ(env.at("kiln").at("version"), kiln_version());
  EXPECT_EQ(env.at("cache").at("directory"), fresh);
  EXPECT_EQ(env.at("cache").at("persistent"), false);
  EXPECT_EQ(env.at("settings").at("jit"), "off");
  EXPECT_EQ(env.at("environment").at("KILN_JIT"), "off");
  EXPECT_TRUE(env.at("compilers").is_array() && !env.at("compilers").empty());
  out = run(fmt::format("--cache {} env", fresh), &rc, "KILN_CACHE_TRUSTED_KEYS=nonsense");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("trusted_keys KILN_CACHE_TRUSTED_KEYS: 'nonsense'"), std::string::npos) << out;
  run(fmt::format("--cache {} devices", fresh), &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_FALSE(fs::exists(fresh)) << "env and devices only read";
  // --json on every command: one object, its shape versioned by "schema".
  const std::string sig = "dtype=bf16,kv_dtype=bf16";
  for (const std::string& command : std::vector<std::string>{
           "devices", "list", "manifests", "env", "cache stats", "cache ls", "cache verify", "cache prune --max-size 1G", "cache clear",
           "explain kv_cache_append --target sm_90a --sig " + sig, "compile kv_cache_append --target sm_90a --sig " + sig,
           "warmup --op kv_cache_append --target sm_90a --sig " + sig, "warmup --check --op kv_cache_append --target sm_90a --sig " + sig,
           "cache export " + (dir_ / "all.kiln").string(), "cache import " + (dir_ / "all.kiln").string(),
           "cache keygen " + (dir_ / "release").string()}) {
    int status = 0;  // stdout alone: progress goes to stderr
    out = shell(fmt::format("sh -c 'KILN_CACHE_DIR={}/cache {} {} --json 2> /dev/null'", dir_.string(), KILN_TEST_CLI, command), &status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << command << ": " << out;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << command << " --json printed no JSON: " << out;
      continue;
    }
    EXPECT_TRUE(j.is_object() && j.value("schema", 0) == 1) << command << ": " << out;
  }
}

TEST_F(WarmupTest, FailuresAreReportedWithReasonsAndExitNonZero) {
  int rc = -1;
  // No usable AMD compiler: every gfx942 signature fails, every sm_90a one is built.
  const std::string out =
      run("warmup --manifest llama-3.1-8b --target sm_90a,gfx942", &rc, "KILN_AMD_COMPILER=clang KILN_CLANG=/bin/false");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("failed     11"), std::string::npos) << out;  // the manifest's 11 signatures
  EXPECT_NE(out.find("on gfx942: "), std::string::npos) << out;
  EXPECT_NE(out.find("KILN_CLANG=/bin/false is not an executable clang"), std::string::npos) << out;
  EXPECT_EQ(run("warmup --manifest llama-3.1-8b --target sm_42", &rc).find("unknown arch 'sm_42'") != std::string::npos, true);
  EXPECT_EQ(rc, 2);
}

TEST_F(WarmupTest, InterruptLeavesTheCacheConsistentAndARerunContinues) {
  // A hanging compiler makes the warm-up slow enough to interrupt deterministically.
  const std::string cmd = fmt::format(
      "cd {} && KILN_CACHE_DIR={}/cache KILN_COMPILE_WORKER={} exec {} warmup -j 1 --target sm_90a --manifest mixtral-8x7b > out 2>&1",
      dir_.string(), dir_.string(), KILN_TEST_FAKE_WORKER_HANG, KILN_TEST_CLI);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_EQ(::kill(-pid, SIGINT), 0);  // as Ctrl-C does: the whole process group
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 130);
  std::ifstream in(dir_ / "out");
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_NE(s.str().find("interrupted; run again to continue"), std::string::npos) << s.str();
  int rc = -1;
  const std::string out = run("warmup --target sm_90a --manifest mixtral-8x7b", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("failed     0"), std::string::npos) << out;
  EXPECT_EQ(run("cache verify", &rc).find("0 problem(s)") != std::string::npos, true);
}

TEST_F(WarmupTest, CaptureFromSeveralProcessesMakesOneManifest) {
  const std::string file = (dir_ / "captured.json").string();
  std::vector<pid_t> children;
  for (int p = 0; p < 4; ++p) {
    const pid_t pid = fork();
    if (pid == 0) {
      set_capture_file(file);
      for (int d : {32, 64, 96, 128}) {
        Signature sig({kFamilyAttention, kModePrefill});
        sig.set("dtype", "bf16").set("head_dim", int64_t{d * (1 + p % 2)}).set("group", int64_t{8});
        for (const char* f : {"causal", "window", "sinks", "softcap", "lse"}) sig.set_flag(f, d == 64);
        detail::capture_signature(sig);
        detail::capture_signature(sig);  // once per process
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t c : children) waitpid(c, nullptr, 0);
  const Manifest m = load_manifest(file);
  EXPECT_EQ(m.model, "captured");
  // Processes 0 and 2 capture head_dim 32, 64 (flags on), 96, 128; processes 1 and 3 capture
  // 64, 128 (flags on), 192, 256: 8 distinct signatures, each once.
  EXPECT_EQ(m.signatures.size(), 8u);
  int rc = -1;
  EXPECT_NE(run("warmup --target sm_90a --manifest " + file, &rc).find("failed     0"), std::string::npos);
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace kiln
