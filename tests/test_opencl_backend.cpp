// The OpenCL backend plugin (plugins/opencl) on this machine's OpenCL device (PoCL on the CPU in
// CI): every operator through kiln's public API and command line, against float64, with its
// binaries in kiln's cache.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "kiln/kiln.hpp"
#include "reference/cpu_reference.hpp"
#include "tools/number_formats.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Before main(), so the registry's first use loads the plugin as a deployment would.
const bool plugin_path_set = setenv("KILN_PLUGIN_PATH", KILN_TEST_OPENCL_PLUGIN, 1) == 0;

// The OpenCL device, or why there is none. The plugin was built, so the suite expects a device:
// PoCL (Debian: pocl-opencl-icd, which scripts/install-deps.sh installs) gives every machine one.
std::optional<Platform> opencl_device(std::string* why) {
  const DeviceReport report = detect_devices();
  for (const Platform& p : report.devices) {
    if (std::string(vendor_name(p.vendor)) == "opencl") return p;
  }
  for (const auto& n : report.notes) *why += n + "; ";
  return std::nullopt;
}

class OpenclBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(plugin_path_set);
    std::string why;
    auto device = opencl_device(&why);
    ASSERT_TRUE(device.has_value()) << "no OpenCL device (install pocl-opencl-icd): " << why;
    platform_ = *device;
    dir_ = fs::temp_directory_path() /
           fmt::format("kiln-opencl-{}-{}", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // The kiln command with this test's own cache; returns stdout and stderr together.
  std::string cli(const std::string& args, int* rc, const std::string& environment = "") const {
    const std::string out = (dir_ / "cli.out").string();
    const int status = std::system(fmt::format("KILN_CACHE_DIR={} KILN_PLUGIN_PATH={} {} timeout 300 {} {} > {} 2>&1",
                                               (dir_ / "cache").string(), KILN_TEST_OPENCL_PLUGIN, environment, KILN_TEST_CLI, args, out)
                                       .c_str());
    *rc = WEXITSTATUS(status);
    std::ifstream in(out);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  Platform platform_;
  fs::path dir_;
};

TEST_F(OpenclBackend, ListedAsADeviceWithItsOwnTargetAndCompiler) {
  int rc = 0;
  const std::string out = cli("devices", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("opencl " + platform_.arch), std::string::npos) << out;
  EXPECT_NE(out.find("opencl-c "), std::string::npos) << out;
  const std::string list = cli("list", &rc);
  for (const char* k : {"opencl.attention.prefill", "opencl.attention.extend", "opencl.attention.decode", "opencl.attention.kv_append",
                        "opencl.moe.apply"}) {
    EXPECT_NE(list.find(k), std::string::npos) << list;
  }
  const std::string why =
      cli(fmt::format("explain mha_prefill --sig dtype=bf16,head_dim=64,group=2,causal=1,window=0,sinks=0,softcap=0,lse=0 --target {}",
                      platform_.arch),
          &rc);
  EXPECT_EQ(rc, 0) << why;
  EXPECT_NE(why.find("opencl.attention.prefill"), std::string::npos) << why;
  EXPECT_NE(why.find("needs a device of vendor nvidia"), std::string::npos) << why;
}

// `kiln check`: the selected kernel against the backend's reference kernel and float64 on the CPU,
// inputs drawn fresh, outputs poisoned.
TEST_F(OpenclBackend, EveryOperatorMatchesFloat64) {
  const std::vector<std::pair<std::string, std::string>> problems = {
      {"mha_prefill", "batch=2,seqlen=64,heads_q=8,heads_kv=2,head_dim=64,causal=1"},
      {"mha_prefill", "batch=3,seqlen=100,heads_q=4,heads_kv=1,head_dim=128,causal=1,window=32,sinks=1"},
      {"mha_prefill", "batch=2,seqlen_q=17,seqlen_k=80,heads_q=4,heads_kv=4,head_dim=64,dtype=f16,softcap=1"},
      {"mha_prefill", "batch=2,seqlen_q=33,seqlen_k=20,heads_q=2,heads_kv=1,head_dim=32,causal=1,window=5"},
      {"mha_decode_with_kvcache", "batch=3,context=200,heads_q=8,heads_kv=2,head_dim=128,page_size=16"},
      {"mha_decode_with_kvcache", "batch=2,context=77,heads_q=4,heads_kv=1,head_dim=64,page_size=16,q_len=3,window=20,sinks=1,dtype=f16"},
      {"mha_decode_with_kvcache", "batch=3,context=150,heads_q=8,heads_kv=1,head_dim=64,page_size=16,kv_dtype=e4m3,sinks=1,window=40"},
      {"mha_extend_with_kvcache", "batch=2,prefix=40,seqlen=30,heads_q=8,heads_kv=2,head_dim=64,page_size=16,window=20,sinks=1"},
      {"mha_extend_with_kvcache",
       "batch=1,prefix=33,seqlen=17,heads_q=4,heads_kv=2,head_dim=128,page_size=8,kv_dtype=e4m3,dtype=f16,softcap=30"},
      {"kv_cache_append", "tokens=300,heads_kv=4,head_dim=64,page_size=16"},
      {"kv_cache_append", "tokens=77,heads_kv=2,head_dim=128,page_size=1,dtype=f16,kv_dtype=e4m3"},
      {"moe_apply", "tokens=5,hidden=128,inter=96,experts=8,top_k=2"},
      {"moe_apply",
       "tokens=7,hidden=256,inter=128,experts=16,top_k=4,routing=softmax_topk,activation=swiglu_clamped,layout=interleaved,bias=bf16"},
      {"moe_apply", "tokens=6,hidden=128,inter=64,experts=8,top_k=2,routing=precomputed,weights=mxfp4,bias=f32"},
      {"moe_apply",
       "tokens=6,hidden=128,inter=64,experts=8,top_k=2,weights=mxfp4_prepared,bias=bf16,activation=swiglu_clamped,layout=interleaved"},
      {"moe_apply", "tokens=9,hidden=256,inter=96,experts=8,top_k=4,weights=mxfp4,bias=f32,act=e4m3"},
      {"moe_apply",
       "tokens=3,hidden=128,inter=64,experts=4,top_k=2,weights=mxfp4_prepared,bias=bf16,activation=swiglu_clamped,layout=interleaved,"
       "routing=precomputed,act=e4m3"},
  };
  for (const auto& [op, shape] : problems) {
    int rc = 0;
    const std::string out = cli(fmt::format("check {} --shape {} --seed 7 --json", op, shape), &rc);
    ASSERT_EQ(rc, 0) << op << " " << shape << "\n" << out;
    const json j = json::parse(out.substr(out.find('{')));
    EXPECT_TRUE(j["pass"].get<bool>()) << out;
    EXPECT_EQ(j["kernel"].get<std::string>().rfind("opencl.", 0), 0u) << out;
    if (op == "mha_prefill") {
      // The tiled kernel (K and V tiles in local memory, shared by 16 rows) against the one-row one.
      EXPECT_EQ(j["kernel"], "opencl.attention.prefill.tiled") << out;
      EXPECT_EQ(j["reference"], "opencl.attention.prefill") << out;
    }
    if (op == "moe_apply") {  // W4A8 (act=e4m3) on its own entry
      EXPECT_EQ(j["kernel"], shape.find("act=e4m3") != std::string::npos ? "opencl.moe.apply.w4a8" : "opencl.moe.apply") << out;
    }
    if (op == "mha_extend_with_kvcache") {  // the paged cache through the tiled kernel
      EXPECT_EQ(j["kernel"], "opencl.attention.extend.tiled") << out;
      EXPECT_EQ(j["reference"], "opencl.attention.extend") << out;
    }
    if (op == "mha_decode_with_kvcache") {
      // The split kernel (a workspace for its partial states) against the one-row reference.
      EXPECT_EQ(j["kernel"], "opencl.attention.decode.split") << out;
      EXPECT_EQ(j["reference"], "opencl.attention.decode") << out;
    }
    EXPECT_EQ(j["target"], platform_.arch);
    ASSERT_TRUE(j["error_vs_float64"].is_number()) << out;  // the float64 comparison ran
    EXPECT_LT(j["error_vs_float64"].get<double>(), j["bound"].get<double>()) << out;
  }
}

// Compiled once, stored in kiln's SQLite cache; a second process with the JIT off loads the
// binaries from there and compiles nothing.
TEST_F(OpenclBackend, BinariesPersistAndASecondProcessLoadsThem) {
  const std::string shape = "--shape batch=2,context=40,heads_q=4,heads_kv=2,head_dim=64,page_size=16";
  int rc = 0;
  std::string out = cli("check mha_decode_with_kvcache " + shape, &rc);
  ASSERT_EQ(rc, 0) << out;
  out = cli("cache stats --json", &rc);
  ASSERT_EQ(rc, 0) << out;
  const json stats = json::parse(out.substr(out.find('{')));
  EXPECT_GE(stats["entries"].get<int>(), 1) << out;
  out = cli("check mha_decode_with_kvcache " + shape, &rc, "KILN_JIT=off");
  EXPECT_EQ(rc, 0) << out;
  out = cli("cache verify", &rc);
  EXPECT_EQ(rc, 0) << out;
  // Another shape of the same signature needs no compile either; a new signature does, and
  // with the JIT off kiln says so instead.
  out = cli("check mha_decode_with_kvcache --shape batch=1,context=300,heads_q=4,heads_kv=2,head_dim=64,page_size=16", &rc, "KILN_JIT=off");
  EXPECT_EQ(rc, 0) << out;
  out = cli("check mha_decode_with_kvcache --shape batch=1,context=30,heads_q=4,heads_kv=2,head_dim=128,page_size=16", &rc, "KILN_JIT=off");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("JIT"), std::string::npos) << out;
}

// Warm-up of a whole model for the backend's target (GPT-OSS-120B: windows, sinks, e4m3 caches,
// MXFP4 experts standard and prepared), then every signature served from the cache; a compile
// for the target; and bench.
TEST_F(OpenclBackend, WarmsAModelForItsTargetCompilesAndBenches) {
  int rc = 0;
  std::string out = cli(fmt::format("warmup --manifest gpt-oss-120b --target {}", platform_.arch), &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("failed     0"), std::string::npos) << out;
  out = cli(fmt::format("warmup --check --manifest gpt-oss-120b --target {}", platform_.arch), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(" 0 missed"), std::string::npos) << out;
  out = cli(fmt::format("compile moe_apply --sig dtype=bf16,weights=bf16,hidden=128,inter=64,experts=8,top_k=2,routing=topk_softmax,"
                        "logits=f32,activation=silu_glu,layout=concat,w13_bias=none,w2_bias=none --target {} --json",
                        platform_.arch),
            &rc);
  ASSERT_EQ(rc, 0) << out;
  json j = json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["kernel"], "opencl.moe.apply");
  EXPECT_EQ(j["compiler"].get<std::string>().rfind("opencl-c OpenCL", 0), 0u) << out;
  out = cli("bench mha_prefill --shape batch=1,seqlen=32,heads_q=2,heads_kv=1,head_dim=64 --json", &rc);
  ASSERT_EQ(rc, 0) << out;
  j = json::parse(out.substr(out.find('{')));
  EXPECT_GT(j["median_ms"].get<double>(), 0.0) << out;
  // W4A8 asks for other numerics by name: only the plugin's kernel whose constraints name
  // act_dtype takes it; the bf16-activation one, which does not, is refused and says why.
  out = cli(fmt::format("explain moe_apply --sig dtype=bf16,weights=mxfp4,hidden=128,inter=64,experts=8,top_k=2,routing=topk_softmax,"
                        "logits=f32,activation=silu_glu,layout=concat,w13_bias=none,w2_bias=none,act_dtype=e4m3 --target {} --json",
                        platform_.arch),
            &rc);
  ASSERT_EQ(rc, 0) << out;
  j = json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["selected"], "opencl.moe.apply.w4a8") << out;
  EXPECT_NE(out.find("act_dtype=e4m3 needs a kernel whose signature constraints name act_dtype"), std::string::npos) << out;
}

// ---- in process, through the C++ API: extend over a shuffled paged cache, and the append that
// fills it.

struct DeviceMemory {
  explicit DeviceMemory(size_t bytes) : pointer(detail::launch_backend().device_alloc(bytes)), size(bytes) {}
  ~DeviceMemory() { detail::launch_backend().device_free(pointer); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(pointer);  // shared virtual memory: the host reads and writes it
  }
  void* pointer;
  size_t size;
};

TEST_F(OpenclBackend, AppendThenExtendOverShuffledPagesMatchesFloat64) {
  const int batch = 2, hq = 4, hkv = 2, d = 64, page = 16, pages_per_seq = 6;
  const std::vector<int> prefix = {37, 50}, new_q = {9, 20};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int total_pages = batch * pages_per_seq;
  std::vector<int> page_order(static_cast<size_t>(total_pages));
  for (int i = 0; i < total_pages; ++i) page_order[static_cast<size_t>(i)] = i;
  std::shuffle(page_order.begin(), page_order.end(), rng);

  DeviceMemory k_cache(sizeof(uint16_t) * total_pages * page * hkv * d), v_cache(k_cache.size);
  std::memset(k_cache.pointer, 0xFF, k_cache.size);  // poison: any unwritten slot read is NaN
  std::memset(v_cache.pointer, 0xFF, v_cache.size);
  DeviceMemory page_table(sizeof(int) * total_pages), seqlens(sizeof(int) * batch), cu_q(sizeof(int) * (batch + 1));
  for (int i = 0; i < total_pages; ++i) page_table.as<int>()[i] = page_order[static_cast<size_t>(i)];
  // Keys per sequence: prefix + new rows; all of them appended through kv_cache_append.
  std::vector<std::vector<float>> keys(batch), values(batch);
  int tokens = 0;
  for (int b = 0; b < batch; ++b) tokens += prefix[static_cast<size_t>(b)] + new_q[static_cast<size_t>(b)];
  DeviceMemory k_new(sizeof(uint16_t) * (tokens + 1) * hkv * d), v_new(k_new.size), slots(sizeof(int64_t) * (tokens + 1));
  std::memset(k_new.pointer, 0, k_new.size);
  std::memset(v_new.pointer, 0, v_new.size);
  int t = 0;
  for (int b = 0; b < batch; ++b) {
    const int len = prefix[static_cast<size_t>(b)] + new_q[static_cast<size_t>(b)];
    seqlens.as<int>()[b] = len;
    for (int j = 0; j < len; ++j, ++t) {
      const int physical = page_table.as<int>()[b * pages_per_seq + j / page];
      slots.as<int64_t>()[t] = static_cast<int64_t>(physical) * page + j % page;
      for (int i = 0; i < hkv * d; ++i) {
        const uint16_t kb = tools::float_to_bf16(normal(rng)), vb = tools::float_to_bf16(normal(rng));
        k_new.as<uint16_t>()[t * hkv * d + i] = kb;
        v_new.as<uint16_t>()[t * hkv * d + i] = vb;
        keys[static_cast<size_t>(b)].push_back(tools::bf16_to_float(kb));
        values[static_cast<size_t>(b)].push_back(tools::bf16_to_float(vb));
      }
    }
  }
  slots.as<int64_t>()[tokens] = -1;  // a padding token: skipped
  KvAppendArgs append;
  append.k = TensorView::contiguous(k_new.pointer, DType::kBF16, {tokens + 1, hkv, d});
  append.v = TensorView::contiguous(v_new.pointer, DType::kBF16, {tokens + 1, hkv, d});
  append.slot_mapping = TensorView::contiguous(slots.pointer, DType::kI64, {tokens + 1});
  append.k_cache = TensorView::contiguous(k_cache.pointer, DType::kBF16, {total_pages, page, hkv, d});
  append.v_cache = TensorView::contiguous(v_cache.pointer, DType::kBF16, {total_pages, page, hkv, d});
  kv_cache_append(append, nullptr);

  int total_q = 0;
  cu_q.as<int>()[0] = 0;
  for (int b = 0; b < batch; ++b) cu_q.as<int>()[b + 1] = total_q += new_q[static_cast<size_t>(b)];
  DeviceMemory q(sizeof(uint16_t) * total_q * hq * d), out(sizeof(uint16_t) * total_q * hq * d), lse(sizeof(float) * total_q * hq);
  std::vector<float> qf(static_cast<size_t>(total_q * hq * d));
  for (size_t i = 0; i < qf.size(); ++i) {
    q.as<uint16_t>()[i] = tools::float_to_bf16(normal(rng));
    qf[i] = tools::bf16_to_float(q.as<uint16_t>()[i]);
  }
  std::memset(out.pointer, 0xFF, out.size);
  MhaExtendArgs a;
  a.q = TensorView::contiguous(q.pointer, DType::kBF16, {total_q, hq, d});
  a.k_cache = append.k_cache;
  a.v_cache = append.v_cache;
  a.page_table = TensorView::contiguous(page_table.pointer, DType::kI32, {batch, pages_per_seq});
  a.cache_seqlens = TensorView::contiguous(seqlens.pointer, DType::kI32, {batch});
  a.cu_seqlens_q = TensorView::contiguous(cu_q.pointer, DType::kI32, {batch + 1});
  a.out = TensorView::contiguous(out.pointer, DType::kBF16, {total_q, hq, d});
  a.lse = TensorView::contiguous(lse.pointer, DType::kF32, {total_q, hq});
  a.max_seqlen_q = 20;
  a.causal = true;
  mha_extend_with_kvcache(a, nullptr);
  detail::launch_backend().synchronize(nullptr);

  // float64: query i of sequence b sits at position prefix + i and sees keys [0, prefix + i].
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double worst = 0, worst_lse = 0;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < new_q[static_cast<size_t>(b)]; ++i) {
      const int row = cu_q.as<int>()[b] + i, visible = prefix[static_cast<size_t>(b)] + i + 1;
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / (hq / hkv);
        std::vector<double> s(static_cast<size_t>(visible));
        double m = -INFINITY;
        for (int j = 0; j < visible; ++j) {
          double dot = 0;
          for (int c = 0; c < d; ++c)
            dot += qf[static_cast<size_t>((row * hq + h) * d + c)] *
                   keys[static_cast<size_t>(b)][static_cast<size_t>((j * hkv + kvh) * d + c)];
          s[static_cast<size_t>(j)] = dot * scale;
          m = std::max(m, s[static_cast<size_t>(j)]);
        }
        double l = 0;
        for (double& x : s) l += (x = std::exp(x - m));
        for (int c = 0; c < d; ++c) {
          double o = 0;
          for (int j = 0; j < visible; ++j)
            o += s[static_cast<size_t>(j)] * values[static_cast<size_t>(b)][static_cast<size_t>((j * hkv + kvh) * d + c)];
          const double got = tools::bf16_to_float(out.as<uint16_t>()[(row * hq + h) * d + c]);
          worst = std::max(worst, std::abs(got - o / l));
        }
        worst_lse = std::max(worst_lse, std::abs(lse.as<float>()[row * hq + h] - (m + std::log(l))));
      }
    }
  }
  EXPECT_LT(worst, 2e-2) << "largest absolute error of the output";  // bf16 output of values ~N(0, 1/visible)
  EXPECT_LT(worst_lse, 1e-3);
}

// W4A8 in process on the OpenCL device: the output follows the float64 model of its MXFP8
// quantization, and is several times further from the same model without it.
TEST_F(OpenclBackend, W4a8FollowsItsQuantizationModel) {
  const int T = 5, H = 256, I = 128, E = 4, K = 2;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255), scale(121, 124);
  reference::MoeProblem p;
  p.tokens = T, p.hidden = H, p.inter = I, p.experts = E, p.top_k = K, p.activation = 1, p.interleaved = true;
  DeviceMemory x(sizeof(uint16_t) * T * H), out(sizeof(uint16_t) * T * H), logits(sizeof(float) * T * E);
  for (int i = 0; i < T * H; ++i) {
    x.as<uint16_t>()[i] = tools::float_to_bf16(normal(rng));
    p.x.push_back(tools::bf16_to_float(x.as<uint16_t>()[i]));
  }
  for (int i = 0; i < T * E; ++i) p.logits.push_back(logits.as<float>()[i] = normal(rng));
  // MXFP4 [rows, cols]: random codes, scales 2^-6 .. 2^-3; decoded into `decoded`.
  auto mxfp4 = [&](int rows, int cols, DeviceMemory& codes, DeviceMemory& scales, std::vector<double>& decoded) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols / 32; ++c) scales.as<uint8_t>()[r * cols / 32 + c] = static_cast<uint8_t>(scale(rng));
      for (int c = 0; c < cols; c += 2) {
        const uint8_t b = static_cast<uint8_t>(byte(rng));
        codes.as<uint8_t>()[(r * cols + c) / 2] = b;
        const double s = tools::e8m0_to_float(scales.as<uint8_t>()[(r * cols + c) / 32]);
        decoded.push_back(tools::e2m1_to_float(b & 0xF) * s);
        decoded.push_back(tools::e2m1_to_float(static_cast<uint8_t>(b >> 4)) * s);
      }
    }
  };
  DeviceMemory w13(static_cast<size_t>(E * 2 * I * H / 2)), s13(static_cast<size_t>(E * 2 * I * H / 32));
  DeviceMemory w2(static_cast<size_t>(E * H * I / 2)), s2(static_cast<size_t>(E * H * I / 32));
  mxfp4(E * 2 * I, H, w13, s13, p.w13);
  mxfp4(E * H, I, w2, s2, p.w2);
  std::memset(out.pointer, 0xFF, out.size);
  MoeArgs a;
  a.x = TensorView::contiguous(x.pointer, DType::kBF16, {T, H});
  a.out = TensorView::contiguous(out.pointer, DType::kBF16, {T, H});
  a.router_logits = TensorView::contiguous(logits.pointer, DType::kF32, {T, E});
  a.top_k = K;
  a.w13 = TensorView::contiguous(w13.pointer, DType::kF4E2M1x2, {E, 2 * I, H / 2});
  a.w13_scale = TensorView::contiguous(s13.pointer, DType::kE8M0, {E, 2 * I, H / 32});
  a.w2 = TensorView::contiguous(w2.pointer, DType::kF4E2M1x2, {E, H, I / 2});
  a.w2_scale = TensorView::contiguous(s2.pointer, DType::kE8M0, {E, H, I / 32});
  a.activation = MoeActivation::kSwigluClamped;
  a.gate_up_layout = GateUpLayout::kInterleaved;
  a.activation_dtype = DType::kF8E4M3;
  moe_apply(a, nullptr);
  detail::launch_backend().synchronize(nullptr);
  auto relative_error = [&](const std::vector<double>& want) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double got = tools::bf16_to_float(out.as<uint16_t>()[i]);
      diff += (got - want[i]) * (got - want[i]);
      norm += want[i] * want[i];
    }
    return std::sqrt(diff / norm);
  };
  p.mxfp8_activations = true;
  const double modelled = relative_error(reference::moe_apply_reference(p));
  p.mxfp8_activations = false;
  const double unquantized = relative_error(reference::moe_apply_reference(p));
  EXPECT_LT(modelled, 1e-2);
  EXPECT_LT(4 * modelled, unquantized) << "against the quantized model " << modelled << ", without it " << unquantized;
}

}  // namespace
}  // namespace kiln
