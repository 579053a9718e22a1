// GPU suite (label gpu): the reference kernels, compiled at run time through kiln's JIT and
// launched through the driver, against the float64 CPU references on fresh random inputs.
// Outputs are poisoned (all bytes 0xFF = NaN) before each run, so an unwritten element fails.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "attention/params.h"
#include "backends/cuda/device.hpp"
#include "backends/cuda/driver.hpp"
#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/ops.hpp"
#include "kiln/registry.hpp"
#include "kiln/warmup.hpp"
#include "reference/cpu_reference.hpp"
#include "support/signatures.hpp"
#include "tools/device_buffer.hpp"
#include "tools/number_formats.hpp"
#include "tools/problems.hpp"

namespace kiln::test {
namespace {

using namespace kiln::reference;
using namespace kiln::tools;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!use_first_gpu()) GTEST_SKIP() << "no GPU: the gpu suite runs on the device machine";
  }
  std::mt19937 rng{std::random_device{}()};
};

// Compares lse where the reference attended something; both must be -inf elsewhere.
void expect_lse_close(const std::vector<float>& got, const std::vector<double>& ref, const std::string& what) {
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << what << " lse[" << i << "] = " << got[i];
    } else {
      ASSERT_NEAR(got[i], ref[i], 1e-3 * std::max(1.0, std::fabs(ref[i]))) << what << " lse[" << i << "]";
    }
  }
}

TensorView view(const DeviceBuffer& b, DType t, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(b.get(), t, shape, 0);
}

struct PrefillCase {
  DType dtype;
  int d, hq, hkv;
  std::vector<int> lens_q, lens_k;
  bool causal;
  int window;
  bool sinks;
  float softcap;
  bool lse = true;
  // Key j of a sequence scaled by 1 + key_growth * j: row maxima keep rising, past the online
  // softmax's stale-maximum limit in some blocks and within it in others.
  float key_growth = 0;
};

void run_prefill(std::mt19937& rng, const PrefillCase& c) {
  PrefillProblem p;
  p.hq = c.hq;
  p.hkv = c.hkv;
  p.d = c.d;
  p.causal = c.causal;
  p.window_left = c.window;
  p.softcap = c.softcap;
  p.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  p.cu_q = {0};
  p.cu_k = {0};
  for (size_t b = 0; b < c.lens_q.size(); ++b) {
    p.cu_q.push_back(p.cu_q.back() + c.lens_q[b]);
    p.cu_k.push_back(p.cu_k.back() + c.lens_k[b]);
  }
  const int total_q = p.cu_q.back(), total_k = p.cu_k.back();
  const auto q_bits = random_half(rng, static_cast<size_t>(total_q * c.hq * c.d), c.dtype, 1.0f, p.q);
  auto k_bits = random_half(rng, static_cast<size_t>(total_k * c.hkv * c.d), c.dtype, 1.0f, p.k);
  const auto v_bits = random_half(rng, static_cast<size_t>(total_k * c.hkv * c.d), c.dtype, 1.0f, p.v);
  if (c.key_growth > 0) {
    for (size_t b = 0; b + 1 < p.cu_k.size(); ++b) {
      for (int key = p.cu_k[b]; key < p.cu_k[b + 1]; ++key) {
        const float growth = 1.0f + c.key_growth * static_cast<float>(key - p.cu_k[b]);
        for (size_t i = static_cast<size_t>(key) * c.hkv * c.d; i < static_cast<size_t>(key + 1) * c.hkv * c.d; ++i) {
          const float grown = static_cast<float>(p.k[i]) * growth;
          k_bits[i] = c.dtype == DType::kBF16 ? float_to_bf16(grown) : float_to_f16(grown);
          p.k[i] = c.dtype == DType::kBF16 ? bf16_to_float(k_bits[i]) : f16_to_float(k_bits[i]);
        }
      }
    }
  }
  std::vector<float> sinks_f;
  if (c.sinks) {
    // Ordinary, very large and very negative sinks.
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (int h = 0; h < c.hq; ++h) sinks_f.push_back(h % 4 == 1 ? 40.0f : h % 4 == 2 ? -60.0f : u(rng));
    p.sinks.assign(sinks_f.begin(), sinks_f.end());
  }
  const AttentionResult ref = prefill_reference(p);

  auto q = DeviceBuffer::from(q_bits), k = DeviceBuffer::from(k_bits), v = DeviceBuffer::from(v_bits);
  auto cu_q = DeviceBuffer::from(p.cu_q), cu_k = DeviceBuffer::from(p.cu_k);
  DeviceBuffer out(q_bits.size() * 2 + 16), lse(static_cast<size_t>(total_q * c.hq) * 4 + 16);
  auto sinks = DeviceBuffer::from(sinks_f);
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  MhaPrefillArgs a;
  a.q = view(q, c.dtype, {total_q, c.hq, c.d});
  a.k = view(k, c.dtype, {total_k, c.hkv, c.d});
  a.v = view(v, c.dtype, {total_k, c.hkv, c.d});
  a.out = view(out, c.dtype, {total_q, c.hq, c.d});
  a.cu_seqlens_q = view(cu_q, DType::kI32, {static_cast<int64_t>(p.cu_q.size())});
  a.cu_seqlens_k = view(cu_k, DType::kI32, {static_cast<int64_t>(p.cu_k.size())});
  a.max_seqlen_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
  a.max_seqlen_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
  if (c.lse) a.lse = view(lse, DType::kF32, {total_q, c.hq});
  if (c.sinks) a.sinks = view(sinks, DType::kF32, {c.hq});
  a.causal = c.causal;
  a.window_left = c.window;
  a.softcap = c.softcap;
  mha_prefill(a, nullptr);
  synchronize();
  const std::string what = "prefill d=" + std::to_string(c.d) + " hq/hkv=" + std::to_string(c.hq) + "/" + std::to_string(c.hkv) +
                           " causal=" + std::to_string(c.causal) + " window=" + std::to_string(c.window) +
                           " sinks=" + std::to_string(c.sinks) + " softcap=" + std::to_string(c.softcap) + " lse=" + std::to_string(c.lse) +
                           " dtype=" + dtype_name(c.dtype) + " key_growth=" + std::to_string(c.key_growth);
  const double err = relative_error(decode_half(out.to_host<uint16_t>(q_bits.size()), c.dtype), ref.out);
  EXPECT_LT(err, c.dtype == DType::kBF16 ? 1e-2 : 2e-3) << what;
  if (c.lse) expect_lse_close(lse.to_host<float>(static_cast<size_t>(total_q * c.hq)), ref.lse, what);
}

Signature prefill_case_signature(const PrefillCase& c) {
  Signature sig({kFamilyAttention, kModePrefill});
  sig.set("dtype", dtype_name(c.dtype)).set("head_dim", int64_t{c.d}).set("group", int64_t{c.hq / c.hkv});
  sig.set_flag("causal", c.causal).set_flag("window", c.window >= 0).set_flag("sinks", c.sinks);
  sig.set_flag("softcap", c.softcap > 0).set_flag("lse", c.lse);
  if (c.window >= 0 && c.window <= 128) sig.set_flag("short_window", true);  // as signature_of sets it
  return sig;
}

const char* const kPrefillKernels[] = {"attention.prefill.wgmma_ws", "attention.prefill.window_strip", "attention.prefill.wgmma_window",
                                       "attention.prefill.mma",      "attention.prefill.mma_window",   "attention.prefill.reference"};

// Every case runs on each prefill kernel that accepts it: the Hopper wgmma kernel (the device is an
// H100 or H200), the portable tensor-core kernel, its head-packing form for windows and the
// reference.
TEST_F(Gpu, PrefillKernelsMatchFloat64) {
  const std::vector<int> ragged_q = {0, 1, 37, 130}, ragged_k = {5, 1, 70, 130};
  const std::vector<PrefillCase> cases = {
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 8,
       .hkv = 8,
       .lens_q = ragged_q,
       .lens_k = ragged_k,
       .causal = true,
       .window = -1,
       .sinks = false,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 128,
       .hq = 16,
       .hkv = 4,
       .lens_q = ragged_q,
       .lens_k = ragged_k,
       .causal = true,
       .window = -1,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kF16,
       .d = 128,
       .hq = 8,
       .hkv = 1,
       .lens_q = ragged_q,
       .lens_k = ragged_k,
       .causal = false,
       .window = -1,
       .sinks = false,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 32,
       .hkv = 2,
       .lens_q = ragged_q,
       .lens_k = ragged_k,
       .causal = true,
       .window = 0,
       .sinks = true,
       .softcap = 0},  // window 0: only the diagonal
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 8,
       .hkv = 8,
       .lens_q = ragged_q,
       .lens_k = ragged_k,
       .causal = true,
       .window = 16,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 128,
       .hq = 8,
       .hkv = 8,
       .lens_q = ragged_q,
       .lens_k = ragged_k,
       .causal = false,
       .window = 5000,
       .sinks = false,
       .softcap = 0},  // window larger than any sequence
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 16,
       .hkv = 1,
       .lens_q = {3, 77},
       .lens_k = {9, 45},
       .causal = true,
       .window = -1,
       .sinks = true,
       .softcap = 30.0f},  // fewer keys than queries, softcap
      {.dtype = DType::kF16,
       .d = 256,
       .hq = 4,
       .hkv = 4,
       .lens_q = {33},
       .lens_k = {33},
       .causal = true,
       .window = 7,
       .sinks = false,
       .softcap = 0},
      // Several 64-row and 64-key blocks: skipped and edge blocks, prefixes, GPT-OSS windows.
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 64,
       .hkv = 8,
       .lens_q = {1000, 513, 64, 65},
       .lens_k = {1000, 513, 64, 65},
       .causal = true,
       .window = 128,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kF16,
       .d = 128,
       .hq = 32,
       .hkv = 8,
       .lens_q = {700, 129},
       .lens_k = {700, 129},
       .causal = false,
       .window = -1,
       .sinks = false,
       .softcap = 0},
      // Keys past 176-key blocks by at most 48 (1, 24, 48): the last block is issued 48 wide.
      {.dtype = DType::kBF16,
       .d = 128,
       .hq = 16,
       .hkv = 4,
       .lens_q = {200, 400, 33},
       .lens_k = {200, 400, 353},
       .causal = false,
       .window = -1,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 128,
       .hq = 16,
       .hkv = 16,
       .lens_q = {100, 300, 1},
       .lens_k = {700, 300, 257},
       .causal = true,
       .window = -1,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 8,
       .hkv = 1,
       .lens_q = {333},
       .lens_k = {1200},
       .causal = false,
       .window = 200,
       .sinks = false,
       .softcap = 50.0f},  // window without causal, softcap
      // head_dim 256 (Gemma): 64-key blocks in the warp-specialized kernel, several query
      // blocks, keys past the last block, GQA, sinks, softcap, a window.
      {.dtype = DType::kBF16,
       .d = 256,
       .hq = 8,
       .hkv = 2,
       .lens_q = {300, 1, 129, 0},
       .lens_k = {300, 70, 129, 5},
       .causal = true,
       .window = -1,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kF16,
       .d = 256,
       .hq = 4,
       .hkv = 1,
       .lens_q = {200, 64},
       .lens_k = {777, 64},
       .causal = false,
       .window = -1,
       .sinks = false,
       .softcap = 30.0f},
      {.dtype = DType::kBF16,
       .d = 256,
       .hq = 4,
       .hkv = 4,
       .lens_q = {500, 130},
       .lens_k = {500, 200},
       .causal = true,
       .window = 100,
       .sinks = true,
       .softcap = 0},
      // Many 128-row and 128-key blocks at head_dim 128: window tiles skipped, sinks.
      {.dtype = DType::kBF16,
       .d = 128,
       .hq = 8,
       .hkv = 2,
       .lens_q = {1500, 260},
       .lens_k = {1500, 260},
       .causal = true,
       .window = 300,
       .sinks = true,
       .softcap = 0},
      // The head-packing window kernel: one head per CTA (group 1), four CTAs per KV head
      // (group 16), groups that are not powers of two, fewer queries than keys.
      {.dtype = DType::kBF16,
       .d = 128,
       .hq = 4,
       .hkv = 4,
       .lens_q = {0, 1, 300, 77},
       .lens_k = {3, 1, 300, 200},
       .causal = true,
       .window = 100,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 32,
       .hkv = 2,
       .lens_q = {517, 16, 15},
       .lens_k = {517, 16, 15},
       .causal = true,
       .window = 128,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kF16,
       .d = 64,
       .hq = 12,
       .hkv = 2,
       .lens_q = {129, 260},
       .lens_k = {129, 400},
       .causal = false,
       .window = 64,
       .sinks = false,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 128,
       .hq = 6,
       .hkv = 1,
       .lens_q = {250, 33},
       .lens_k = {250, 40},
       .causal = true,
       .window = 47,
       .sinks = true,
       .softcap = 20.0f},
      // The window strip kernel (GPT-OSS's group 8 at head_dim 64, windows up to 128 keys back):
      // strips over several ring laps (4096 rows), empty and one-row sequences, fewer keys than
      // queries and more, the diagonal alone, windows at and below its full-band path's 120.
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 64,
       .hkv = 8,
       .lens_q = {4096, 3000},
       .lens_k = {4096, 3000},
       .causal = true,
       .window = 128,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kF16,
       .d = 64,
       .hq = 16,
       .hkv = 2,
       .lens_q = ragged_q,
       .lens_k = ragged_k,
       .causal = true,
       .window = 127,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 8,
       .hkv = 1,
       .lens_q = {300, 7, 129},
       .lens_k = {300, 7, 129},
       .causal = true,
       .window = 0,
       .sinks = false,
       .softcap = 0},
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 16,
       .hkv = 2,
       .lens_q = {200, 50, 9},
       .lens_k = {150, 50, 400},
       .causal = true,
       .window = 100,
       .sinks = true,
       .softcap = 0},
      {.dtype = DType::kF16,
       .d = 64,
       .hq = 8,
       .hkv = 1,
       .lens_q = {17, 8, 9, 16, 1000},
       .lens_k = {17, 8, 9, 16, 1000},
       .causal = true,
       .window = 120,
       .sinks = false,
       .softcap = 0,
       .lse = false},
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 16,
       .hkv = 2,
       .lens_q = {500},
       .lens_k = {600},
       .causal = true,
       .window = 119,
       .sinks = true,
       .softcap = 0},
      // Rising keys: blocks where the running maxima must move and blocks where they may stay.
      {.dtype = DType::kBF16,
       .d = 128,
       .hq = 8,
       .hkv = 2,
       .lens_q = {1000, 300},
       .lens_k = {1000, 700},
       .causal = false,
       .window = -1,
       .sinks = false,
       .softcap = 0,
       .key_growth = 1.0f / 128},
      {.dtype = DType::kF16,
       .d = 64,
       .hq = 16,
       .hkv = 2,
       .lens_q = {900, 65},
       .lens_k = {900, 65},
       .causal = true,
       .window = -1,
       .sinks = true,
       .softcap = 0,
       .key_growth = 1.0f / 64},
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 16,
       .hkv = 2,
       .lens_q = {600, 130},
       .lens_k = {600, 130},
       .causal = true,
       .window = 128,
       .sinks = true,
       .softcap = 0,
       .key_growth = 1.0f / 32},
      {.dtype = DType::kBF16,
       .d = 64,
       .hq = 8,
       .hkv = 1,
       .lens_q = {2000},
       .lens_k = {2100},
       .causal = true,
       .window = 128,
       .sinks = false,
       .softcap = 0,
       .key_growth = 1.0f / 32},
      {.dtype = DType::kBF16,
       .d = 256,
       .hq = 4,
       .hkv = 2,
       .lens_q = {500},
       .lens_k = {500},
       .causal = true,
       .window = -1,
       .sinks = false,
       .softcap = 30.0f,
       .key_growth = 1.0f / 64},
  };
  const OperatorId prefill{kFamilyAttention, kModePrefill};
  for (const char* kernel : kPrefillKernels) {
    Registry::global().set_override(prefill, kernel);
    int ran = 0;
    for (const auto& c : cases) {
      if (Registry::global().find(kernel)->accepts(prefill_case_signature(c))) continue;  // this kernel does not run this case
      SCOPED_TRACE(kernel);
      run_prefill(rng, c);
      ++ran;
    }
    EXPECT_GT(ran, 5) << kernel;
  }
  Registry::global().set_override(prefill, "");
}

// A kernel may take only calls it computes right: every point of the semantic space (dtype x
// head_dim x GQA group x causal x window x sinks x softcap x lse) that a prefill kernel accepts is
// run on it against float64, with ragged lengths that put windows across block edges and
// sequences with fewer keys than queries.
TEST_F(Gpu, PrefillAcceptsOnlyWhatItComputesRight) {
  const OperatorId prefill{kFamilyAttention, kModePrefill};
  for (const char* kernel : kPrefillKernels) {
    Registry::global().set_override(prefill, kernel);
    int ran = 0;
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      for (int d : {64, 128, 256}) {
        for (int group : {1, 4, 8}) {
          for (int bits = 0; bits < 32; ++bits) {
            const PrefillCase c{.dtype = dtype,
                                .d = d,
                                .hq = 2 * group,
                                .hkv = 2,
                                .lens_q = {1, 90, 131},
                                .lens_k = {1, 150, 131},
                                .causal = (bits & 1) != 0,
                                .window = (bits & 2) != 0 ? 37 : -1,
                                .sinks = (bits & 4) != 0,
                                .softcap = (bits & 8) != 0 ? 25.0f : 0.0f,
                                .lse = (bits & 16) != 0};
            if (Registry::global().find(kernel)->accepts(prefill_case_signature(c))) continue;
            SCOPED_TRACE(kernel);
            run_prefill(rng, c);
            ++ran;
          }
        }
      }
    }
    EXPECT_GT(ran, 0) << kernel;
  }
  Registry::global().set_override(prefill, "");
}

struct DecodeCase {
  DType dtype;
  bool fp8;
  int d, hq, hkv, page_size, q_len;
  std::vector<int> seqlens;
  int window;
  bool sinks;
  // Queries this many times larger: scores spread so widely that a row's running maximum jumps by
  // large steps in some tiles and stays in others.
  float q_scale = 1.0f;
};

// `launches` > 1 enqueues the same call that many times before the result is checked.
void run_decode(std::mt19937& rng, const DecodeCase& c, int launches = 1) {
  DecodeProblem p;
  p.batch = static_cast<int>(c.seqlens.size());
  p.q_len = c.q_len;
  p.hq = c.hq;
  p.hkv = c.hkv;
  p.d = c.d;
  p.page_size = c.page_size;
  p.window_left = c.window;
  p.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  p.seqlens = c.seqlens;
  int max_len = *std::max_element(c.seqlens.begin(), c.seqlens.end());
  p.max_pages = std::max(1, (max_len + c.page_size - 1) / c.page_size);
  // A shuffled pool of pages; sequence 0 and 1 share their first page when both have tokens.
  const int num_pages = p.batch * p.max_pages + 3;
  std::vector<int> pool(static_cast<size_t>(num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  p.page_table.assign(static_cast<size_t>(p.batch * p.max_pages), 0);
  for (size_t i = 0; i < p.page_table.size(); ++i) p.page_table[i] = pool[i];
  if (p.batch > 1) p.page_table[static_cast<size_t>(p.max_pages)] = p.page_table[0];
  const size_t cache_elems = static_cast<size_t>(num_pages * c.page_size * c.hkv * c.d);
  const auto q_bits = random_half(rng, static_cast<size_t>(p.batch * c.q_len * c.hq * c.d), c.dtype, c.q_scale, p.q);
  std::vector<uint16_t> k_bits, v_bits;
  std::vector<uint8_t> k8, v8;
  const float k_scale = 0.5f, v_scale = 0.25f;
  if (c.fp8) {
    k8 = random_e4m3(rng, cache_elems, k_scale, p.k_cache);
    v8 = random_e4m3(rng, cache_elems, v_scale, p.v_cache);
  } else {
    k_bits = random_half(rng, cache_elems, c.dtype, 1.0f, p.k_cache);
    v_bits = random_half(rng, cache_elems, c.dtype, 1.0f, p.v_cache);
  }
  std::vector<float> sinks_f;
  if (c.sinks) {
    for (int h = 0; h < c.hq; ++h) sinks_f.push_back(static_cast<float>(h % 3) - 1.0f);
    p.sinks.assign(sinks_f.begin(), sinks_f.end());
  }
  const AttentionResult ref = decode_reference(p);

  auto q = DeviceBuffer::from(q_bits);
  auto kc = c.fp8 ? DeviceBuffer::from(k8) : DeviceBuffer::from(k_bits);
  auto vc = c.fp8 ? DeviceBuffer::from(v8) : DeviceBuffer::from(v_bits);
  auto pt = DeviceBuffer::from(p.page_table), lens = DeviceBuffer::from(p.seqlens), sinks = DeviceBuffer::from(sinks_f);
  DeviceBuffer out(q_bits.size() * 2 + 16), lse(static_cast<size_t>(p.batch * c.q_len * c.hq) * 4 + 16);
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  MhaDecodeArgs a;
  const int64_t rows = p.batch * c.q_len;
  const DType cache_type = c.fp8 ? DType::kF8E4M3 : c.dtype;
  a.q = view(q, c.dtype, {rows, c.hq, c.d});
  a.k_cache = view(kc, cache_type, {num_pages, c.page_size, c.hkv, c.d});
  a.v_cache = view(vc, cache_type, {num_pages, c.page_size, c.hkv, c.d});
  a.page_table = view(pt, DType::kI32, {p.batch, p.max_pages});
  a.cache_seqlens = view(lens, DType::kI32, {p.batch});
  a.out = view(out, c.dtype, {rows, c.hq, c.d});
  a.lse = view(lse, DType::kF32, {rows, c.hq});
  if (c.sinks) a.sinks = view(sinks, DType::kF32, {c.hq});
  a.q_len = c.q_len;
  a.window_left = c.window;
  a.k_scale = k_scale;
  a.v_scale = v_scale;
  for (int i = 0; i < launches; ++i) mha_decode_with_kvcache(a, nullptr);
  synchronize();
  const std::string what = "decode d=" + std::to_string(c.d) + " page=" + std::to_string(c.page_size) +
                           " q_len=" + std::to_string(c.q_len) + " fp8=" + std::to_string(c.fp8) + " window=" + std::to_string(c.window) +
                           " q_scale=" + std::to_string(c.q_scale);
  const double err = relative_error(decode_half(out.to_host<uint16_t>(q_bits.size()), c.dtype), ref.out);
  EXPECT_LT(err, c.dtype == DType::kBF16 ? 1e-2 : 2e-3) << what;
  expect_lse_close(lse.to_host<float>(static_cast<size_t>(rows * c.hq)), ref.lse, what);
}

const char* const kDecodeKernels[] = {"attention.decode.mma_split", "attention.decode.mma_split_fp8", "attention.decode.prefill_mma",
                                      "attention.decode.prefill_mma_fp8", "attention.decode.reference"};

// Runs every case on each decode kernel that accepts it; each kernel must run more than
// `at_least` of them.
void run_decode_cases(std::mt19937& rng, const std::vector<DecodeCase>& cases, int at_least) {
  const OperatorId decode{kFamilyAttention, kModeDecode};
  for (const char* kernel : kDecodeKernels) {
    Registry::global().set_override(decode, kernel);
    int ran = 0;
    for (const auto& c : cases) {
      Signature sig({kFamilyAttention, kModeDecode});
      sig.set("dtype", dtype_name(c.dtype)).set("kv_dtype", c.fp8 ? "e4m3" : dtype_name(c.dtype)).set("head_dim", int64_t{c.d});
      sig.set("group", int64_t{c.hq / c.hkv}).set("page_size", int64_t{c.page_size}).set("q_len", int64_t{c.q_len});
      for (const char* f : {"window", "sinks", "softcap", "lse"}) sig.set_flag(f, false);
      if (Registry::global().find(kernel)->accepts(sig)) continue;  // this kernel does not run this case
      SCOPED_TRACE(kernel);
      run_decode(rng, c);
      ++ran;
    }
    EXPECT_GT(ran, at_least) << kernel;
  }
  Registry::global().set_override(decode, "");
}

// Every case runs on each decode kernel that accepts it: the tensor-core split kernels, the paged
// prefill kernel for several tokens, and the reference. Below as many (sequence, KV head) pairs as SMs, the split kernels deal SMs / Hkv
// ranges to the sequences by their lengths; zero-length sequences, one-tile sequences and ranges
// left over are among the cases.
TEST_F(Gpu, DecodeKernelsMatchFloat64) {
  const std::vector<DecodeCase> cases = {
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 128,
       .hq = 32,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {0, 1, 17, 300},
       .window = -1,
       .sinks = false},
      // Widely spread scores (q_scale): running maxima that jump between tiles.
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 128,
       .hq = 32,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {3000, 700, 33},
       .window = -1,
       .sinks = true,
       .q_scale = 8.0f},
      {.dtype = DType::kBF16,
       .fp8 = true,
       .d = 64,
       .hq = 64,
       .hkv = 8,
       .page_size = 16,
       .q_len = 2,
       .seqlens = {2000, 300},
       .window = -1,
       .sinks = false,
       .q_scale = 8.0f},
      {.dtype = DType::kF16,
       .fp8 = false,
       .d = 64,
       .hq = 8,
       .hkv = 1,
       .page_size = 64,
       .q_len = 1,
       .seqlens = {64, 65, 1000},
       .window = -1,
       .sinks = true},
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 128,
       .hq = 16,
       .hkv = 2,
       .page_size = 32,
       .q_len = 4,
       .seqlens = {4, 40, 129},
       .window = -1,
       .sinks = false},
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 64,
       .hq = 8,
       .hkv = 8,
       .page_size = 128,
       .q_len = 2,
       .seqlens = {200, 7, 2},
       .window = 31,
       .sinks = true},
      {.dtype = DType::kBF16,
       .fp8 = true,
       .d = 128,
       .hq = 32,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {5, 33, 510},
       .window = -1,
       .sinks = false},
      {.dtype = DType::kF16,
       .fp8 = true,
       .d = 64,
       .hq = 16,
       .hkv = 4,
       .page_size = 64,
       .q_len = 3,
       .seqlens = {3, 100},
       .window = 10,
       .sinks = true},
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 128,
       .hq = 8,
       .hkv = 8,
       .page_size = 64,
       .q_len = 1,
       .seqlens = {65536, 1},
       .window = -1,
       .sinks = false},  // 64k context
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 128,
       .hq = 64,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {4096, 4000, 1, 0, 333, 4096, 2048, 17},
       .window = -1,
       .sinks = true},
      {.dtype = DType::kF16,
       .fp8 = false,
       .d = 64,
       .hq = 32,
       .hkv = 8,
       .page_size = 32,
       .q_len = 2,
       .seqlens = {3000, 2, 2999},
       .window = 100,
       .sinks = false},
      // Equal lengths: 16 ranges dealt 5 per sequence, one left over.
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 64,
       .hq = 64,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {5000, 5000, 5000},
       .window = -1,
       .sinks = true},
      // 12 KV heads: 11 ranges (132 SMs / 12) for 2 sequences.
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 64,
       .hq = 24,
       .hkv = 12,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {3000, 700},
       .window = -1,
       .sinks = true},
      // Long and ragged with a window that starts mid-tile: every split starts on a 16-token tile.
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 128,
       .hq = 32,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {32768, 32001, 5, 31999},
       .window = 1000,
       .sinks = true},
      // 20 x 8 (sequence, KV head) pairs fill an H100/H200: unsplit 4-warp CTAs, three per SM
      // (the cases above run split 8-warp CTAs).
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 128,
       .hq = 32,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {1, 700, 0, 513, 16, 17, 900, 255, 3, 64, 1000, 31, 2, 777, 128, 5, 640, 1, 99, 400},
       .window = -1,
       .sinks = true},
      {.dtype = DType::kF16,
       .fp8 = true,
       .d = 64,
       .hq = 64,
       .hkv = 8,
       .page_size = 32,
       .q_len = 2,
       .seqlens = {2, 700, 0, 513, 16, 17, 900, 255, 3, 64, 1000, 31, 2, 777, 128, 5, 640, 2, 99, 400},
       .window = 200,
       .sinks = false},
      // e4m3 caches on the fp8 tensor-core kernel: splits, q_len x group = 16, windows, sinks.
      {.dtype = DType::kBF16,
       .fp8 = true,
       .d = 128,
       .hq = 64,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {4096, 1, 0, 333, 2048},
       .window = -1,
       .sinks = true},
      {.dtype = DType::kF16,
       .fp8 = true,
       .d = 64,
       .hq = 8,
       .hkv = 1,
       .page_size = 128,
       .q_len = 2,
       .seqlens = {3000, 64, 1},
       .window = 100,
       .sinks = false},
      {.dtype = DType::kBF16,
       .fp8 = true,
       .d = 128,
       .hq = 32,
       .hkv = 8,
       .page_size = 32,
       .q_len = 1,
       .seqlens = {32768, 5, 20000},
       .window = 1000,
       .sinks = true},
      // An e4m3 cache at head_dim 64 runs two CTAs per SM: 33 ranges (2 x 132 SMs / 8) dealt
      // over a ragged batch.
      {.dtype = DType::kBF16,
       .fp8 = true,
       .d = 64,
       .hq = 32,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {20000, 9000, 17},
       .window = -1,
       .sinks = true},
      // head_dim 256 (Gemma: 16 query heads on 8 KV heads): split 6-warp CTAs over a ragged batch,
      // 8 query rows with a window (Gemma-3's local layers), unsplit 4-warp CTAs (20 x 8 pairs),
      // and an e4m3 cache.
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 256,
       .hq = 16,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {0, 1, 17, 300, 5000},
       .window = -1,
       .sinks = false},
      {.dtype = DType::kF16,
       .fp8 = false,
       .d = 256,
       .hq = 8,
       .hkv = 2,
       .page_size = 64,
       .q_len = 2,
       .seqlens = {2000, 2, 1500},
       .window = 1024,
       .sinks = true},
      {.dtype = DType::kBF16,
       .fp8 = false,
       .d = 256,
       .hq = 16,
       .hkv = 8,
       .page_size = 32,
       .q_len = 1,
       .seqlens = {1, 700, 0, 513, 16, 17, 900, 255, 3, 64, 1000, 31, 2, 777, 128, 5, 640, 1, 99, 400},
       .window = -1,
       .sinks = true},
      {.dtype = DType::kBF16,
       .fp8 = true,
       .d = 256,
       .hq = 32,
       .hkv = 8,
       .page_size = 16,
       .q_len = 1,
       .seqlens = {8000, 33, 1},
       .window = 1024,
       .sinks = false},
  };
  run_decode_cases(rng, cases, 2);
}

// Page sizes 1 to 256 (tiles that straddle pages below 16) and 1 to 16 new tokens per sequence
// (speculative verification), shuffled and shared pages, windows and sinks, on every decode
// kernel that takes them.
TEST_F(Gpu, DecodeEveryPageSizeAndSpeculativeLength) {
  std::vector<DecodeCase> cases;
  for (int page : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
    for (int q_len : {1, 3, 16}) {
      cases.push_back({.dtype = page % 4 == 0 ? DType::kBF16 : DType::kF16,
                       .fp8 = false,
                       .d = page >= 128  ? 256
                            : page >= 64 ? 128
                                         : 64,
                       .hq = 16,
                       .hkv = 2,
                       .page_size = page,
                       .q_len = q_len,
                       .seqlens = {q_len, 700, 33 + q_len, 0},
                       .window = page == 8 ? 50 : -1,
                       .sinks = page % 32 == 0});
    }
  }
  cases.push_back({.dtype = DType::kBF16,
                   .fp8 = true,
                   .d = 128,
                   .hq = 8,
                   .hkv = 8,
                   .page_size = 1,
                   .q_len = 1,
                   .seqlens = {5000, 17},
                   .window = -1,
                   .sinks = true});
  cases.push_back({.dtype = DType::kF16,
                   .fp8 = true,
                   .d = 64,
                   .hq = 16,
                   .hkv = 2,
                   .page_size = 4,
                   .q_len = 16,
                   .seqlens = {16, 700, 49},
                   .window = 50,
                   .sinks = false});
  run_decode_cases(rng, cases, 0);
}

// Speculative verification over a GQA group: 16 to 64 query rows a KV head, which the split
// kernels take in row tiles of 16, one tile a warp (up to 32 rows with a 16-bit cache, 16 at
// head_dim 256; 64 and 32 with an e4m3 cache; the paged prefill kernel takes the rest). Split
// grids (a few ragged sequences) and unsplit ones (20 sequences x 8 KV heads fill the SMs),
// 16-bit and e4m3 caches, windows and sinks.
TEST_F(Gpu, DecodeSpeculativeRowsOverAGqaGroup) {
  struct Shape {
    int d, hq, q_len;
    bool fp8;
  };
  const Shape shapes[] = {{64, 64, 3, false},  {64, 64, 8, true},   {64, 32, 16, false},  {128, 64, 2, false},
                          {128, 64, 4, true},  {128, 32, 5, false}, {256, 16, 16, false}, {256, 32, 8, true},
                          {256, 64, 3, false}, {256, 16, 8, false}, {128, 64, 9, true},   {64, 64, 16, true}};
  const std::vector<int> ragged = {3000, 9, 0, 700},
                         full = {1, 700, 0, 513, 16, 17, 900, 255, 3, 64, 1000, 31, 2, 777, 128, 5, 640, 1, 99, 400};
  std::vector<DecodeCase> cases;
  for (const Shape& sh : shapes) {
    for (bool split : {true, false}) {
      std::vector<int> lens = split ? ragged : full;
      for (int& len : lens) len = len == 0 ? 0 : std::max(len, sh.q_len);  // every query token has its key
      cases.push_back({.dtype = sh.d == 128 ? DType::kF16 : DType::kBF16,
                       .fp8 = sh.fp8,
                       .d = sh.d,
                       .hq = sh.hq,
                       .hkv = 8,
                       .page_size = split ? 16 : 32,
                       .q_len = sh.q_len,
                       .seqlens = lens,
                       .window = split ? 500 : -1,
                       .sinks = !split});
    }
  }
  run_decode_cases(rng, cases, 3);
}

// ---- extend and append ---------------------------------------------------------------------

struct ExtendCase {
  DType dtype;
  bool fp8;
  int d, hq, hkv, page_size;
  std::vector<int> lens_q, lens_k;  // new tokens and all keys (prefix + new) per sequence
  bool causal;
  int window;
  bool sinks;
  float softcap;
  bool append = false;  // the new tokens reach the cache through kv_cache_append, not the upload
  int page_gap = 0;     // rows between pages (poisoned): pages not packed, which TMA cannot copy whole
};

// A shuffled pool of pages: sequence b's key j lands in row j % page_size of page
// page_table[b][j / page_size]; three pages stay unused.
struct PagedLayout {
  int max_pages = 1, num_pages = 0;
  std::vector<int> page_table;
  size_t offset(int b, int key, int hkv, int d, int page_size, int page_gap = 0) const {
    const int page = page_table[static_cast<size_t>(b * max_pages + key / page_size)];
    return (static_cast<size_t>(page) * (page_size + page_gap) + key % page_size) * hkv * d;
  }
};

PagedLayout shuffled_pages(std::mt19937& rng, const std::vector<int>& lens_k, int page_size) {
  PagedLayout l;
  for (int len : lens_k) l.max_pages = std::max(l.max_pages, (len + page_size - 1) / page_size);
  const int batch = static_cast<int>(lens_k.size());
  l.num_pages = batch * l.max_pages + 3;
  std::vector<int> pool(static_cast<size_t>(l.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  l.page_table.assign(pool.begin(), pool.begin() + batch * l.max_pages);
  return l;
}

void run_extend(std::mt19937& rng, const ExtendCase& c) {
  PrefillProblem p;
  p.hq = c.hq;
  p.hkv = c.hkv;
  p.d = c.d;
  p.causal = c.causal;
  p.window_left = c.window;
  p.softcap = c.softcap;
  p.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  p.cu_q = {0};
  p.cu_k = {0};
  const int batch = static_cast<int>(c.lens_q.size());
  for (int b = 0; b < batch; ++b) {
    p.cu_q.push_back(p.cu_q.back() + c.lens_q[b]);
    p.cu_k.push_back(p.cu_k.back() + c.lens_k[b]);
  }
  const int total_q = p.cu_q.back(), total_k = p.cu_k.back();
  const size_t row = static_cast<size_t>(c.hkv * c.d);
  const auto q_bits = random_half(rng, static_cast<size_t>(total_q * c.hq * c.d), c.dtype, 1.0f, p.q);
  const float k_scale = 0.5f, v_scale = 0.25f;  // powers of two: e4m3 values times them are exact in 16 bits
  std::vector<uint16_t> k_bits, v_bits;
  std::vector<uint8_t> k8, v8;
  if (c.fp8) {
    k8 = random_e4m3(rng, total_k * row, k_scale, p.k);
    v8 = random_e4m3(rng, total_k * row, v_scale, p.v);
  } else {
    k_bits = random_half(rng, total_k * row, c.dtype, 1.0f, p.k);
    v_bits = random_half(rng, total_k * row, c.dtype, 1.0f, p.v);
  }
  std::vector<float> sinks_f;
  if (c.sinks) {
    for (int h = 0; h < c.hq; ++h) sinks_f.push_back(static_cast<float>(h % 3) - 1.0f);
    p.sinks.assign(sinks_f.begin(), sinks_f.end());
  }
  const AttentionResult ref = prefill_reference(p);

  // The caches, poisoned (0xFF is NaN in every cache type) where no key lands.
  const PagedLayout pages = shuffled_pages(rng, c.lens_k, c.page_size);
  const size_t elem = c.fp8 ? 1 : 2, cache_bytes = static_cast<size_t>(pages.num_pages) * (c.page_size + c.page_gap) * row * elem;
  std::vector<uint8_t> k_cache(cache_bytes, 0xFF), v_cache(cache_bytes, 0xFF);
  // The new tokens' rows, for kv_cache_append: 16-bit values (e4m3 values times the scale, exact).
  std::vector<uint16_t> new_k, new_v;
  std::vector<int64_t> slots;
  for (int b = 0; b < batch; ++b) {
    const int prefix = c.lens_k[b] - c.lens_q[b];
    for (int j = 0; j < c.lens_k[b]; ++j) {
      const size_t src = (static_cast<size_t>(p.cu_k[b]) + j) * row, dst = pages.offset(b, j, c.hkv, c.d, c.page_size, c.page_gap);
      if (c.append && j >= prefix) {
        for (size_t i = 0; i < row; ++i) {
          auto half = [&](double v) {
            return c.dtype == DType::kBF16 ? float_to_bf16(static_cast<float>(v)) : float_to_f16(static_cast<float>(v));
          };
          new_k.push_back(c.fp8 ? half(p.k[src + i]) : k_bits[src + i]);
          new_v.push_back(c.fp8 ? half(p.v[src + i]) : v_bits[src + i]);
        }
        slots.push_back(static_cast<int64_t>(dst / row));
        continue;
      }
      if (c.fp8) {
        std::copy_n(k8.begin() + static_cast<ptrdiff_t>(src), row, k_cache.begin() + static_cast<ptrdiff_t>(dst));
        std::copy_n(v8.begin() + static_cast<ptrdiff_t>(src), row, v_cache.begin() + static_cast<ptrdiff_t>(dst));
      } else {
        std::memcpy(&k_cache[dst * 2], &k_bits[src], row * 2);
        std::memcpy(&v_cache[dst * 2], &v_bits[src], row * 2);
      }
    }
  }
  auto q = DeviceBuffer::from(q_bits), kc = DeviceBuffer::from(k_cache), vc = DeviceBuffer::from(v_cache);
  auto pt = DeviceBuffer::from(pages.page_table), lens = DeviceBuffer::from(c.lens_k), cu_q = DeviceBuffer::from(p.cu_q);
  auto sinks = DeviceBuffer::from(sinks_f);
  const DType cache_type = c.fp8 ? DType::kF8E4M3 : c.dtype;
  const int64_t num_pages = pages.num_pages;
  if (c.append && !slots.empty()) {
    auto nk = DeviceBuffer::from(new_k), nv = DeviceBuffer::from(new_v), sl = DeviceBuffer::from(slots);
    KvAppendArgs app;
    const int64_t tokens = static_cast<int64_t>(slots.size());
    app.k = view(nk, c.dtype, {tokens, c.hkv, c.d});
    app.v = view(nv, c.dtype, {tokens, c.hkv, c.d});
    app.slot_mapping = view(sl, DType::kI64, {tokens});
    app.k_cache = view(kc, cache_type, {num_pages, c.page_size, c.hkv, c.d});
    app.v_cache = view(vc, cache_type, {num_pages, c.page_size, c.hkv, c.d});
    app.k_scale = k_scale;
    app.v_scale = v_scale;
    kv_cache_append(app, nullptr);
  }
  DeviceBuffer out(q_bits.size() * 2 + 16), lse(static_cast<size_t>(total_q * c.hq) * 4 + 16);
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  MhaExtendArgs a;
  a.q = view(q, c.dtype, {total_q, c.hq, c.d});
  a.k_cache = view(kc, cache_type, {num_pages, c.page_size, c.hkv, c.d});
  a.v_cache = view(vc, cache_type, {num_pages, c.page_size, c.hkv, c.d});
  a.k_cache.strides[0] = a.v_cache.strides[0] = static_cast<int64_t>(c.page_size + c.page_gap) * c.hkv * c.d;
  a.page_table = view(pt, DType::kI32, {batch, pages.max_pages});
  a.cache_seqlens = view(lens, DType::kI32, {batch});
  a.cu_seqlens_q = view(cu_q, DType::kI32, {batch + 1});
  a.max_seqlen_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
  a.out = view(out, c.dtype, {total_q, c.hq, c.d});
  a.lse = view(lse, DType::kF32, {total_q, c.hq});
  if (c.sinks) a.sinks = view(sinks, DType::kF32, {c.hq});
  a.causal = c.causal;
  a.window_left = c.window;
  a.softcap = c.softcap;
  a.k_scale = k_scale;
  a.v_scale = v_scale;
  mha_extend_with_kvcache(a, nullptr);
  synchronize();
  const std::string what = "extend d=" + std::to_string(c.d) + " page=" + std::to_string(c.page_size) + "+" + std::to_string(c.page_gap) +
                           " fp8=" + std::to_string(c.fp8) + " causal=" + std::to_string(c.causal) + " window=" + std::to_string(c.window) +
                           " append=" + std::to_string(c.append);
  const double err = relative_error(decode_half(out.to_host<uint16_t>(q_bits.size()), c.dtype), ref.out);
  EXPECT_LT(err, c.dtype == DType::kBF16 ? 1e-2 : 2e-3) << what;
  expect_lse_close(lse.to_host<float>(static_cast<size_t>(total_q * c.hq)), ref.lse, what);
}

// Extend over shuffled pages of every size: no prefix, short and long prefixes, a partly filled
// last page, windows that cross the prefix boundary, sinks, softcap, an e4m3 cache, and the new
// tokens brought in by kv_cache_append; on every extend kernel that takes the case.
TEST_F(Gpu, ExtendKernelsMatchFloat64) {
  std::vector<ExtendCase> cases;
  int i = 0;
  for (int page : {1, 2, 8, 16, 64, 256}) {
    for (bool causal : {true, false}) {
      ++i;
      cases.push_back({.dtype = i % 2 == 0 ? DType::kBF16 : DType::kF16,
                       .fp8 = false,
                       .d = i % 3 == 0 ? 128 : 64,
                       .hq = 16,
                       .hkv = 2,
                       .page_size = page,
                       .lens_q = {0, 1, 130, 77, 300},
                       .lens_k = {9, 1, 130, 77 + 1000, 300 + 4100},
                       .causal = causal,
                       .window = i % 4 == 0 ? 128 : -1,
                       .sinks = i % 3 == 1,
                       .softcap = i % 5 == 0 ? 30.0f : 0.0f,
                       .append = i % 2 == 1});
    }
  }
  // GPT-OSS's layers: sliding window 128 with sinks across the prefix boundary, and full.
  for (int window : {128, -1}) {
    cases.push_back({.dtype = DType::kBF16,
                     .fp8 = false,
                     .d = 64,
                     .hq = 64,
                     .hkv = 8,
                     .page_size = 64,
                     .lens_q = {200, 64},
                     .lens_k = {200 + 150, 64 + 4096},
                     .causal = true,
                     .window = window,
                     .sinks = true,
                     .softcap = 0,
                     .append = window < 0});
  }
  // Causal windows on pages of 8 to 256: prefixes that are not multiples of 16 (the window kernel
  // moves its blocks back to start keys on them), windows of whole and odd sizes, packed heads of
  // 4 and of 1, an empty and a one-token sequence, and pages with gaps between them.
  int j = 0;
  for (int page : {8, 16, 256}) {
    for (int window : {128, 37}) {
      ++j;
      cases.push_back({.dtype = j % 2 == 1 ? DType::kBF16 : DType::kF16,
                       .fp8 = false,
                       .d = j % 3 == 0 ? 128 : 64,
                       .hq = j % 3 == 2 ? 4 : 16,
                       .hkv = j % 3 == 2 ? 4 : 2,
                       .page_size = page,
                       .lens_q = {0, 1, 130, 77, 300},
                       .lens_k = {9, 1 + 5, 130 + 23, 77 + 1000, 300 + 4100},
                       .causal = true,
                       .window = window,
                       .sinks = j % 2 == 1,
                       .softcap = j == 3 ? 30.0f : 0.0f,
                       .append = j % 2 == 0,
                       .page_gap = j == 1 || j == 5 ? 3 : 0});
    }
  }
  // head_dim 256: 64-key blocks over pages smaller and larger than a block, copied by cp.async
  // (pages under 8 rows, or with gaps between them) and by TMA.
  int m = 0;
  for (int page : {1, 4, 16, 64, 256}) {
    ++m;
    cases.push_back({.dtype = m % 2 == 1 ? DType::kBF16 : DType::kF16,
                     .fp8 = false,
                     .d = 256,
                     .hq = 8,
                     .hkv = 2,
                     .page_size = page,
                     .lens_q = {0, 1, 130, 70},
                     .lens_k = {9, 1 + 64, 130 + 200, 70 + 700},
                     .causal = m != 3,
                     .window = m == 4 ? 100 : -1,
                     .sinks = m % 2 == 1,
                     .softcap = m == 2 ? 30.0f : 0.0f,
                     .append = m % 2 == 0,
                     .page_gap = m == 5 ? 3 : 0});
  }
  for (bool append : {false, true}) {
    cases.push_back({.dtype = DType::kBF16,
                     .fp8 = true,
                     .d = 128,
                     .hq = 8,
                     .hkv = 2,
                     .page_size = 16,
                     .lens_q = {33, 5},
                     .lens_k = {33 + 70, 5},
                     .causal = true,
                     .window = 40,
                     .sinks = true,
                     .softcap = 0,
                     .append = append});
  }
  // e4m3 caches at every head_dim over pages smaller and larger than a block (gapped ones too),
  // GPT-OSS's window with sinks, a soft cap, rows appended through kv_cache_append.
  int f = 0;
  for (int page : {1, 8, 16, 64}) {
    for (int d : {64, 128, 256}) {
      ++f;
      cases.push_back({.dtype = f % 2 == 1 ? DType::kBF16 : DType::kF16,
                       .fp8 = true,
                       .d = d,
                       .hq = 16,
                       .hkv = 2,
                       .page_size = page,
                       .lens_q = {0, 1, 77, 130},
                       .lens_k = {5, 1 + 40, 77 + 300, 130 + 90},
                       .causal = page != 8,
                       .window = d == 64 && page == 16 ? 128 : -1,
                       .sinks = f % 3 == 0 || (d == 64 && page == 16),
                       .softcap = d == 128 && page == 64 ? 30.0f : 0.0f,
                       .append = page == 16,
                       .page_gap = page == 8 ? 3 : 0});
    }
  }
  // e4m3 caches on the warp-specialized kernel over long prefixes: tens of blocks a CTA, so the
  // stage rings and both staging slots go round many times; pages gathered (one-row, gapped) and
  // pages TMA copies whole (16 and 64 rows).
  struct LongCase {
    int d, page, gap;
  };
  int g = 0;
  for (const LongCase& lc : std::vector<LongCase>{{64, 1, 0}, {128, 16, 3}, {128, 16, 0}, {64, 64, 0}}) {
    ++g;
    cases.push_back({.dtype = g % 2 == 1 ? DType::kF16 : DType::kBF16,
                     .fp8 = true,
                     .d = lc.d,
                     .hq = 16,
                     .hkv = 2,
                     .page_size = lc.page,
                     .lens_q = {300, 64, 1},
                     .lens_k = {300 + 4100, 64 + 1000, 1 + 2000},
                     .causal = g != 1,
                     .window = -1,
                     .sinks = g % 2 == 1,
                     .softcap = 0,
                     .append = g == 3,
                     .page_gap = lc.gap});
  }
  // GPT-OSS's sliding layers (the window strip kernel), over pages TMA copies whole and over pages
  // it gathers (under 8 rows, or with gaps between them): prefixes of every residue mod 8 (its
  // steps move back to start on multiples of 8 keys), the last step's keys ending inside a block
  // whose other rows are poisoned, windows of 0 to 128, 2000 new tokens (strips over many ring
  // laps), empty and one-token sequences, with and without sinks and appended rows; e4m3 caches
  // (always gathered) at pages of 1, 4, 16 with gaps and 64.
  struct StripCase {
    int page, window, gap;
    bool fp8;
  };
  int w = 0;
  for (const StripCase& strip : std::vector<StripCase>{{8, 128, 0, false},
                                                       {16, 127, 0, false},
                                                       {64, 0, 0, false},
                                                       {256, 100, 0, false},
                                                       {1, 128, 0, false},
                                                       {4, 127, 0, false},
                                                       {16, 128, 3, false},
                                                       {1, 128, 0, true},
                                                       {4, 127, 0, true},
                                                       {16, 128, 3, true},
                                                       {64, 100, 0, true}}) {
    ++w;
    cases.push_back({.dtype = w % 2 == 1 ? DType::kBF16 : DType::kF16,
                     .fp8 = strip.fp8,
                     .d = 64,
                     .hq = 16,
                     .hkv = 2,
                     .page_size = strip.page,
                     .lens_q = {0, 1, 130, 77, 300, 2000},
                     .lens_k = {9, 1 + 5 + w, 130 + 23, 77 + 1000 + w, 300 + 4100, 2000 + 2 * w},
                     .causal = true,
                     .window = strip.window,
                     .sinks = w != 3,
                     .softcap = 0,
                     .append = w % 2 == 0,
                     .page_gap = strip.gap});
  }
  const OperatorId extend{kFamilyAttention, kModeExtend};
  for (const char* kernel : {"attention.extend.window_strip", "attention.extend.wgmma_ws", "attention.extend.wgmma_ws_fp8",
                             "attention.extend.wgmma_window", "attention.extend.mma", "attention.extend.mma_window",
                             "attention.extend.mma_fp8", "attention.extend.mma_window_fp8", "attention.extend.reference"}) {
    Registry::global().set_override(extend, kernel);
    int ran = 0;
    for (const auto& c : cases) {
      Signature sig({kFamilyAttention, kModeExtend});
      sig.set("dtype", dtype_name(c.dtype)).set("kv_dtype", c.fp8 ? "e4m3" : dtype_name(c.dtype)).set("head_dim", int64_t{c.d});
      sig.set("group", int64_t{c.hq / c.hkv}).set("page_size", int64_t{c.page_size}).set_flag("causal", c.causal);
      sig.set_flag("window", c.window >= 0).set_flag("sinks", c.sinks).set_flag("softcap", c.softcap > 0).set_flag("lse", true);
      if (c.window >= 0 && c.window <= 128) sig.set_flag("short_window", true);  // as signature_of sets it
      if (Registry::global().find(kernel)->accepts(sig)) continue;
      SCOPED_TRACE(kernel);
      run_extend(rng, c);
      ++ran;
    }
    EXPECT_GT(ran, 0) << kernel;
  }
  Registry::global().set_override(extend, "");
}

// The workspace query names what a call takes from the scratch allocator, and launches nothing:
// a split decode (one long sequence) needs tickets and partial states, an unsplit one (a batch
// that fills the GPU) and extend need none; the query leaves `out` untouched.
TEST_F(Gpu, WorkspaceQueryMatchesWhatTheKernelTakes) {
  const int hq = 32, hkv = 8, d = 128, page = 16;
  for (int batch : {1, 64}) {
    const int ctx = 8192, max_pages = ctx / page;
    DeviceBuffer q(static_cast<size_t>(batch) * hq * d * 2), out(static_cast<size_t>(batch) * hq * d * 2);
    DeviceBuffer kc(static_cast<size_t>(batch) * max_pages * page * hkv * d * 2), vc(kc.bytes());
    std::vector<int> table(static_cast<size_t>(batch * max_pages)), lens(static_cast<size_t>(batch), ctx);
    std::iota(table.begin(), table.end(), 0);
    auto pt = DeviceBuffer::from(table), ln = DeviceBuffer::from(lens);
    out.fill_bytes(0xAB);
    MhaDecodeArgs a;
    a.q = view(q, DType::kBF16, {batch, hq, d});
    a.out = view(out, DType::kBF16, {batch, hq, d});
    a.k_cache = view(kc, DType::kBF16, {batch * max_pages, page, hkv, d});
    a.v_cache = view(vc, DType::kBF16, {batch * max_pages, page, hkv, d});
    a.page_table = view(pt, DType::kI32, {batch, max_pages});
    a.cache_seqlens = view(ln, DType::kI32, {batch});
    const size_t bytes = workspace_bytes(a, nullptr);
    synchronize();
    if (batch == 1) {
      EXPECT_GT(bytes, static_cast<size_t>(hkv) * 4) << "a split decode keeps partial states";
    } else {
      EXPECT_EQ(bytes, 0u) << "an unsplit decode needs no workspace";
    }
    const auto untouched = out.to_host<uint8_t>(out.bytes());
    EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](uint8_t b) { return b == 0xAB; })) << "the query launched";
  }
}

// kv_cache_append writes exactly the rows its slots name, skips negative slots, leaves every
// other byte alone, and rounds to e4m3 as the host's independent encoder does (saturating, ties
// to even), values out of range and NaN included.
TEST_F(Gpu, KvAppendWritesItsSlotsExactly) {
  for (bool fp8 : {false, true}) {
    for (int page : {1, 16, 256}) {
      const int tokens = 300, hkv = 4, d = 64, num_pages = 3 * tokens / page + 4;
      const size_t row = static_cast<size_t>(hkv * d), elem = fp8 ? 1 : 2;
      std::vector<double> kv, vv;
      auto k_bits = random_half(rng, tokens * row, DType::kBF16, 100.0f, kv);  // some beyond 448 once scaled
      auto v_bits = random_half(rng, tokens * row, DType::kBF16, 1.0f, vv);
      k_bits[5] = 0x7FC0;  // NaN
      std::vector<int64_t> slots(static_cast<size_t>(tokens));
      std::vector<int64_t> pool(static_cast<size_t>(num_pages * page));
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
      for (int t = 0; t < tokens; ++t) slots[static_cast<size_t>(t)] = t % 7 == 3 ? -1 : pool[static_cast<size_t>(t)];
      std::vector<uint8_t> k_cache(static_cast<size_t>(num_pages * page) * row * elem), v_cache(k_cache.size());
      std::uniform_int_distribution<int> byte(0, 255);
      for (auto& b : k_cache) b = static_cast<uint8_t>(byte(rng));
      for (auto& b : v_cache) b = static_cast<uint8_t>(byte(rng));
      auto expect_k = k_cache, expect_v = v_cache;
      const float k_scale = 0.5f, v_scale = 0.01f;
      for (int t = 0; t < tokens; ++t) {
        const int64_t slot = slots[static_cast<size_t>(t)];
        if (slot < 0) continue;
        for (size_t i = 0; i < row; ++i) {
          const size_t src = static_cast<size_t>(t) * row + i, dst = static_cast<size_t>(slot) * row + i;
          if (fp8) {
            expect_k[dst] = float_to_e4m3_saturated(bf16_to_float(k_bits[src]) / k_scale);
            expect_v[dst] = float_to_e4m3_saturated(bf16_to_float(v_bits[src]) / v_scale);
          } else {
            std::memcpy(&expect_k[dst * 2], &k_bits[src], 2);
            std::memcpy(&expect_v[dst * 2], &v_bits[src], 2);
          }
        }
      }
      auto k = DeviceBuffer::from(k_bits), v = DeviceBuffer::from(v_bits), sl = DeviceBuffer::from(slots);
      auto kc = DeviceBuffer::from(k_cache), vc = DeviceBuffer::from(v_cache);
      const DType cache_type = fp8 ? DType::kF8E4M3 : DType::kBF16;
      KvAppendArgs a;
      a.k = view(k, DType::kBF16, {tokens, hkv, d});
      a.v = view(v, DType::kBF16, {tokens, hkv, d});
      a.slot_mapping = view(sl, DType::kI64, {tokens});
      a.k_cache = view(kc, cache_type, {num_pages, page, hkv, d});
      a.v_cache = view(vc, cache_type, {num_pages, page, hkv, d});
      a.k_scale = k_scale;
      a.v_scale = v_scale;
      kv_cache_append(a, nullptr);
      synchronize();
      SCOPED_TRACE("fp8=" + std::to_string(fp8) + " page=" + std::to_string(page));
      const auto got_k = kc.to_host<uint8_t>(k_cache.size()), got_v = vc.to_host<uint8_t>(v_cache.size());
      size_t wrong = 0;
      for (size_t i = 0; i < got_k.size(); ++i) wrong += (got_k[i] != expect_k[i]) + (got_v[i] != expect_v[i]);
      EXPECT_EQ(wrong, 0u);
    }
  }
}

// Plugin kernels through the operators on the GPU: the kernel-plugin template's kv_cache_append
// (selected once plugins may outrank built-ins, compiled by the JIT, cached, launched) writes
// exactly what the built-in kernel writes; the ABI v2 test plugin's decode kernel runs with its
// cluster, its workspace and its specialization.
TEST_F(Gpu, PluginKernelsRunThroughTheOperators) {
  load_plugin(KILN_TEST_PLUGIN_ACME);
  load_plugin(KILN_TEST_PLUGIN_V2);
  Registry::global().set_plugins_outrank_builtins(true);
  const int tokens = 200, hkv = 4, d = 128, page = 16, num_pages = 2 * tokens / page + 3;
  const size_t row = static_cast<size_t>(hkv * d);
  std::vector<double> ignored;
  const auto k_bits = random_half(rng, tokens * row, DType::kBF16, 1.0f, ignored);
  const auto v_bits = random_half(rng, tokens * row, DType::kBF16, 1.0f, ignored);
  std::vector<int64_t> pool(static_cast<size_t>(num_pages * page)), slots(static_cast<size_t>(tokens));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  for (int t = 0; t < tokens; ++t) slots[static_cast<size_t>(t)] = t % 5 == 2 ? -1 : pool[static_cast<size_t>(t)];
  std::vector<uint16_t> cache(static_cast<size_t>(num_pages * page) * row);
  std::uniform_int_distribution<int> bits(0, 0xFFFF);
  for (auto& b : cache) b = static_cast<uint16_t>(bits(rng));
  std::vector<std::vector<uint16_t>> results;
  for (const char* kernel : {"acme.attention.kv_append.rows", "attention.kv_append"}) {
    auto k = DeviceBuffer::from(k_bits), v = DeviceBuffer::from(v_bits), sl = DeviceBuffer::from(slots);
    auto kc = DeviceBuffer::from(cache), vc = DeviceBuffer::from(cache);
    KvAppendArgs a;
    a.k = view(k, DType::kBF16, {tokens, hkv, d});
    a.v = view(v, DType::kBF16, {tokens, hkv, d});
    a.slot_mapping = view(sl, DType::kI64, {tokens});
    a.k_cache = view(kc, DType::kBF16, {num_pages, page, hkv, d});
    a.v_cache = view(vc, DType::kBF16, {num_pages, page, hkv, d});
    if (std::string(kernel) == "acme.attention.kv_append.rows") {
      const Signature sig = Signature::parse({"attention", "kv_append"}, "dtype=bf16,kv_dtype=bf16");
      EXPECT_EQ(Registry::global().select(sig, detect_devices().devices.front())->name, kernel);
    } else {
      Registry::global().set_override({"attention", "kv_append"}, kernel);
    }
    kv_cache_append(a, nullptr);
    synchronize();
    auto got = kc.to_host<uint16_t>(cache.size());
    const auto got_v = vc.to_host<uint16_t>(cache.size());
    got.insert(got.end(), got_v.begin(), got_v.end());
    results.push_back(std::move(got));
  }
  Registry::global().set_override({"attention", "kv_append"}, "");
  EXPECT_TRUE(results[0] == results[1]) << "the plugin's rows differ from the built-in kernel's";

  // The v2 plugin's decode: grid (batch, 2) in clusters of (1, 2), a workspace of batch * 4 KiB.
  const int batch = 3, hq = 8, kv_heads = 4, hd = 64, pg = 16;
  auto q = DeviceBuffer(static_cast<size_t>(batch * hq * hd) * 2),
       kcache = DeviceBuffer(static_cast<size_t>(batch * pg * kv_heads * hd) * 2);
  q.fill_bytes(0);
  kcache.fill_bytes(0);
  auto out = DeviceBuffer(static_cast<size_t>(batch * hq * hd) * 2), lse = DeviceBuffer(static_cast<size_t>(batch * hq) * 4);
  lse.fill_bytes(0xFF);
  std::vector<int> table(static_cast<size_t>(batch)), lens(static_cast<size_t>(batch), 5);
  std::iota(table.begin(), table.end(), 0);
  auto pt = DeviceBuffer::from(table), sl = DeviceBuffer::from(lens);
  MhaDecodeArgs dec;
  dec.q = view(q, DType::kF16, {batch, hq, hd});
  dec.k_cache = view(kcache, DType::kF16, {batch, pg, kv_heads, hd});
  dec.v_cache = dec.k_cache;
  dec.page_table = view(pt, DType::kI32, {batch, 1});
  dec.cache_seqlens = view(sl, DType::kI32, {batch});
  dec.out = view(out, DType::kF16, {batch, hq, hd});
  dec.lse = view(lse, DType::kF32, {batch, hq});
  mha_decode_with_kvcache(dec, nullptr);
  synchronize();
  Registry::global().set_plugins_outrank_builtins(false);
  const auto trace = lse.to_host<float>(static_cast<size_t>(batch * hq));
  for (int cta = 0; cta < batch * 2; ++cta) {
    // head_dim 64, group 2 (8 query heads over 4): 64 * 2 * 10, plus the CTA's rank in its cluster.
    EXPECT_EQ(trace[static_cast<size_t>(cta)], 1280.0f + static_cast<float>(cta % 2)) << "CTA " << cta;
  }
}

struct MoeCase {
  bool mxfp4;
  int tokens, hidden, inter, experts, top_k;
  int routing;  // 0, 1, or 2 = precomputed
  bool renormalize = true;
  int activation;
  bool interleaved;
  bool bias;
  bool all_to_one = false;  // precomputed: every token to expert 3
  bool w4a8 = false;        // activations quantized to MXFP8 (activation_dtype e4m3); MXFP4 weights
  // precomputed: ids outside [0, E), which add nothing: 1 each token's last slot (-1 and E + 5 in
  // turn), 2 every slot
  int foreign_ids = 0;
};

std::string describe(const MoeCase& c) {
  return "moe mxfp4=" + std::to_string(c.mxfp4) + " T=" + std::to_string(c.tokens) + " H=" + std::to_string(c.hidden) +
         " I=" + std::to_string(c.inter) + " E=" + std::to_string(c.experts) + " k=" + std::to_string(c.top_k) +
         " routing=" + std::to_string(c.routing) + " act=" + std::to_string(c.activation) +
         " interleaved=" + std::to_string(c.interleaved) + " bias=" + std::to_string(c.bias) + " w4a8=" + std::to_string(c.w4a8) +
         " foreign_ids=" + std::to_string(c.foreign_ids);
}

// Where a MoE case's tensors live on the device; all null is enough for the call's signature.
struct MoeCaseData {
  void *x = nullptr, *out = nullptr, *logits = nullptr, *ids = nullptr, *weights = nullptr;
  void *w13 = nullptr, *w2 = nullptr, *w13_scale = nullptr, *w2_scale = nullptr, *w13_bias = nullptr, *w2_bias = nullptr;
};

// The moe_apply arguments of a case over `d`.
MoeArgs moe_case_args(const MoeCase& c, const MoeCaseData& d) {
  auto view_at = [](void* data, DType t, std::initializer_list<int64_t> shape) { return TensorView::contiguous(data, t, shape, 0); };
  const int64_t t64 = c.tokens, h64 = c.hidden, i64 = c.inter, e64 = c.experts;
  MoeArgs a;
  a.x = view_at(d.x, DType::kBF16, {t64, h64});
  a.out = view_at(d.out, DType::kBF16, {t64, h64});
  if (c.routing == 2) {
    a.topk_ids = view_at(d.ids, DType::kI32, {t64, c.top_k});
    a.topk_weights = view_at(d.weights, DType::kF32, {t64, c.top_k});
  } else {
    a.router_logits = view_at(d.logits, DType::kF32, {t64, e64});
    a.routing = c.routing == 0 ? MoeRouting::kTopkThenSoftmax : MoeRouting::kSoftmaxThenTopk;
    a.renormalize = c.renormalize;
  }
  a.top_k = c.top_k;
  if (c.mxfp4) {
    a.w13 = view_at(d.w13, DType::kF4E2M1x2, {e64, 2 * i64, h64 / 2});
    a.w13_scale = view_at(d.w13_scale, DType::kE8M0, {e64, 2 * i64, h64 / 32});
    a.w2 = view_at(d.w2, DType::kF4E2M1x2, {e64, h64, i64 / 2});
    a.w2_scale = view_at(d.w2_scale, DType::kE8M0, {e64, h64, i64 / 32});
  } else {
    a.w13 = view_at(d.w13, DType::kBF16, {e64, 2 * i64, h64});
    a.w2 = view_at(d.w2, DType::kBF16, {e64, h64, i64});
  }
  if (c.bias) {
    a.w13_bias = view_at(d.w13_bias, DType::kF32, {e64, 2 * i64});
    a.w2_bias = view_at(d.w2_bias, DType::kF32, {e64, h64});
  }
  a.activation = c.activation == 0 ? MoeActivation::kSiluGlu : MoeActivation::kSwigluClamped;
  a.gate_up_layout = c.interleaved ? GateUpLayout::kInterleaved : GateUpLayout::kConcatenated;
  a.activation_dtype = c.w4a8 ? DType::kF8E4M3 : DType::kBF16;
  return a;
}

// Compiles (or finds in the cache) every kernel the cases will select, on every core at once,
// before they run one by one: a MoE kernel takes seconds to compile, and a test selects dozens
// (with standard MXFP4 weights, their prepared form too). Under the caller's kernel override.
void warm_moe_cases(const std::vector<MoeCase>& cases) {
  Manifest manifest;
  manifest.source = "tests/gpu";
  manifest.model = "moe-cases";
  auto add = [&](const Signature& sig) {
    if (std::find(manifest.signatures.begin(), manifest.signatures.end(), sig) == manifest.signatures.end()) {
      manifest.signatures.push_back(sig);
    }
  };
  for (const auto& c : cases) {
    MoeArgs a = moe_case_args(c, {});
    add(signature_of(a));
    if (c.mxfp4) {
      a.w13.dtype = a.w2.dtype = DType::kF4E2M1x2Prepared;
      add(signature_of(a));
    }
  }
  WarmupOptions options;
  options.targets = {detail::cuda::device(0).platform.arch};
  // A signature that fails here fails again, with its case named, when the case runs.
  for (const auto& item : warmup(manifest, options).items) {
    if (item.status == WarmupItem::Status::kFailed) std::fprintf(stderr, "warm-up: %s: %s\n", item.signature.c_str(), item.reason.c_str());
  }
}

void run_moe(std::mt19937& rng, const MoeCase& c) {
  MoeProblem p;
  p.tokens = c.tokens;
  p.hidden = c.hidden;
  p.inter = c.inter;
  p.experts = c.experts;
  p.top_k = c.top_k;
  p.routing = c.routing == 1 ? 1 : 0;
  p.renormalize = c.renormalize;
  p.activation = c.activation;
  p.interleaved = c.interleaved;
  const size_t T = static_cast<size_t>(c.tokens), H = static_cast<size_t>(c.hidden), I = static_cast<size_t>(c.inter),
               E = static_cast<size_t>(c.experts), K = static_cast<size_t>(c.top_k);
  const auto x_bits = random_half(rng, T * H, DType::kBF16, 1.0f, p.x);
  std::vector<float> logits_f, weights_f, b13_f, b2_f;
  std::vector<int> ids;
  std::normal_distribution<float> n01(0.0f, 1.0f);
  if (c.routing == 2) {
    for (size_t t = 0; t < T; ++t) {
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      if (c.all_to_one) order[0] = 3, order[1] = 3 == order[1] ? 0 : order[1];
      for (size_t j = 0; j < K; ++j) {
        const bool foreign = c.foreign_ids == 2 || (c.foreign_ids == 1 && j + 1 == K);
        ids.push_back(foreign ? (t % 2 == 0 ? -1 : static_cast<int>(E) + 5) : c.all_to_one && j == 0 ? 3 : order[j]);
        weights_f.push_back(std::fabs(n01(rng)) / static_cast<float>(K));
      }
    }
    p.topk_ids = ids;
    p.topk_weights.assign(weights_f.begin(), weights_f.end());
  } else {
    for (size_t i = 0; i < T * E; ++i) logits_f.push_back(n01(rng) * 2.0f);
    p.logits.assign(logits_f.begin(), logits_f.end());
  }
  // Weights: bf16 with std 1/sqrt(K-dim), or MXFP4 with random nibbles and scales 2^-6 .. 2^-3.
  std::vector<uint16_t> w13_bits, w2_bits;
  std::vector<uint8_t> w13_packed, w2_packed, w13_scale, w2_scale;
  if (c.mxfp4) {
    random_mxfp4(rng, E * 2 * I, H, w13_packed, w13_scale, p.w13);
    random_mxfp4(rng, E * H, I, w2_packed, w2_scale, p.w2);
  } else {
    w13_bits = random_half(rng, E * 2 * I * H, DType::kBF16, 1.0f / std::sqrt(static_cast<float>(H)), p.w13);
    w2_bits = random_half(rng, E * H * I, DType::kBF16, 1.0f / std::sqrt(static_cast<float>(I)), p.w2);
  }
  if (c.bias) {
    for (size_t i = 0; i < E * 2 * I; ++i) b13_f.push_back(n01(rng) * 0.1f);
    for (size_t i = 0; i < E * H; ++i) b2_f.push_back(n01(rng) * 0.1f);
    p.w13_bias.assign(b13_f.begin(), b13_f.end());
    p.w2_bias.assign(b2_f.begin(), b2_f.end());
  }
  p.mxfp8_activations = c.w4a8;
  const std::vector<double> ref = moe_apply_reference(p);
  std::vector<double> ref_bf16_activations;  // W4A8: what skipping the quantization would give
  if (c.w4a8) {
    p.mxfp8_activations = false;
    ref_bf16_activations = moe_apply_reference(p);
  }

  auto x = DeviceBuffer::from(x_bits), logits = DeviceBuffer::from(logits_f), idb = DeviceBuffer::from(ids),
       wb = DeviceBuffer::from(weights_f);
  auto w13 = c.mxfp4 ? DeviceBuffer::from(w13_packed) : DeviceBuffer::from(w13_bits);
  auto w2 = c.mxfp4 ? DeviceBuffer::from(w2_packed) : DeviceBuffer::from(w2_bits);
  auto s13 = DeviceBuffer::from(w13_scale), s2 = DeviceBuffer::from(w2_scale), b13 = DeviceBuffer::from(b13_f),
       b2 = DeviceBuffer::from(b2_f);
  DeviceBuffer out(T * H * 2 + 16);
  out.fill_bytes(0xFF);
  MoeArgs a = moe_case_args(c, {.x = x.get(),
                                .out = out.get(),
                                .logits = logits.get(),
                                .ids = idb.get(),
                                .weights = wb.get(),
                                .w13 = w13.get(),
                                .w2 = w2.get(),
                                .w13_scale = s13.get(),
                                .w2_scale = s2.get(),
                                .w13_bias = b13.get(),
                                .w2_bias = b2.get()});
  moe_apply(a, nullptr);
  synchronize();
  std::vector<double> got(T * H);
  const auto bits = out.to_host<uint16_t>(T * H);
  for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_float(bits[i]);
  EXPECT_LT(relative_error(got, ref), 1e-2) << describe(c);
  if (c.w4a8) {
    // The quantization happened: the model of it is several times closer than bf16 activations.
    const double modelled = relative_error(got, ref), unquantized = relative_error(got, ref_bf16_activations);
    EXPECT_LT(4 * modelled, unquantized) << describe(c) << ": against the quantized model " << modelled << ", without it " << unquantized;
  }
  if (c.mxfp4) {  // the same weights prepared on the device (moe_prepare_weights): the same bits out
    a.w13 = moe_prepare_weights(a.w13, nullptr);
    a.w2 = moe_prepare_weights(a.w2, nullptr);
    ASSERT_EQ(a.w13.dtype, DType::kF4E2M1x2Prepared);
    out.fill_bytes(0xFF);
    moe_apply(a, nullptr);
    synchronize();
    const auto prepared = out.to_host<uint16_t>(T * H);
    EXPECT_EQ(prepared, bits) << describe(c) << ": prepared MXFP4 weights";
  }
}

// run_moe, an exception (a failed launch, a fault) reported with the case that raised it.
void run_moe_case(std::mt19937& rng, const MoeCase& c) {
  try {
    run_moe(rng, c);
  } catch (const std::exception& e) {
    ADD_FAILURE() << describe(c) << ": " << e.what();
    throw;
  }
}

TEST_F(Gpu, MoeKernelsMatchFloat64) {
  const std::vector<MoeCase> cases = {
      {.mxfp4 = false,
       .tokens = 5,
       .hidden = 64,
       .inter = 96,
       .experts = 8,
       .top_k = 2,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},
      {.mxfp4 = false,
       .tokens = 7,
       .hidden = 128,
       .inter = 64,
       .experts = 16,
       .top_k = 4,
       .routing = 1,
       .activation = 0,
       .interleaved = false,
       .bias = false},
      {.mxfp4 = false,
       .tokens = 3,
       .hidden = 64,
       .inter = 64,
       .experts = 4,
       .top_k = 2,
       .routing = 1,
       .renormalize = false,
       .activation = 0,
       .interleaved = false,
       .bias = true},
      {.mxfp4 = false,
       .tokens = 3,
       .hidden = 72,
       .inter = 40,
       .experts = 8,
       .top_k = 2,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},  // H not a multiple of 16 (a half row tile)
      {.mxfp4 = false,
       .tokens = 9,
       .hidden = 64,
       .inter = 32,
       .experts = 8,
       .top_k = 2,
       .routing = 2,
       .activation = 0,
       .interleaved = false,
       .bias = false,
       .all_to_one = true},  // all tokens to expert 3
      // ids outside [0, E): each token's last slot (routed in every CTA; in the grid, on the
      // streaming phases and, with bf16 weights on sm_90a, the grouped GEMMs), every slot
      {.mxfp4 = true,
       .tokens = 3,
       .hidden = 128,
       .inter = 64,
       .experts = 8,
       .top_k = 4,
       .routing = 2,
       .activation = 1,
       .interleaved = true,
       .bias = true,
       .foreign_ids = 1},
      {.mxfp4 = true,
       .tokens = 40,
       .hidden = 64,
       .inter = 64,
       .experts = 8,
       .top_k = 2,
       .routing = 2,
       .activation = 0,
       .interleaved = false,
       .bias = true,
       .foreign_ids = 1},
      {.mxfp4 = false,
       .tokens = 40,
       .hidden = 64,
       .inter = 64,
       .experts = 8,
       .top_k = 2,
       .routing = 2,
       .activation = 0,
       .interleaved = false,
       .bias = true,
       .foreign_ids = 1},
      {.mxfp4 = true,
       .tokens = 2,
       .hidden = 64,
       .inter = 64,
       .experts = 8,
       .top_k = 2,
       .routing = 2,
       .activation = 0,
       .interleaved = false,
       .bias = true,
       .foreign_ids = 2},
      {.mxfp4 = true,
       .tokens = 4,
       .hidden = 128,
       .inter = 64,
       .experts = 8,
       .top_k = 4,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},  // MXFP4, GPT-OSS style
      {.mxfp4 = true,
       .tokens = 1,
       .hidden = 64,
       .inter = 96,
       .experts = 32,
       .top_k = 4,
       .routing = 2,
       .activation = 0,
       .interleaved = false,
       .bias = false},
      {.mxfp4 = false,
       .tokens = 64,
       .hidden = 256,
       .inter = 128,
       .experts = 8,
       .top_k = 2,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},
      // GPT-OSS-120B's hidden and intermediate sizes (fewer experts), one token and three.
      {.mxfp4 = true,
       .tokens = 1,
       .hidden = 2880,
       .inter = 2880,
       .experts = 4,
       .top_k = 2,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},
      {.mxfp4 = false,
       .tokens = 3,
       .hidden = 2880,
       .inter = 2880,
       .experts = 4,
       .top_k = 2,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},
      // 128 and 256 experts (4 and 8 router logits per lane), many tokens per expert (chunks).
      {.mxfp4 = false,
       .tokens = 8,
       .hidden = 256,
       .inter = 128,
       .experts = 128,
       .top_k = 4,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = false},
      {.mxfp4 = true,
       .tokens = 20,
       .hidden = 64,
       .inter = 32,
       .experts = 256,
       .top_k = 8,
       .routing = 1,
       .renormalize = false,
       .activation = 0,
       .interleaved = false,
       .bias = true},
      // MXFP4 at the most tokens every CTA routes itself (x in its shared memory) and one more.
      {.mxfp4 = true,
       .tokens = 16,
       .hidden = 256,
       .inter = 128,
       .experts = 8,
       .top_k = 4,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},
      {.mxfp4 = true,
       .tokens = 17,
       .hidden = 256,
       .inter = 128,
       .experts = 8,
       .top_k = 4,
       .routing = 1,
       .activation = 0,
       .interleaved = false,
       .bias = false},
      {.mxfp4 = false,
       .tokens = 300,
       .hidden = 128,
       .inter = 64,
       .experts = 8,
       .top_k = 2,
       .routing = 1,
       .activation = 1,
       .interleaved = false,
       .bias = true},
      // More chunks (at least 300) than the kernel's chunk-to-expert table holds: found by search.
      // Its 2400 pairs take the grouped GEMMs on sm_90a; the next case's 2000, spread over 128
      // experts (about 300 chunks of at most 8 pairs), keep the streaming phases there too.
      {.mxfp4 = true,
       .tokens = 600,
       .hidden = 64,
       .inter = 64,
       .experts = 8,
       .top_k = 4,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},
      {.mxfp4 = true,
       .tokens = 500,
       .hidden = 64,
       .inter = 64,
       .experts = 128,
       .top_k = 4,
       .routing = 0,
       .activation = 0,
       .interleaved = false,
       .bias = true},
      // MXFP4's large-batch build (experts averaging at least 96 pairs) below the grouped GEMMs'
      // 2048 pairs: its streaming phases keep their split-tile sums after the rings.
      {.mxfp4 = true,
       .tokens = 200,
       .hidden = 128,
       .inter = 128,
       .experts = 8,
       .top_k = 4,
       .routing = 1,
       .activation = 0,
       .interleaved = false,
       .bias = true},
      // The grouped-GEMM phases (sm_90a, bf16, from a token count on, H and I multiples of 64):
      // one expert with 800 pairs (7 row tiles), concatenated gate/up over several column tiles
      // with biases, and about two tiles per CTA (claimed ones), 64-pair last tiles among them.
      // H = 128 and I = 64 (the T = 300 case above) run one or two K slices a tile.
      {.mxfp4 = false,
       .tokens = 400,
       .hidden = 192,
       .inter = 256,
       .experts = 8,
       .top_k = 2,
       .routing = 2,
       .activation = 0,
       .interleaved = false,
       .bias = false,
       .all_to_one = true},
      {.mxfp4 = false,
       .tokens = 160,
       .hidden = 512,
       .inter = 384,
       .experts = 16,
       .top_k = 4,
       .routing = 0,
       .activation = 1,
       .interleaved = false,
       .bias = true},
      {.mxfp4 = false,
       .tokens = 4000,
       .hidden = 256,
       .inter = 192,
       .experts = 8,
       .top_k = 4,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = false},
      {.mxfp4 = false,
       .tokens = 400,
       .hidden = 128,
       .inter = 128,
       .experts = 8,
       .top_k = 2,
       .routing = 2,
       .activation = 0,
       .interleaved = false,
       .bias = false,
       .all_to_one = true},
      // 8192 tokens, a long prefill's count, on the grouped GEMMs (bf16, and MXFP4 standard and
      // prepared, converted to bf16 on the way).
      {.mxfp4 = false,
       .tokens = 8192,
       .hidden = 256,
       .inter = 128,
       .experts = 16,
       .top_k = 4,
       .routing = 0,
       .activation = 1,
       .interleaved = true,
       .bias = true},
      {.mxfp4 = true,
       .tokens = 8192,
       .hidden = 256,
       .inter = 128,
       .experts = 16,
       .top_k = 4,
       .routing = 1,
       .activation = 0,
       .interleaved = false,
       .bias = true},
  };
  const OperatorId moe{kFamilyMoe, kModeApply};
  // The stream kernel's workspace: counters cleared, the rest 0xFF (it must write before it reads).
  setenv("KILN_POISON_WORKSPACE", "1", 1);
  for (const char* kernel : {"moe.apply.stream", "moe.apply.reference"}) {
    Registry::global().set_override(moe, kernel);
    SCOPED_TRACE(kernel);
    warm_moe_cases(cases);
    for (const auto& c : cases) run_moe_case(rng, c);
  }
  unsetenv("KILN_POISON_WORKSPACE");
  Registry::global().set_override(moe, "");
}

// An MXFP4 case (renormalized routing), with bf16 activations or W4A8.
MoeCase mxfp4_case(bool w4a8, int tokens, int hidden, int inter, int experts, int top_k, int routing, int activation, bool interleaved,
                   bool bias, bool all_to_one) {
  return MoeCase{.mxfp4 = true,
                 .tokens = tokens,
                 .hidden = hidden,
                 .inter = inter,
                 .experts = experts,
                 .top_k = top_k,
                 .routing = routing,
                 .activation = activation,
                 .interleaved = interleaved,
                 .bias = bias,
                 .all_to_one = all_to_one,
                 .w4a8 = w4a8};
}

// The grouped GEMMs with MXFP4 weights (from KILN_MOE_GEMM_MXFP4_MIN_PAIRS routed pairs on sm_90a):
// standard and prepared weights, both layouts, both activations, biases, a last column block only
// half live (H = 192, and GPT-OSS's H = 2880, 45 K steps of up), and every token on one expert. Elsewhere (no wgmma) the same cases run on
// the streaming phases.
TEST_F(Gpu, MoeMxfp4GroupedGemmMatchesFloat64) {
  const std::vector<MoeCase> cases = {
      mxfp4_case(false, 1024, 256, 128, 8, 4, 0, 1, true, true, false),
      mxfp4_case(false, 1100, 512, 512, 16, 4, 1, 0, false, false, false),
      mxfp4_case(false, 1024, 192, 320, 4, 2, 2, 1, true, true, true),
      mxfp4_case(false, 1024, 2880, 256, 4, 2, 0, 1, true, true, false),
      mxfp4_case(false, 2000, 256, 192, 32, 4, 1, 1, false, true, false),
  };
  setenv("KILN_POISON_WORKSPACE", "1", 1);
  Registry::global().set_override({kFamilyMoe, kModeApply}, "moe.apply.stream");
  warm_moe_cases(cases);
  for (const auto& c : cases) run_moe_case(rng, c);
  Registry::global().set_override({kFamilyMoe, kModeApply}, "");
  unsetenv("KILN_POISON_WORKSPACE");
}

// W4A8 (activations quantized to MXFP8 in the kernel) against the float64 reference that models
// the same quantization: standard and prepared weights (run_moe prepares them too), T from 1 to
// 1000, biases, all three routings, both activations and gate/up layouts, every token on one
// expert; then the same cases on the portable reference kernel.
TEST_F(Gpu, MoeW4a8MatchesFloat64) {
  const std::vector<MoeCase> cases = {
      mxfp4_case(true, 1, 2880, 256, 8, 4, 0, 1, true, true, false),    mxfp4_case(true, 3, 128, 64, 8, 2, 1, 0, false, false, false),
      mxfp4_case(true, 17, 256, 96, 16, 4, 2, 1, true, true, true),     mxfp4_case(true, 64, 192, 128, 8, 2, 0, 0, false, true, false),
      mxfp4_case(true, 1000, 256, 128, 16, 4, 1, 1, true, true, false),
  };
  // The grouped GEMMs (sm_90a, from KILN_MOE_GEMM_MXFP4_MIN_PAIRS pairs) with x and act quantized
  // before their copies.
  const std::vector<MoeCase> gemm_cases = {mxfp4_case(true, 1000, 256, 128, 16, 4, 1, 1, true, true, false),
                                           mxfp4_case(true, 1024, 192, 320, 4, 2, 2, 1, true, true, true),
                                           mxfp4_case(true, 2000, 256, 192, 32, 4, 0, 0, false, true, false)};
  std::vector<MoeCase> selected = cases;
  selected.insert(selected.end(), gemm_cases.begin(), gemm_cases.end());
  warm_moe_cases(selected);
  for (const auto& c : selected) run_moe_case(rng, c);
  Registry::global().set_override({kFamilyMoe, kModeApply}, "moe.apply.reference");
  std::vector<MoeCase> small;
  std::copy_if(cases.begin(), cases.end(), std::back_inserter(small), [](const MoeCase& c) { return c.tokens <= 64; });
  warm_moe_cases(small);
  for (const auto& c : small) run_moe_case(rng, c);
  Registry::global().set_override({kFamilyMoe, kModeApply}, "");
}

// One MXFP4 weight matrix [rows, cols] of zero codes, every block scaled by `scale`.
struct Mxfp4Matrix {
  size_t rows, cols;
  std::vector<uint8_t> packed, scales;
  Mxfp4Matrix(size_t r, size_t c, uint8_t scale) : rows(r), cols(c), packed(r * c / 2, 0), scales(r * c / 32, scale) {}
  void set(size_t row, size_t col, uint8_t code, uint8_t scale) {
    uint8_t& byte = packed[(row * cols + col) / 2];
    byte = col % 2 ? static_cast<uint8_t>((byte & 0x0F) | (code << 4)) : static_cast<uint8_t>((byte & 0xF0) | code);
    scales[(row * cols + col) / 32] = scale;
  }
};

// One token routed to a single expert with weight 1 through MXFP4 weights that isolate one value
// per output: out = silu(gate) * up through W2, with the gate made 32 by its bias (silu(32) is 32
// exactly in float) and x a single 2^-8 at column `x_col`. With `prepared`, the weights go through
// moe_prepare_weights (on the device) first. Returns out as floats.
std::vector<float> moe_single_path(size_t hidden, size_t inter, const Mxfp4Matrix& w13, const Mxfp4Matrix& w2,
                                   const std::vector<float>& bias13, size_t x_col, std::mt19937& rng, bool prepared) {
  std::vector<uint16_t> x_bits(hidden);
  std::uniform_real_distribution<float> noise(-4.0f, 4.0f);  // beside zero codes: must add nothing
  for (auto& b : x_bits) b = float_to_bf16(noise(rng));
  x_bits[x_col] = float_to_bf16(std::ldexp(1.0f, -8));
  const std::vector<int> ids = {0};
  const std::vector<float> weights = {1.0f};
  auto x = DeviceBuffer::from(x_bits), idb = DeviceBuffer::from(ids), wb = DeviceBuffer::from(weights);
  auto q13 = DeviceBuffer::from(w13.packed), s13 = DeviceBuffer::from(w13.scales), b13 = DeviceBuffer::from(bias13);
  auto q2 = DeviceBuffer::from(w2.packed), s2 = DeviceBuffer::from(w2.scales);
  DeviceBuffer out(hidden * 2 + 16);
  out.fill_bytes(0xFF);
  const auto h64 = static_cast<int64_t>(hidden), i64 = static_cast<int64_t>(inter);
  MoeArgs a;
  a.x = view(x, DType::kBF16, {1, h64});
  a.out = view(out, DType::kBF16, {1, h64});
  a.topk_ids = view(idb, DType::kI32, {1, 1});
  a.topk_weights = view(wb, DType::kF32, {1, 1});
  a.top_k = 1;
  a.w13 = view(q13, DType::kF4E2M1x2, {1, 2 * i64, h64 / 2});
  a.w13_scale = view(s13, DType::kE8M0, {1, 2 * i64, h64 / 32});
  a.w13_bias = view(b13, DType::kF32, {1, 2 * i64});
  a.w2 = view(q2, DType::kF4E2M1x2, {1, h64, i64 / 2});
  a.w2_scale = view(s2, DType::kE8M0, {1, h64, i64 / 32});
  a.activation = MoeActivation::kSiluGlu;
  a.gate_up_layout = GateUpLayout::kConcatenated;
  if (prepared) {
    a.w13 = moe_prepare_weights(a.w13, nullptr);
    a.w2 = moe_prepare_weights(a.w2, nullptr);
  }
  moe_apply(a, nullptr);
  synchronize();
  std::vector<float> got(hidden);
  const auto bits = out.to_host<uint16_t>(hidden);
  for (size_t i = 0; i < hidden; ++i) got[i] = bf16_to_float(bits[i]);
  return got;
}

// The exact value of e2m1 code `code` times e8m0 scale `scale` (NaN for 0xFF).
double mxfp4_value(size_t code, size_t scale) {
  return scale == 0xFF ? NAN
                       : static_cast<double>(e2m1_to_float(static_cast<uint8_t>(code))) * std::ldexp(1.0, static_cast<int>(scale) - 127);
}
constexpr double kBf16Max = 3.3895313892515355e38;

// Output h must be e2m1 code h % 16 times e8m0 scale h / 16, exactly: it has at most two significant
// bits, so it is a bf16 unless it overflows (then +-inf), and NaN for scale 0xFF. Values past the
// bf16 range are left out when `overflow_checked` is false.
void expect_every_mxfp4_value(const std::vector<float>& got, size_t outputs, bool overflow_checked, const char* which) {
  int wrong = 0;
  for (size_t h = 0; h < outputs; ++h) {
    const double exact = mxfp4_value(h % 16, h / 16);
    if (!overflow_checked && !(std::fabs(exact) <= kBf16Max)) continue;
    const float want = std::fabs(exact) > kBf16Max ? std::copysign(INFINITY, exact) : static_cast<float>(exact);
    const bool ok = std::isnan(exact) ? std::isnan(got[h]) : got[h] == want;
    if (!ok && ++wrong <= 8)
      ADD_FAILURE() << which << ": e2m1 code " << h % 16 << " x 2^" << static_cast<int>(h / 16) - 127 << " gave " << got[h] << ", want "
                    << want;
  }
  EXPECT_EQ(wrong, 0) << which << ": " << wrong << " of " << outputs << " values decoded wrongly";
}

TEST_F(Gpu, MoeMxfp4DecodesEveryValueExactly) {
  constexpr uint8_t kOne = 2;  // e2m1 code of 1.0
  const OperatorId moe{kFamilyMoe, kModeApply};
  for (const char* kernel : {"moe.apply.stream", "moe.apply.reference"}) {
    for (bool prepared : {false, true}) {
      Registry::global().set_override(moe, kernel);
      SCOPED_TRACE(std::string(kernel) + (prepared ? ", prepared weights" : ", standard weights"));
      {
        // W13: up row u holds code u % 16 with scale u / 16 at the column where x is 2^-8; act is 2^-3
        // times that value, and W2 is 8 times the identity, so out[h] is up row h's value. Values
        // past the bf16 range (and NaN) are left out here: their inf would reach every output
        // through W2's zeros. The W2 case below covers them.
        const size_t H = 4096, I = 4096, x_col = 37;
        Mxfp4Matrix w13(2 * I, H, 127), w2(H, I, 127);
        for (size_t u = 0; u < 256 * 16; ++u) {
          if (std::fabs(mxfp4_value(u % 16, u / 16)) <= kBf16Max)
            w13.set(I + u, x_col, static_cast<uint8_t>(u % 16), static_cast<uint8_t>(u / 16));
        }
        for (size_t h = 0; h < H; ++h) w2.set(h, h, kOne, 130);
        std::vector<float> bias(2 * I, 0.0f);
        std::fill(bias.begin(), bias.begin() + I, 32.0f);
        expect_every_mxfp4_value(moe_single_path(H, I, w13, w2, bias, x_col, rng, prepared), H, false, "w13");
      }
      {
        // W2: every up row zero but unit 7's, whose bias makes act = 1 there and 0 elsewhere; W2 row
        // h holds code h % 16 with scale h / 16 (0xFF included) in column 7, so out[h] is that value.
        const size_t H = 4096, I = 32, unit = 7;
        Mxfp4Matrix w13(2 * I, H, 127), w2(H, I, 127);
        for (size_t h = 0; h < H; ++h) w2.set(h, unit, static_cast<uint8_t>(h % 16), static_cast<uint8_t>(h / 16));
        std::vector<float> bias(2 * I, 0.0f);
        std::fill(bias.begin(), bias.begin() + I, 32.0f);
        bias[I + unit] = 1.0f / 32.0f;
        expect_every_mxfp4_value(moe_single_path(H, I, w13, w2, bias, 0, rng, prepared), H, true, "w2");
      }
    }
  }
  Registry::global().set_override(moe, "");
}

TEST_F(Gpu, SecondCallHitsTheLoadedKernel) {
  // Same signature twice: the second call must not compile again (it reuses the loaded kernel).
  run_decode(rng, {DType::kBF16, false, 64, 8, 8, 16, 1, {40, 3}, -1, false});
  const auto start = std::chrono::steady_clock::now();
  run_decode(rng, {DType::kBF16, false, 64, 8, 8, 16, 1, {41, 9}, -1, false});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// Runs bench/kiln_first_call in a fresh process against `cache_dir`; returns its JSON report.
nlohmann::json first_call(const std::string& op, const std::string& cache_dir) {
  const std::string out = std::filesystem::path(cache_dir).parent_path().string() + "/first_call.json";
  const std::string cmd = "KILN_CACHE_DIR=" + cache_dir + " " + KILN_TEST_FIRST_CALL + " " + op + " > " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

TEST_F(Gpu, SecondProcessStartsWarmFromTheDiskCache) {
  const std::string base = testing::TempDir() + "/kiln-warm-" + std::to_string(::getpid());
  for (const char* op : {"mha_prefill", "mha_decode_with_kvcache", "moe_apply"}) {
    const std::string dir = base + "/" + op + "/cache";
    std::filesystem::create_directories(std::filesystem::path(dir).parent_path());
    const nlohmann::json cold = first_call(op, dir);
    EXPECT_EQ(cold["compiles"], 1) << cold.dump();
    const nlohmann::json warm = first_call(op, dir);
    EXPECT_EQ(warm["compiles"], 0) << warm.dump();
    EXPECT_EQ(warm["disk_hits"], 1) << warm.dump();
    // The warm first call costs the database hit and a module load on top of the launch.
    const double overhead_ms = warm["first_call_ms"].get<double>() - warm["second_call_ms"].get<double>();
    EXPECT_LT(overhead_ms, 20.0) << warm.dump();
    std::printf("%s cold %.1f ms, warm %.1f ms, in-process %.1f ms\n", op, cold["first_call_ms"].get<double>(),
                warm["first_call_ms"].get<double>(), warm["second_call_ms"].get<double>());
  }
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_F(Gpu, BinaryThatDoesNotLoadIsDroppedAndRebuilt) {
  // Replace the cached sm_90a CUBIN by a valid one for sm_100a (checksum and size made to match):
  // the driver refuses it, kiln drops the row, recompiles, and the call succeeds.
  const std::string base = testing::TempDir() + "/kiln-wrongarch-" + std::to_string(::getpid());
  const std::string dir = base + "/cache";
  std::filesystem::create_directories(base);
  ASSERT_EQ(first_call("mha_decode_with_kvcache", dir)["compiles"], 1);
  const std::string other = base + "/sm100.cubin";
  const std::string cmd =
      std::string("KILN_CACHE_DIR=") + base + "/scratch " + KILN_TEST_CLI + " compile mha_decode_with_kvcache --target sm_100a -o " +
      other + " --sig dtype=bf16,kv_dtype=bf16,head_dim=64,group=8,page_size=16,q_len=1,window=0,sinks=0,softcap=0,lse=0 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string cubin = read_file(other);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/kiln.db").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE kernels SET binary = ?, size = ?, checksum = ?", -1, &st, nullptr), SQLITE_OK);
  sqlite3_bind_blob(st, 1, cubin.data(), static_cast<int>(cubin.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, static_cast<int64_t>(cubin.size()));
  sqlite3_bind_int64(st, 3, static_cast<int64_t>(XXH3_64bits(cubin.data(), cubin.size())));
  ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  sqlite3_close(db);
  const nlohmann::json again = first_call("mha_decode_with_kvcache", dir);
  EXPECT_EQ(again["compiles"], 1) << again.dump();
  EXPECT_EQ(again["bad_entries"], 1) << again.dump();
  EXPECT_EQ(first_call("mha_decode_with_kvcache", dir)["disk_hits"], 1) << "the rebuilt row serves the next process";
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

TEST_F(Gpu, WarmedManifestServesAFreshProcessAndCaptureRecordsItsSignature) {
  const std::string base = testing::TempDir() + "/kiln-warmup-gpu-" + std::to_string(::getpid());
  const std::string dir = base + "/cache";
  std::filesystem::create_directories(base);
  ASSERT_EQ(std::system(
                (std::string("KILN_CACHE_DIR=") + dir + " " + KILN_TEST_CLI + " warmup --manifest gpt-oss-120b > /dev/null 2>&1").c_str()),
            0);
  for (const char* op : {"mha_prefill", "mha_decode_with_kvcache", "moe_apply"}) {
    const std::string captured = base + "/" + op + ".json";
    const std::string cmd =
        "KILN_CAPTURE=" + captured + " KILN_CACHE_DIR=" + dir + " " + KILN_TEST_FIRST_CALL + " " + op + " > " + base + "/out.json";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    std::ifstream in(base + "/out.json");
    const nlohmann::json report = nlohmann::json::parse(in);
    EXPECT_EQ(report["compiles"], 0) << op << ": the warmed cache has its kernel: " << report.dump();
    EXPECT_EQ(report["disk_hits"], 1) << report.dump();
    const Manifest m = load_manifest(captured);
    ASSERT_EQ(m.signatures.size(), 1u);
    const Manifest model = load_manifest("gpt-oss-120b");
    bool in_model = false;
    for (const auto& s : model.signatures) in_model |= (s == m.signatures[0]);
    EXPECT_TRUE(in_model) << m.signatures[0].canonical();
  }
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// Threads launching mixed signatures of all three operators for KILN_STRESS_SECONDS (default 10),
// each result checked against float64. scripts/device-run.sh runs it for two minutes.
TEST_F(Gpu, StressThreadsWithMixedSignatures) {
  const char* env = std::getenv("KILN_STRESS_SECONDS");
  const double seconds = env ? std::atof(env) : 10.0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::atomic<int> launches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      ASSERT_TRUE(use_first_gpu());
      std::mt19937 local(static_cast<uint32_t>(1234 + t));
      while (std::chrono::steady_clock::now() < deadline) {
        switch (local() % 5) {
          case 0:
            run_prefill(local, {DType::kBF16, 64, 8, 2, {0, 17, 40}, {3, 17, 64}, true, static_cast<int>(local() % 2 ? -1 : 8), true, 0});
            break;
          case 1: run_prefill(local, {DType::kF16, 128, 4, 4, {9}, {9}, false, -1, false, 0}); break;
          case 2: run_decode(local, {DType::kBF16, false, 64, 16, 2, 16, 1, {0, 5, 70}, -1, true}); break;
          case 3: run_decode(local, {DType::kBF16, true, 128, 8, 8, 32, 2, {33, 2}, 4, false}); break;
          default:
            run_moe(local, {local() % 2 == 0, 3, 64, 64, 8, 2, static_cast<int>(local() % 3), true, static_cast<int>(local() % 2), true,
                            true, false});
            break;
        }
        ++launches;
      }
    });
  }
  for (auto& th : threads) th.join();
  std::printf("stress: %d checked calls in %.0f s on 8 threads\n", launches.load(), seconds);
  EXPECT_GT(launches.load(), 8);
}

// A split decode launch is meant to run as one wave, all its CTAs resident at once. The e4m3 cache
// at head_dim 64 counts on two 8-warp CTAs per SM, which holds only while NVRTC's build needs at
// most 128 registers a thread: past that, half the grid would wait for a second wave, slower but
// not wrong, so no correctness test would notice. The driver's occupancy of each split kernel, as
// compiled for this GPU with its launch's block and dynamic shared memory, must cover the grid
// (B1 ctx131072, Hkv 8, where the SM count alone limits the ranges).
TEST_F(Gpu, SplitDecodeGridIsOneWave) {
  const Platform platform = detect_devices().devices.at(0);
  struct Config {
    const char* kv_dtype;
    int64_t head_dim, group;
  };
  for (const Config& c : {Config{"bf16", 64, 8}, Config{"bf16", 128, 4}, Config{"bf16", 256, 2}, Config{"e4m3", 64, 8},
                          Config{"e4m3", 128, 4}, Config{"e4m3", 256, 2}}) {
    const Signature sig = decode_signature("bf16", c.kv_dtype, c.head_dim, c.group);
    const auto spec = Registry::global().select(sig, platform);
    KilnDecodeParams p{};
    p.batch = 1;
    p.q_len = 1;
    p.num_heads_kv = 8;
    p.num_heads_q = static_cast<int>(8 * c.group);
    p.head_dim = static_cast<int>(c.head_dim);
    p.page_size = 16;
    p.max_pages_per_seq = 131072 / 16;
    const LaunchShape shape = spec->launch_shape(&p, platform);
    const std::string what = spec->name + " kv " + c.kv_dtype + " head_dim " + std::to_string(c.head_dim);
    ASSERT_GT(shape.grid[0], 1u) << what << ": a split grid";
    const CompiledKernel k = compile_for_target(sig, platform.arch);
    const detail::cuda::LoadedFunction loaded = detail::cuda::load_function(k.binary, k.lowered_name, k.kernel);
    const CUfunction function = loaded.function;
    KILN_CU_CALL(cuFuncSetAttribute, function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                 static_cast<int>(shape.dynamic_shared_bytes));
    int per_sm = 0, registers = 0;
    KILN_CU_CALL(cuOccupancyMaxActiveBlocksPerMultiprocessor, &per_sm, function, static_cast<int>(shape.block[0]),
                 shape.dynamic_shared_bytes);
    KILN_CU_CALL(cuFuncGetAttribute, &registers, CU_FUNC_ATTRIBUTE_NUM_REGS, function);
    detail::cuda::unload(loaded);
    const int64_t ctas = int64_t{shape.grid[0]} * shape.grid[1] * shape.grid[2];
    EXPECT_GE(int64_t{per_sm} * platform.multiprocessor_count, ctas)
        << what << ": " << ctas << " CTAs of " << shape.block[0] << " threads, " << shape.dynamic_shared_bytes
        << " B dynamic shared memory, " << registers << " registers a thread: " << per_sm << " per SM on " << platform.multiprocessor_count
        << " SMs";
    std::printf("%s: %lld CTAs, %d per SM resident (%d registers a thread)\n", what.c_str(), static_cast<long long>(ctas), per_sm,
                registers);
  }
}

// One kernel launched from two threads with different dynamic shared memory: a 3-sequence batch
// of short contexts runs one 8-warp CTA per (sequence, KV head) pair, and a 160-sequence batch
// (320 pairs, more than any GPU's SMs) 4-warp ones, both on the same loaded function of
// attention.decode.mma_split. Its shared-memory limit is one per function, so neither thread may
// lower it under the other.
TEST_F(Gpu, OneKernelLaunchedFromTwoThreadsWithDifferentSharedMemory) {
  const DecodeCase eight_warps{DType::kBF16, false, 64, 16, 2, 16, 1, {300, 5, 70}, -1, true};
  DecodeCase four_warps = eight_warps;
  four_warps.seqlens.assign(160, 40);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      if (!use_first_gpu()) return;
      std::mt19937 local(static_cast<uint32_t>(77 + t));
      try {
        for (int round = 0; round < 8; ++round) run_decode(local, t == 0 ? eight_warps : four_warps, 1000);
      } catch (const std::exception& e) {
        ++failures;
        ADD_FAILURE() << (t == 0 ? "8-warp" : "4-warp") << " thread: " << e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace kiln::test
