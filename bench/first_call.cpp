// kiln_first_call OP: the latency of an operator's first call in this process, and of its second.
// Shapes and signatures are GPT-OSS-120B's (they are in cache/manifests/gpt-oss-120b.json), so
// a cache warmed with `kiln warmup --manifest gpt-oss-120b` serves them.
// Run it with an empty KILN_CACHE_DIR (cold: compile), again with the same directory (warm: a
// database hit), and read the second call as the in-process hit. Prints one JSON object.
// The context, buffers and inputs are made before the clock starts: an engine has them already.
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/driver.hpp"
#include "kiln/kiln.hpp"

namespace {

using namespace kiln;

// One device arena; every tensor is a slice of it, filled with a small non-zero bf16 pattern.
struct Arena {
  CUdeviceptr base = 0;
  size_t used = 0, size = 0;
  explicit Arena(size_t bytes) : size(bytes) {
    KILN_CU_CALL(cuMemAlloc, &base, bytes);
    KILN_CU_CALL(cuMemsetD16, base, 0x3c00, bytes / 2);  // bf16 0x3c00 = 0.0078125
  }
  void* take(size_t bytes) {
    void* p = reinterpret_cast<void*>(base + used);
    used += (bytes + 255) / 256 * 256;
    if (used > size) throw Error(ErrorCode::kInternal, "arena too small");
    return p;
  }
  TensorView tensor(DType t, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return TensorView::contiguous(take(static_cast<size_t>(n) * dtype_size(t)), t, shape, 0);
  }
  void fill_i32(const TensorView& t, const std::vector<int>& values) {
    KILN_CU_CALL(cuMemcpyHtoD, reinterpret_cast<CUdeviceptr>(t.data), values.data(), values.size() * 4);
  }
};

double time_call(const std::function<void()>& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  KILN_CU_CALL(cuCtxSynchronize);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_first_call mha_prefill|mha_decode_with_kvcache|moe_apply\n");
    return 2;
  }
  const std::string op = argv[1];
  try {
    CUdevice dev;
    CUcontext ctx;
    KILN_CU_CALL(cuInit, 0);
    KILN_CU_CALL(cuDeviceGet, &dev, 0);
    KILN_CU_CALL(cuDevicePrimaryCtxRetain, &ctx, dev);
    KILN_CU_CALL(cuCtxSetCurrent, ctx);
    Arena arena(size_t{3} << 30);
    std::function<void()> call;
    MhaPrefillArgs prefill;
    MhaDecodeArgs decode;
    MoeArgs moe;
    if (op == "mha_prefill") {  // GPT-OSS attention: Hq 64, Hkv 8, D 64, window 128, sinks; 512 tokens
      prefill.q = arena.tensor(DType::kBF16, {512, 64, 64});
      prefill.k = arena.tensor(DType::kBF16, {512, 8, 64});
      prefill.v = arena.tensor(DType::kBF16, {512, 8, 64});
      prefill.out = arena.tensor(DType::kBF16, {512, 64, 64});
      prefill.cu_seqlens_q = arena.tensor(DType::kI32, {2});
      prefill.cu_seqlens_k = arena.tensor(DType::kI32, {2});
      arena.fill_i32(prefill.cu_seqlens_q, {0, 512});
      arena.fill_i32(prefill.cu_seqlens_k, {0, 512});
      prefill.sinks = arena.tensor(DType::kF32, {64});
      KILN_CU_CALL(cuMemsetD32, reinterpret_cast<CUdeviceptr>(prefill.sinks.data), 0, 64);
      prefill.max_seqlen_q = prefill.max_seqlen_k = 512;
      prefill.causal = true;
      prefill.window_left = 128;
      call = [&] { mha_prefill(prefill, nullptr); };
    } else if (op == "mha_decode_with_kvcache") {  // full-attention layer with sinks; 8 sequences of 1024 tokens, page 16
      decode.sinks = arena.tensor(DType::kF32, {64});
      KILN_CU_CALL(cuMemsetD32, reinterpret_cast<CUdeviceptr>(decode.sinks.data), 0, 64);
      decode.q = arena.tensor(DType::kBF16, {8, 64, 64});
      decode.out = arena.tensor(DType::kBF16, {8, 64, 64});
      decode.k_cache = arena.tensor(DType::kBF16, {512, 16, 8, 64});
      decode.v_cache = arena.tensor(DType::kBF16, {512, 16, 8, 64});
      decode.page_table = arena.tensor(DType::kI32, {8, 64});
      decode.cache_seqlens = arena.tensor(DType::kI32, {8});
      std::vector<int> pages(8 * 64);
      for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int>(i);
      arena.fill_i32(decode.page_table, pages);
      arena.fill_i32(decode.cache_seqlens, std::vector<int>(8, 1024));
      call = [&] { mha_decode_with_kvcache(decode, nullptr); };
    } else if (op == "moe_apply") {  // the GPT-OSS-120B MoE layer: 128 MXFP4 experts, top-4, biases; 4 tokens
      const int64_t E = 128, H = 2880, I = 2880;
      moe.x = arena.tensor(DType::kBF16, {4, H});
      moe.out = arena.tensor(DType::kBF16, {4, H});
      moe.router_logits = arena.tensor(DType::kBF16, {4, E});
      moe.top_k = 4;
      moe.w13 = arena.tensor(DType::kF4E2M1x2, {E, 2 * I, H / 2});
      moe.w13_scale = arena.tensor(DType::kE8M0, {E, 2 * I, H / 32});
      moe.w2 = arena.tensor(DType::kF4E2M1x2, {E, H, I / 2});
      moe.w2_scale = arena.tensor(DType::kE8M0, {E, H, I / 32});
      moe.w13_bias = arena.tensor(DType::kBF16, {E, 2 * I});
      moe.w2_bias = arena.tensor(DType::kBF16, {E, H});
      moe.activation = MoeActivation::kSwigluClamped;
      moe.gate_up_layout = GateUpLayout::kInterleaved;
      call = [&] { moe_apply(moe, nullptr); };
    } else {
      std::fprintf(stderr, "kiln_first_call: unknown operator '%s'\n", op.c_str());
      return 2;
    }
    const double first = time_call(call);
    const double second = time_call(call);
    const CacheStats s = cache_stats();
    nlohmann::json j = {{"op", op},
                        {"first_call_ms", first},
                        {"second_call_ms", second},
                        {"compiles", s.compiles},
                        {"disk_hits", s.disk_hits},
                        {"bad_entries", s.bad_entries},
                        {"cache", s.directory},
                        {"persistent", s.persistent}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
