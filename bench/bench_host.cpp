// Host-side costs of kiln: selection, key hashing, NVRTC compiles (in process and in the worker),
// and, on a GPU, the in-process hit path of an operator call against a raw cuLaunchKernel of the
// same kernel. Run: build/bin/kiln_bench_host [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cuda.h>
#include <unistd.h>

#include <filesystem>

#include "attention/params.h"
#include "backends/cuda/device.hpp"
#include "backends/cuda/driver.hpp"
#include "backends/cuda/nvrtc.hpp"
#include "cache/kernel_cache.hpp"
#include "jit/compiler.hpp"
#include "jit/key.hpp"
#include "jit/pipeline.hpp"
#include "kiln/author.hpp"
#include "kiln/kiln.hpp"

namespace {

using namespace kiln;

Signature decode_signature() {
  Signature s({kFamilyAttention, kModeDecode});
  s.set("dtype", "bf16").set("kv_dtype", "bf16").set("head_dim", int64_t{128}).set("group", int64_t{8});
  s.set("page_size", int64_t{16}).set("q_len", int64_t{1});
  for (const char* f : {"window", "sinks", "softcap", "lse"}) s.set_flag(f, false);
  return s;
}

Signature signature_for(const std::string& kernel) {
  if (kernel.find("decode") != std::string::npos) return decode_signature();
  if (kernel.find("prefill") != std::string::npos) {
    Signature s({kFamilyAttention, kModePrefill});
    s.set("dtype", "bf16").set("head_dim", int64_t{128}).set("group", int64_t{8}).set_flag("causal", true);
    for (const char* f : {"window", "sinks", "softcap", "lse"}) s.set_flag(f, false);
    return s;
  }
  Signature m({kFamilyMoe, kModeApply});
  m.set("dtype", "bf16").set("weights", "mxfp4").set("hidden", int64_t{2880}).set("inter", int64_t{2880});
  m.set("experts", int64_t{128}).set("top_k", int64_t{4}).set("routing", "topk_softmax").set("logits", "bf16");
  m.set("activation", "swiglu_clamped").set("layout", "interleaved").set("w13_bias", "f32").set("w2_bias", "f32");
  return m;
}

void BM_SelectCached(benchmark::State& state) {
  const Signature sig = decode_signature();
  const Platform p = platform_for_target("sm_90a");
  Registry::global().select(sig, p);
  for (auto _ : state) benchmark::DoNotOptimize(Registry::global().select(sig, p));
}
BENCHMARK(BM_SelectCached);

void BM_KeyHash(benchmark::State& state) {
  const Signature sig = decode_signature();
  const Platform p = platform_for_target("sm_90a");
  const auto request = detail::build_request(*Registry::global().select(sig, p), sig, p);
  const std::string& identity = detail::compiler_identity(request.compiler);
  for (auto _ : state) benchmark::DoNotOptimize(detail::compute_key(request, identity));
  state.counters["material_bytes"] = static_cast<double>(detail::key_material(request, identity).size());
}
BENCHMARK(BM_KeyHash);

// One NVRTC compile per iteration, for each reference kernel, to sm_90a.
void BM_Compile(benchmark::State& state, const std::string& kernel, bool worker) {
  const Signature sig = signature_for(kernel);
  const Platform p = platform_for_target("sm_90a");
  const auto request = detail::build_request(*Registry::global().find(kernel), sig, p);
  for (auto _ : state) {
    auto result = worker ? detail::compile_in_worker(request, detail::default_worker_path(), 300) : detail::cuda::nvrtc_compile(request);
    benchmark::DoNotOptimize(result.binary.data());
  }
}
BENCHMARK_CAPTURE(BM_Compile, prefill_inprocess, std::string("attention.prefill.reference"), false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(7);
BENCHMARK_CAPTURE(BM_Compile, prefill_worker, std::string("attention.prefill.reference"), true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(7);
BENCHMARK_CAPTURE(BM_Compile, decode_inprocess, std::string("attention.decode.reference"), false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(7);
BENCHMARK_CAPTURE(BM_Compile, decode_worker, std::string("attention.decode.reference"), true)->Unit(benchmark::kMillisecond)->Iterations(7);
BENCHMARK_CAPTURE(BM_Compile, moe_inprocess, std::string("moe.apply.reference"), false)->Unit(benchmark::kMillisecond)->Iterations(7);
BENCHMARK_CAPTURE(BM_Compile, moe_worker, std::string("moe.apply.reference"), true)->Unit(benchmark::kMillisecond)->Iterations(7);

// A verified database hit: lookup, checksum over a 16 KiB binary, target and compiler checks,
// and the LRU bookkeeping write. Paid once per kernel per process.
void BM_DatabaseHit(benchmark::State& state) {
  const std::string dir = "/tmp/kiln-bench-dbhit-" + std::to_string(::getpid());
  {
    detail::KernelCache cache(dir, {}, 1 << 30, detail::KernelCache::Mode::kServe);
    detail::CacheRow row;
    row.key = {42, 43};
    row.kernel = "k";
    row.op = "mha_prefill";
    row.signature = "s";
    row.target = "sm_90a";
    row.backend = "cuda";
    row.compiler = "c";
    row.entry = "e";
    row.binary.assign(16384, 0x5a);
    cache.publish(row);
    for (auto _ : state) benchmark::DoNotOptimize(cache.lookup(row.key, "sm_90a", "c"));
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_DatabaseHit);

// ---- GPU: the hit path against a raw launch of the same kernel --------------------------------

struct DecodeFixture {
  CUdeviceptr buffer = 0;
  MhaDecodeArgs args;
  KilnDecodeParams params{};
  CUfunction raw = nullptr;
  bool ok = false;

  DecodeFixture() {
    if (detect_devices().devices.empty()) return;
    CUdevice dev;
    CUcontext ctx;
    KILN_CU_CALL(cuDeviceGet, &dev, 0);
    KILN_CU_CALL(cuDevicePrimaryCtxRetain, &ctx, dev);
    KILN_CU_CALL(cuCtxSetCurrent, ctx);
    // One sequence of 16 tokens, 8 query heads on one KV head, D 128: a tiny launch.
    const size_t bytes = 1 << 20;
    KILN_CU_CALL(cuMemAlloc, &buffer, bytes);
    KILN_CU_CALL(cuMemsetD8, buffer, 0x3C, bytes);  // bf16 0x3C3C ~ 0.0115: finite, non-zero
    char* base = reinterpret_cast<char*>(buffer);
    args.q = TensorView::contiguous(base, DType::kBF16, {1, 8, 128});
    args.out = TensorView::contiguous(base + 4096, DType::kBF16, {1, 8, 128});
    args.k_cache = TensorView::contiguous(base + 65536, DType::kBF16, {4, 16, 1, 128});
    args.v_cache = TensorView::contiguous(base + 131072, DType::kBF16, {4, 16, 1, 128});
    KILN_CU_CALL(cuMemsetD32, buffer + 196608, 0, 4);   // page table: pages 0..3 -> 0
    KILN_CU_CALL(cuMemsetD32, buffer + 200704, 16, 1);  // cache_seqlens = 16
    args.page_table = TensorView::contiguous(base + 196608, DType::kI32, {1, 4});
    args.cache_seqlens = TensorView::contiguous(base + 200704, DType::kI32, {1});
    // Both sides run the reference kernel (grid 8 x 1 x 1, one warp per block, no cluster), so the
    // raw launch below can use the same geometry by hand.
    Registry::global().set_override({kFamilyAttention, kModeDecode}, "attention.decode.reference");
    mha_decode_with_kvcache(args, nullptr);  // compile + load
    KILN_CU_CALL(cuCtxSynchronize);
    // The same binary, loaded separately for the raw launch.
    const Signature sig = signature_of(args);
    const Platform& p = detail::cuda::device(0).platform;
    const auto request = detail::build_request(*Registry::global().select(sig, p), sig, p);
    const auto compiled = detail::get_or_compile(request);
    raw = detail::cuda::load_function(compiled->result.binary, compiled->result.lowered_name, "raw").function;
    params.q = args.q.data;
    params.k_cache = args.k_cache.data;
    params.v_cache = args.v_cache.data;
    params.out = args.out.data;
    params.page_table = static_cast<const int*>(args.page_table.data);
    params.cache_seqlens = static_cast<const int*>(args.cache_seqlens.data);
    params.q_row_stride = 8 * 128;
    params.q_head_stride = 128;
    params.k_page_stride = params.v_page_stride = 16 * 128;
    params.k_row_stride = params.v_row_stride = 128;
    params.k_head_stride = params.v_head_stride = 128;
    params.out_row_stride = 8 * 128;
    params.out_head_stride = 128;
    params.page_table_stride = 4;
    params.batch = 1;
    params.q_len = 1;
    params.num_heads_q = 8;
    params.num_heads_kv = 1;
    params.head_dim = 128;
    params.page_size = 16;
    params.max_pages_per_seq = 4;
    params.window_left = -1;
    params.softmax_scale = 0.088388f;
    params.k_scale = params.v_scale = 1.0f;
    ok = true;
  }
};

DecodeFixture& fixture() {
  static DecodeFixture f;
  return f;
}

// Host time per call; the stream is drained every 256 calls, outside the timed region, so the
// launch queue never fills and blocks.
void BM_HitPath(benchmark::State& state) {
  DecodeFixture& f = fixture();
  if (!f.ok) return state.SkipWithError("no GPU");
  int n = 0;
  for (auto _ : state) {
    mha_decode_with_kvcache(f.args, nullptr);
    if (++n % 256 == 0) {
      state.PauseTiming();
      KILN_CU_CALL(cuCtxSynchronize);
      state.ResumeTiming();
    }
  }
  KILN_CU_CALL(cuCtxSynchronize);
}
BENCHMARK(BM_HitPath);

void BM_RawLaunch(benchmark::State& state) {
  DecodeFixture& f = fixture();
  if (!f.ok) return state.SkipWithError("no GPU");
  void* kernel_args[] = {&f.params};
  int n = 0;
  for (auto _ : state) {
    KILN_CU_CALL(cuLaunchKernel, f.raw, 8, 1, 1, 32, 1, 1, 0, nullptr, kernel_args, nullptr);
    if (++n % 256 == 0) {
      state.PauseTiming();
      KILN_CU_CALL(cuCtxSynchronize);
      state.ResumeTiming();
    }
  }
  KILN_CU_CALL(cuCtxSynchronize);
}
BENCHMARK(BM_RawLaunch);

}  // namespace

BENCHMARK_MAIN();
