// Every registered NVIDIA kernel compiles to a CUBIN for every target it claims, and the JIT
// key reacts to exactly what changes the binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include <unistd.h>

#include "backends/backend.hpp"
#include "cache/kernel_cache.hpp"
#include "jit/compiler.hpp"
#include "jit/key.hpp"
#include "jit/pipeline.hpp"
#include "jit/sources.hpp"
#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/log.hpp"
#include "kiln/ops.hpp"
#include "kiln/registry.hpp"
#include "support/signatures.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Representative signatures per operator; each kernel compiles the first it accepts.
std::vector<Signature> representative_signatures() {
  std::vector<Signature> out;
  for (const char* dtype : {"bf16", "f16"}) {
    for (int64_t d : {64, 128}) {
      out.push_back(test::prefill_signature(dtype, d, 8));
      for (const char* kv : {dtype, "e4m3"}) {
        out.push_back(test::decode_signature(dtype, kv, d, 8));
        out.push_back(test::extend_signature(dtype, kv, d, 8));
        out.push_back(test::kv_append_signature(dtype, kv));
      }
    }
  }
  // GPT-OSS's sliding-window layers, for the kernels that take only windows.
  out.push_back(test::prefill_signature("bf16", 64, 8).set_flag("window", true).set_flag("sinks", true));
  out.push_back(test::prefill_signature("bf16", 64, 8).set_flag("window", true).set_flag("sinks", true).set_flag("short_window", true));
  out.push_back(test::extend_signature("bf16", "bf16", 64, 8).set_flag("window", true).set_flag("sinks", true));
  out.push_back(
      test::extend_signature("bf16", "bf16", 64, 8).set_flag("window", true).set_flag("sinks", true).set_flag("short_window", true));
  out.push_back(test::extend_signature("bf16", "e4m3", 64, 8).set_flag("window", true).set_flag("sinks", true));
  // Speculative decode: 4 tokens per sequence; pages of one token (SGLang) on both cache kinds.
  out.push_back(test::decode_signature("bf16", "bf16", 64, 8, 16, 4));
  out.push_back(test::decode_signature("bf16", "bf16", 64, 8, 1));
  out.push_back(test::decode_signature("bf16", "e4m3", 128, 8, 1));
  // Beyond the split kernel's rows with an e4m3 cache: 9 tokens over a group of 8.
  out.push_back(test::decode_signature("bf16", "e4m3", 64, 8, 16, 9));
  for (const char* weights : {"bf16", "mxfp4"}) {
    out.push_back(test::moe_signature(weights, 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "f32"));
  }
  return out;
}

bool contains(const std::vector<uint8_t>& bytes, const std::string& needle) {
  return std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end()) != bytes.end();
}

TEST(Compile, EveryKernelForEveryClaimedTarget) {
  const auto signatures = representative_signatures();
  std::vector<std::future<std::string>> jobs;
  int compiled = 0;
  for (const auto& spec : Registry::global().kernels()) {
    if (spec->origin != "builtin" || spec->backend != Backend::kCuda) continue;
    const Signature* sig = nullptr;
    for (const auto& s : signatures) {
      if (s.op().family == spec->family && s.op().mode == spec->mode && !spec->accepts(s)) {
        sig = &s;
        break;
      }
    }
    ASSERT_NE(sig, nullptr) << spec->name << " accepts no representative signature";
    for (const auto& target : known_targets()) {
      const Platform p = platform_for_target(target);
      const Explanation ex = Registry::global().explain(*sig, p);
      bool claims = false;
      for (const auto& c : ex.candidates) claims |= (c.kernel == spec->name && c.eligible);
      if (!claims) continue;
      ++compiled;
      // Different keys compile in parallel.
      jobs.push_back(std::async(std::launch::async, [spec, sig, p]() -> std::string {
        const auto request = detail::build_request(*spec, *sig, p);
        const auto binary = detail::get_or_compile(request);
        const auto& b = binary->result.binary;
        if (b.size() < 4 || !(b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F'))
          return spec->name + " " + p.arch + ": not an ELF CUBIN";
        if (!contains(b, binary->result.lowered_name))
          return spec->name + " " + p.arch + ": entry " + binary->result.lowered_name + " not in the binary";
        // The compiler reports nothing it made slower than written, such as serialized wgmmas (the
        // log is empty where a cache from an earlier run served the binary).
        const auto advisories = detail::backend_for(request.compiler).compile_advisories(binary->result.log);
        if (!advisories.empty()) return spec->name + " " + p.arch + ": " + advisories.front();
        return "";
      }));
    }
  }
  for (auto& j : jobs) EXPECT_EQ(j.get(), "");
  EXPECT_GE(compiled, 3 * 5) << "each reference kernel claims sm_80 .. sm_120a";
}

// ptxas's "Potential Performance Loss" advisories, which NVRTC passes on in its log, become
// warnings naming the kernel: a wgmma behind a function call compiles, but serialized.
TEST(Compile, CompilerPerformanceAdvisoriesAreWarnings) {
  const detail::VendorBackend& cuda = detail::backend_for(detail::CompilerKind::kNvrtc);
  const std::string log =
      "ptxas info    : (C7519) warpgroup.arrive is injected in around line 33 by compiler to allow use of registers in GMMA in "
      "function 'k'\n"
      "ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to wgmma pipeline "
      "crossing function boundary at a function call in the function 'k'\n";
  EXPECT_EQ(cuda.compile_advisories(log),
            std::vector<std::string>{"ptxas (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
                                     "wgmma pipeline crossing function boundary at a function call in the function 'k'"});
  EXPECT_TRUE(cuda.compile_advisories("").empty());

  detail::CompileRequest r;
  r.compiler = detail::CompilerKind::kNvrtc;
  r.kernel_name = "test.serialized_wgmma";
  r.source_name = "serialized_wgmma.cu";
  r.source = R"(
__device__ __noinline__ void serialized_mma(float (&d)[4], unsigned long long a, unsigned long long b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b));
}
extern "C" __global__ void serialized_wgmma(float* out, unsigned long long a, unsigned long long b) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  serialized_mma(d, a, b);
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
)";
  r.options = cuda.base_options(r.compiler);
  // A key of its own each run, so it is always compiled: a process id alone recurs across runs
  // that share the test cache.
  const auto now = std::chrono::system_clock::now().time_since_epoch().count();
  r.options.push_back("-DKILN_TEST_RUN=" + std::to_string(::getpid()) + "_" + std::to_string(now));
  r.target = "sm_90a";
  std::vector<std::string> warnings;
  set_log_callback([&](LogLevel level, const std::string& m) {
    if (level == LogLevel::kWarn) warnings.push_back(m);
  });
  const auto binary = detail::get_or_compile(r);
  set_log_callback(nullptr);
  EXPECT_STREQ(binary->origin, "compiled");
  ASSERT_EQ(warnings.size(), 1u) << binary->result.log;
  EXPECT_NE(warnings[0].find("test.serialized_wgmma for sm_90a runs slower than written: ptxas (C7510) Potential Performance Loss"),
            std::string::npos)
      << warnings[0];
}

// W4A8 (act_dtype=e4m3) in the MoE kernels that take it, for every target each claims: the
// streaming kernel rounds with the hardware's e4m3 conversion from sm_89 on and in integer code
// before it, and on sm_90a keeps its grouped GEMMs out of the W4A8 instance.
TEST(Compile, W4a8ForEveryClaimedTarget) {
  Signature sig = test::moe_signature("mxfp4_prepared", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "bf16");
  sig.set("act_dtype", "e4m3");
  std::vector<std::future<std::string>> jobs;
  std::set<std::string> kernels;
  for (const auto& target : known_targets()) {
    const Platform p = platform_for_target(target);
    for (const auto& c : Registry::global().explain(sig, p).candidates) {
      const auto spec = Registry::global().find(c.kernel);
      if (!c.eligible || spec->origin != "builtin" || spec->backend != Backend::kCuda) continue;
      kernels.insert(c.kernel);
      jobs.push_back(std::async(std::launch::async, [spec, sig, p]() -> std::string {
        const auto binary = detail::get_or_compile(detail::build_request(*spec, sig, p));
        const auto& lowered = binary->result.lowered_name;
        // The instance's last template argument is act_mxfp8 = true ("Lb1EE" in its mangled name).
        if (lowered.find("Lb1EEEv") == std::string::npos) return spec->name + " " + p.arch + ": not the W4A8 instance: " + lowered;
        return contains(binary->result.binary, lowered) ? "" : spec->name + " " + p.arch + ": entry not in the binary";
      }));
    }
  }
  for (auto& j : jobs) EXPECT_EQ(j.get(), "");
  EXPECT_EQ(kernels, (std::set<std::string>{"moe.apply.reference", "moe.apply.stream"}));
}

// GPT-OSS's window over an e4m3 cache on Hopper: the window strip kernel's e4m3 instance (the
// representative signatures above give it the bf16 one), for bf16 and f16 queries, without
// compiler advisories.
TEST(Compile, WindowStripOverAnE4m3Cache) {
  const Platform sm90a = platform_for_target("sm_90a");
  const auto spec = Registry::global().find("attention.extend.window_strip");
  ASSERT_TRUE(spec);
  for (const char* dtype : {"bf16", "f16"}) {
    const Signature sig =
        test::extend_signature(dtype, "e4m3", 64, 8).set_flag("window", true).set_flag("sinks", true).set_flag("short_window", true);
    ASSERT_EQ(Registry::global().select(sig, sm90a)->name, spec->name) << dtype;
    const auto request = detail::build_request(*spec, sig, sm90a);
    const auto binary = detail::get_or_compile(request);
    const auto& lowered = binary->result.lowered_name;
    EXPECT_NE(lowered.find("NS_4e4m3E"), std::string::npos) << lowered;
    EXPECT_TRUE(contains(binary->result.binary, lowered)) << dtype;
    EXPECT_TRUE(detail::backend_for(request.compiler).compile_advisories(binary->result.log).empty()) << dtype;
  }
}

// Chunked prefill over an e4m3 cache on Hopper at head_dim 64 and 128: the warp-specialized
// kernel's e4m3 instance, for bf16 and f16 queries, without compiler advisories; a soft cap or
// head_dim 256 stays with the mma.sync e4m3 kernel.
TEST(Compile, WarpSpecializedExtendOverAnE4m3Cache) {
  const Platform sm90a = platform_for_target("sm_90a");
  const auto spec = Registry::global().find("attention.extend.wgmma_ws_fp8");
  ASSERT_TRUE(spec);
  for (const int64_t d : {64, 128}) {
    for (const char* dtype : {"bf16", "f16"}) {
      const Signature sig = test::extend_signature(dtype, "e4m3", d, 8, 16);
      ASSERT_EQ(Registry::global().select(sig, sm90a)->name, spec->name) << dtype << " d" << d;
      const auto request = detail::build_request(*spec, sig, sm90a);
      const auto binary = detail::get_or_compile(request);
      const auto& lowered = binary->result.lowered_name;
      EXPECT_NE(lowered.find("NS_4e4m3E"), std::string::npos) << lowered;
      EXPECT_TRUE(contains(binary->result.binary, lowered)) << dtype << " d" << d;
      EXPECT_TRUE(detail::backend_for(request.compiler).compile_advisories(binary->result.log).empty()) << dtype << " d" << d;
    }
  }
  EXPECT_EQ(Registry::global().select(test::extend_signature("bf16", "e4m3", 128, 8, 16).set_flag("softcap", true), sm90a)->name,
            "attention.extend.mma_fp8");
  EXPECT_EQ(Registry::global().select(test::extend_signature("bf16", "e4m3", 256, 8, 16), sm90a)->name, "attention.extend.mma_fp8");
}

// The MoE streaming kernel's large-batch build (MXFP4 with experts averaging at least 96 routed
// pairs: 144-pair GEMM tiles on sm_90a, the streaming phases' sums after the rings elsewhere) is a
// binary of its own, on the grouped-GEMM target and on one without them.
TEST(Compile, MoeLargeBatchBuild) {
  Signature sig = test::moe_signature("mxfp4_prepared", 2880, 2880, 128, 4, "bf16", "swiglu_clamped", "interleaved", "bf16");
  Signature large = sig;
  large.set("large_batch", "1");
  const auto spec = Registry::global().find("moe.apply.stream");
  std::vector<std::future<std::string>> jobs;
  for (const char* target : {"sm_80", "sm_90a"}) {
    const Platform p = platform_for_target(target);
    jobs.push_back(std::async(std::launch::async, [spec, sig, large, p]() -> std::string {
      const auto plain = detail::get_or_compile(detail::build_request(*spec, sig, p));
      const auto built = detail::get_or_compile(detail::build_request(*spec, large, p));
      if (!contains(built->result.binary, built->result.lowered_name)) return p.arch + ": entry not in the binary";
      return built->result.binary == plain->result.binary ? p.arch + ": the same binary as the default build" : "";
    }));
  }
  for (auto& j : jobs) EXPECT_EQ(j.get(), "");
}

TEST(Compile, SameKeyCompilesOncePerProcess) {
  Signature sig({kFamilyAttention, kModePrefill});
  sig.set("dtype", "f16").set("head_dim", int64_t{96}).set("group", int64_t{2}).set_flag("causal", false);
  for (const char* f : {"window", "sinks", "softcap", "lse"}) sig.set_flag(f, true);
  const auto spec = Registry::global().find("attention.prefill.reference");
  const auto request = detail::build_request(*spec, sig, platform_for_target("sm_89"));
  std::vector<std::future<std::shared_ptr<const detail::CompiledBinary>>> results;
  for (int i = 0; i < 8; ++i) results.push_back(std::async(std::launch::async, [&] { return detail::get_or_compile(request); }));
  const auto first = results[0].get();
  for (size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i].get().get(), first.get());
}

// A cache row whose checksum matches but whose bytes are no CUBIN (a bundle written by another
// program) is dropped and the kernel compiled again; it is never handed to the driver.
TEST(Compile, RowThatIsNoBinaryForItsTargetIsDroppedAndRebuilt) {
  Signature sig({kFamilyAttention, kModePrefill});
  sig.set("dtype", "bf16").set("head_dim", int64_t{224}).set("group", int64_t{3}).set_flag("causal", true);
  for (const char* f : {"window", "sinks", "softcap", "lse"}) sig.set_flag(f, false);
  const auto request = detail::build_request(*Registry::global().find("attention.prefill.reference"), sig, platform_for_target("sm_86"));
  detail::CacheRow row;
  row.key = detail::compute_key(request, detail::compiler_identity(request.compiler));
  row.kernel = request.kernel_name;
  row.op = request.op;
  row.signature = request.signature;
  row.target = request.target;
  row.backend = "cuda";
  row.compiler = detail::compiler_identity(request.compiler);
  row.entry = "not_a_kernel";
  row.binary.assign(4096, 0x42);  // checksummed by publish, so only its content is wrong
  ASSERT_TRUE(detail::KernelCache::process().publish(row));
  const auto binary = detail::get_or_compile(request);
  EXPECT_STREQ(binary->origin, "compiled");
  ASSERT_GE(binary->result.binary.size(), 4u);
  EXPECT_EQ(std::string(binary->result.binary.begin(), binary->result.binary.begin() + 4),
            "\x7f"
            "ELF");

  // A real CUBIN, but for another SM (sm_80's code stored under an sm_86 key): dropped, rebuilt.
  sig.set("head_dim", int64_t{160}).set("group", int64_t{5});
  const auto& reference = *Registry::global().find("attention.prefill.reference");
  const auto for_sm80 = detail::get_or_compile(detail::build_request(reference, sig, platform_for_target("sm_80")));
  const detail::VendorBackend& cuda = detail::backend_for(request.compiler);
  EXPECT_EQ(cuda.binary_problem("sm_80", for_sm80->result.binary), std::nullopt);
  const auto problem = cuda.binary_problem("sm_86", for_sm80->result.binary);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("a CUBIN for sm_80, not for sm_86"), std::string::npos) << *problem;
  const auto sm86 = detail::build_request(reference, sig, platform_for_target("sm_86"));
  row.key = detail::compute_key(sm86, detail::compiler_identity(sm86.compiler));
  row.signature = sm86.signature;
  row.entry = for_sm80->result.lowered_name;
  row.binary = for_sm80->result.binary;
  ASSERT_TRUE(detail::KernelCache::process().publish(row));
  const auto rebuilt = detail::get_or_compile(sm86);
  EXPECT_STREQ(rebuilt->origin, "compiled");
  EXPECT_EQ(cuda.binary_problem("sm_86", rebuilt->result.binary), std::nullopt);
}

class KeyTest : public ::testing::Test {
 protected:
  detail::CompileRequest request(const std::string& target = "sm_90a") {
    Signature sig({kFamilyAttention, kModeDecode});
    sig.set("dtype", "bf16").set("kv_dtype", "bf16").set("head_dim", int64_t{128}).set("group", int64_t{8});
    return detail::build_request(*Registry::global().find("attention.decode.reference"), sig, platform_for_target(target));
  }
  detail::KernelKey key(const detail::CompileRequest& r) { return detail::compute_key(r, detail::compiler_identity(r.compiler)); }

  // A copy of kernel-sources/ under a fresh directory, used through KILN_KERNEL_SOURCES.
  fs::path copy_sources(const std::string& name) {
    const fs::path dir = fs::temp_directory_path() / ("kiln-keytest-" + std::to_string(::getpid()) + "-" + name);
    fs::remove_all(dir);
    fs::copy(KILN_TEST_KERNEL_SOURCES, dir, fs::copy_options::recursive);
    made_.push_back(dir);
    return dir;
  }
  void TearDown() override {
    ::unsetenv("KILN_KERNEL_SOURCES");
    for (const auto& d : made_) fs::remove_all(d);
  }
  std::vector<fs::path> made_;
};

TEST_F(KeyTest, ChangesWithSourceHeaderOptionAndTarget) {
  const auto base = request();
  const auto k = key(base);
  auto changed = base;
  changed.source += "\n// a comment changes the source\n";
  EXPECT_NE(key(changed), k);
  changed = base;
  ASSERT_FALSE(changed.headers.empty());
  changed.headers.back().second += "\n";
  EXPECT_NE(key(changed), k);
  changed = base;
  changed.options.push_back("-DKILN_EXTRA=1");
  EXPECT_NE(key(changed), k);
  EXPECT_NE(key(request("sm_100a")), k);
  EXPECT_NE(detail::compute_key(base, "nvrtc 99.0 0000"), k);
  EXPECT_EQ(key(request()), k);
}

TEST_F(KeyTest, DoesNotChangeWithPathOrMtime) {
  const auto embedded = key(request());
  const fs::path a = copy_sources("a");
  const fs::path b = copy_sources("b");
  fs::last_write_time(b / "common" / "prelude.cuh", fs::file_time_type::clock::now() - std::chrono::hours(24 * 365));
  ::setenv("KILN_KERNEL_SOURCES", a.c_str(), 1);
  EXPECT_EQ(key(request()), embedded);
  ::setenv("KILN_KERNEL_SOURCES", b.c_str(), 1);
  EXPECT_EQ(key(request()), embedded);
}

TEST_F(KeyTest, AnIncludedHeaderOnDiskChangesIt) {
  const auto embedded = key(request());
  const fs::path dir = copy_sources("edited");
  std::ofstream(dir / "common" / "prelude.cuh", std::ios::app) << "\n// edited\n";
  ::setenv("KILN_KERNEL_SOURCES", dir.c_str(), 1);
  EXPECT_NE(key(request()), embedded);
}

TEST(Driver, MissingDriverIsAClearErrorWhileOfflineCompilesWork) {
  // In a separate process, so this test sees a missing libcuda even on a GPU machine.
  const std::string cli = KILN_TEST_CLI;
  const std::string env = "KILN_LIBCUDA=/nonexistent/libcuda.so.1 ";
  EXPECT_EQ(std::system((env + cli + " devices > /dev/null").c_str()), 0);
  const std::string out = testing::TempDir() + "/devices.json";
  ASSERT_EQ(std::system((env + cli + " devices --json > " + out).c_str()), 0);
  std::ifstream in(out);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("/nonexistent/libcuda.so.1"), std::string::npos) << json;
  EXPECT_EQ(std::system((env + cli +
                         " compile mha_prefill --target sm_90a --sig "
                         "dtype=bf16,head_dim=64,group=1,causal=0,window=0,sinks=0,softcap=0,lse=0 > /dev/null")
                            .c_str()),
            0);
  const int rc = std::system(
      (env + cli + " explain mha_prefill --sig dtype=bf16,head_dim=64,group=1,causal=0,window=0,sinks=0,softcap=0,lse=0 > /dev/null 2>&1")
          .c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 5) << "no target and no driver: exit code 5";
  // check and bench read their arguments before they look for a GPU: a bad one is exit 2 here too.
  for (const char* args : {" check mha_prefill --shape bogus=1", " bench moe_apply --shape tokens=0", " check mha_nothing"}) {
    const int status = std::system((env + cli + args + " > /dev/null 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(status), 2) << args;
  }
  EXPECT_EQ(WEXITSTATUS(std::system((env + cli + " check mha_prefill --shape batch=2 > /dev/null 2>&1").c_str())), 5)
      << "a good shape without a GPU: exit code 5";
}

TEST(Driver, OperatorCallWithoutDriverNamesLibcuda) {
  if (!detect_devices().devices.empty()) GTEST_SKIP() << "a GPU is present; covered by the subprocess test";
  MhaDecodeArgs a;
  // Distinct (never dereferenced) addresses: an output may not alias an input.
  auto at = [](uint64_t slot) { return reinterpret_cast<void*>(0x100000000ull + slot * 0x100000ull); };
  a.q = TensorView::contiguous(at(0), DType::kBF16, {1, 8, 64});
  a.out = TensorView::contiguous(at(1), DType::kBF16, {1, 8, 64});
  a.k_cache = TensorView::contiguous(at(2), DType::kBF16, {4, 16, 1, 64});
  a.v_cache = TensorView::contiguous(at(3), DType::kBF16, {4, 16, 1, 64});
  a.page_table = TensorView::contiguous(at(4), DType::kI32, {1, 4});
  a.cache_seqlens = TensorView::contiguous(at(5), DType::kI32, {1});
  try {
    mha_decode_with_kvcache(a, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDriverError);
    EXPECT_NE(std::string(e.what()).find("libcuda"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Sources, IncludesResolveAndAngleIncludesAreRefused) {
  const detail::SourceSet set = detail::resolve_includes("t.cu", "  #  include \"attention/params.h\"\n#include\"common/prelude.cuh\"\n");
  ASSERT_EQ(set.headers.size(), 3u);  // params.h includes common/tensor_map.h
  std::vector<std::string> names;
  for (const auto& header : set.headers) names.push_back(header.first);
  EXPECT_NE(std::find(names.begin(), names.end(), "attention/params.h"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "common/tensor_map.h"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "common/prelude.cuh"), names.end());
  try {
    detail::resolve_includes("t.cu", "#include <cuda_fp16.h>\n");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'#include <cuda_fp16.h>' is not allowed"), std::string::npos);
  }
  EXPECT_THROW(detail::resolve_includes("t.cu", "#include \"../etc/passwd\"\n"), Error);
  EXPECT_THROW(detail::resolve_includes("t.cu", "#include \"missing/file.h\"\n"), Error);
}

}  // namespace
}  // namespace kiln
