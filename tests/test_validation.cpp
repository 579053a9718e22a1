// Every argument rule of the three operators: a valid call passes, and each broken variant fails
// with kiln::Error(kInvalidArgument) whose message names the argument and the expectation.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <vector>

#include "kiln/author.hpp"
#include "kiln/error.hpp"

namespace kiln {
namespace {

// Fake device addresses: validation never dereferences device memory.
void* fake(uintptr_t slot) { return reinterpret_cast<void*>(0x100000000ull + slot * 0x10000000ull); }

TensorView dev(void* p, DType t, std::initializer_list<int64_t> shape) { return TensorView::contiguous(p, t, shape, 0); }

MhaPrefillArgs valid_prefill() {
  MhaPrefillArgs a;
  a.q = dev(fake(1), DType::kBF16, {100, 32, 128});
  a.k = dev(fake(2), DType::kBF16, {120, 8, 128});
  a.v = dev(fake(3), DType::kBF16, {120, 8, 128});
  a.out = dev(fake(4), DType::kBF16, {100, 32, 128});
  a.cu_seqlens_q = dev(fake(5), DType::kI32, {3});
  a.cu_seqlens_k = dev(fake(6), DType::kI32, {3});
  a.max_seqlen_q = 60;
  a.max_seqlen_k = 70;
  return a;
}

MhaDecodeArgs valid_decode() {
  MhaDecodeArgs a;
  a.q = dev(fake(1), DType::kBF16, {8, 32, 128});  // B = 4, q_len = 2
  a.q_len = 2;
  a.k_cache = dev(fake(2), DType::kBF16, {64, 16, 8, 128});
  a.v_cache = dev(fake(3), DType::kBF16, {64, 16, 8, 128});
  a.page_table = dev(fake(4), DType::kI32, {4, 16});
  a.cache_seqlens = dev(fake(5), DType::kI32, {4});
  a.out = dev(fake(6), DType::kBF16, {8, 32, 128});
  return a;
}

MhaExtendArgs valid_extend() {
  MhaExtendArgs a;
  a.q = dev(fake(1), DType::kBF16, {100, 32, 128});  // B = 2
  a.k_cache = dev(fake(2), DType::kBF16, {64, 16, 8, 128});
  a.v_cache = dev(fake(3), DType::kBF16, {64, 16, 8, 128});
  a.page_table = dev(fake(4), DType::kI32, {2, 32});
  a.cache_seqlens = dev(fake(5), DType::kI32, {2});
  a.cu_seqlens_q = dev(fake(7), DType::kI32, {3});
  a.max_seqlen_q = 60;
  a.out = dev(fake(6), DType::kBF16, {100, 32, 128});
  return a;
}

KvAppendArgs valid_append() {
  KvAppendArgs a;
  a.k = dev(fake(1), DType::kBF16, {40, 8, 128});
  a.v = dev(fake(2), DType::kBF16, {40, 8, 128});
  a.slot_mapping = dev(fake(3), DType::kI64, {40});
  a.k_cache = dev(fake(4), DType::kBF16, {64, 16, 8, 128});
  a.v_cache = dev(fake(5), DType::kBF16, {64, 16, 8, 128});
  return a;
}

MoeArgs valid_moe() {
  MoeArgs a;
  a.x = dev(fake(1), DType::kBF16, {16, 256});
  a.out = dev(fake(2), DType::kBF16, {16, 256});
  a.router_logits = dev(fake(3), DType::kF32, {16, 8});
  a.top_k = 2;
  a.w13 = dev(fake(4), DType::kBF16, {8, 2 * 128, 256});
  a.w2 = dev(fake(5), DType::kBF16, {8, 256, 128});
  return a;
}

MoeArgs valid_moe_mxfp4() {
  MoeArgs a = valid_moe();
  a.w13 = dev(fake(4), DType::kF4E2M1x2, {8, 256, 128});
  a.w13_scale = dev(fake(6), DType::kE8M0, {8, 256, 8});
  a.w2 = dev(fake(5), DType::kF4E2M1x2, {8, 256, 64});
  a.w2_scale = dev(fake(7), DType::kE8M0, {8, 256, 4});
  return a;
}

template <typename Args>
struct Case {
  const char* name;
  std::function<void(Args&)> breaks;
  const char* expect;  // substring of the message
};

template <typename Args>
void run_cases(Args (*valid)(), const std::vector<Case<Args>>& cases) {
  EXPECT_NO_THROW(validate(valid()));
  for (const auto& c : cases) {
    Args a = valid();
    c.breaks(a);
    try {
      validate(a);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << c.name;
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << c.name << ": " << e.what();
    }
  }
}

TEST(Validation, Prefill) {
  static int host_cu_bad_order[] = {0, 70, 60};
  static int host_cu_bad_total[] = {0, 40, 99};
  static int host_cu_too_long[] = {0, 80, 100};
  run_cases<MhaPrefillArgs>(
      &valid_prefill,
      {
          {.name = "q missing", .breaks = [](auto& a) { a.q = {}; }, .expect = "q: required tensor is missing"},
          {.name = "q rank",
           .breaks =
               [](auto& a) {
                 a.q = dev(fake(1), DType::kBF16, {100, 4096});
               },
           .expect = "q: expected rank 3, got 2"},
          {.name = "q dtype", .breaks = [](auto& a) { a.q.dtype = DType::kF32; }, .expect = "q: expected dtype bf16 or f16, got f32"},
          {.name = "out aliases q", .breaks = [](auto& a) { a.out.data = a.q.data; }, .expect = "out: overlaps q in memory"},
          {.name = "out overlaps the end of v",
           .breaks = [](auto& a) { a.out.data = static_cast<char*>(a.v.data) + 16; },
           .expect = "out: overlaps v in memory"},
          {.name = "stride-0 dimension of absurd size",
           .breaks =
               [](auto& a) {
                 a.q.shape[0] = int64_t{1} << 62;
                 a.q.strides[0] = 0;
               },
           .expect = "q: element count overflows 64-bit"},
          {.name = "k dtype mismatch",
           .breaks =
               [](auto& a) {
                 a.k.dtype = DType::kF16;
                 a.v.dtype = DType::kF16;
               },
           .expect = "k: dtype f16 must match q's dtype bf16"},
          {.name = "out dtype mismatch",
           .breaks = [](auto& a) { a.out.dtype = DType::kF16; },
           .expect = "out: dtype f16 must match q's dtype bf16"},
          {.name = "null data", .breaks = [](auto& a) { a.k.data = nullptr; }, .expect = "k: data pointer is null"},
          {.name = "misaligned", .breaks = [](auto& a) { a.v.data = static_cast<char*>(a.v.data) + 2; }, .expect = "v: data pointer"},
          {.name = "outer stride misaligned",
           .breaks = [](auto& a) { a.q.strides[0] = 32 * 128 + 1; },
           .expect = "q: stride of dimension 0"},
          {.name = "last dim strided", .breaks = [](auto& a) { a.q.strides[2] = 2; }, .expect = "q: last dimension must be contiguous"},
          {.name = "negative size", .breaks = [](auto& a) { a.k.shape[0] = -1; }, .expect = "k: dimension 0 has negative size"},
          {.name = "head_dim mismatch",
           .breaks =
               [](auto& a) {
                 a.k = dev(fake(2), DType::kBF16, {120, 8, 64});
               },
           .expect = "k: dimension 2 must be q's head_dim = 128"},
          {.name = "v rows",
           .breaks =
               [](auto& a) {
                 a.v = dev(fake(3), DType::kBF16, {121, 8, 128});
               },
           .expect = "v: dimension 0 must be k's total_k = 120"},
          {.name = "gqa ratio",
           .breaks =
               [](auto& a) {
                 a.k = dev(fake(2), DType::kBF16, {120, 5, 128});
                 a.v = dev(fake(3), DType::kBF16, {120, 5, 128});
               },
           .expect = "Hq = 32 must be a multiple of Hkv = 5"},
          {.name = "head_dim multiple of 8",
           .breaks =
               [](auto& a) {
                 for (auto* t : {&a.q, &a.k, &a.v, &a.out}) t->shape[2] = 100;
               },
           .expect = "head_dim (dimension 2) must be a positive multiple of 8"},
          {.name = "out shape",
           .breaks =
               [](auto& a) {
                 a.out = dev(fake(4), DType::kBF16, {100, 16, 128});
               },
           .expect = "out: dimension 1 must be q's size = 32"},
          {.name = "cu length",
           .breaks = [](auto& a) { a.cu_seqlens_k = dev(fake(6), DType::kI32, {4}); },
           .expect = "cu_seqlens_k: dimension 0 must be cu_seqlens_q's length"},
          {.name = "cu too short",
           .breaks = [](auto& a) { a.cu_seqlens_q = dev(fake(5), DType::kI32, {1}); },
           .expect = "cu_seqlens_q: needs batch + 1 >= 2 entries"},
          {.name = "cu dtype",
           .breaks = [](auto& a) { a.cu_seqlens_q.dtype = DType::kI64; },
           .expect = "cu_seqlens_q: expected dtype i32, got i64"},
          {.name = "max_seqlen_q",
           .breaks = [](auto& a) { a.max_seqlen_q = 101; },
           .expect = "max_seqlen_q: must be in [0, total_q = 100]"},
          {.name = "max_seqlen_k", .breaks = [](auto& a) { a.max_seqlen_k = -1; }, .expect = "max_seqlen_k: must be in [0, total_k = 120]"},
          {.name = "host cu order",
           .breaks = [](auto& a) { a.cu_seqlens_k = TensorView::contiguous(host_cu_bad_order, DType::kI32, {3}, kHostDevice); },
           .expect = "cu_seqlens_k must be non-decreasing"},
          {.name = "host cu total",
           .breaks = [](auto& a) { a.cu_seqlens_q = TensorView::contiguous(host_cu_bad_total, DType::kI32, {3}, kHostDevice); },
           .expect = "cu_seqlens_q[2] must equal the total row count 100"},
          {.name = "host cu max",
           .breaks = [](auto& a) { a.cu_seqlens_q = TensorView::contiguous(host_cu_too_long, DType::kI32, {3}, kHostDevice); },
           .expect = "has length 80 > max_seqlen_q = 60"},
          {.name = "lse shape",
           .breaks =
               [](auto& a) {
                 a.lse = dev(fake(7), DType::kF32, {100, 8});
               },
           .expect = "lse: dimension 1 must be Hq = 32"},
          {.name = "lse dtype",
           .breaks =
               [](auto& a) {
                 a.lse = dev(fake(7), DType::kBF16, {100, 32});
               },
           .expect = "lse: expected dtype f32"},
          {.name = "sinks shape",
           .breaks = [](auto& a) { a.sinks = dev(fake(8), DType::kF32, {8}); },
           .expect = "sinks: dimension 0 must be Hq = 32"},
          {.name = "window", .breaks = [](auto& a) { a.window_left = -2; }, .expect = "window_left: must be -1 (none) or >= 0"},
          {.name = "softcap", .breaks = [](auto& a) { a.softcap = -1.0f; }, .expect = "softcap: must be >= 0"},
          {.name = "scale",
           .breaks = [](auto& a) { a.softmax_scale = std::numeric_limits<float>::infinity(); },
           .expect = "softmax_scale: must be finite"},
          {.name = "q on host", .breaks = [](auto& a) { a.q.device = kHostDevice; }, .expect = "q: must be in device memory"},
          {.name = "k on other device", .breaks = [](auto& a) { a.k.device = 1; }, .expect = "k: on device 1, but q is on device 0"},
          {.name = "32-bit overflow",
           .breaks =
               [](auto& a) {
                 a.k = dev(fake(2), DType::kBF16, {3000000, 8, 128});
                 a.v = dev(fake(3), DType::kBF16, {3000000, 8, 128});
               },
           .expect = "exceeds 32-bit indexing"},
      });
}

TEST(Validation, PrefillAcceptsHostCuSeqlensAndOptionalTensors) {
  static int cu_q[] = {0, 40, 100};
  static int cu_k[] = {0, 50, 120};
  MhaPrefillArgs a = valid_prefill();
  a.cu_seqlens_q = TensorView::contiguous(cu_q, DType::kI32, {3}, kHostDevice);
  a.cu_seqlens_k = TensorView::contiguous(cu_k, DType::kI32, {3}, kHostDevice);
  a.lse = dev(fake(7), DType::kF32, {100, 32});
  a.sinks = dev(fake(8), DType::kF32, {32});
  a.window_left = 0;
  a.softcap = 30.0f;
  EXPECT_NO_THROW(validate(a));
  EXPECT_EQ(signature_of(a).canonical(),
            "attention.prefill:causal=0,dtype=bf16,group=4,head_dim=128,lse=1,short_window=1,sinks=1,softcap=1,window=1");
  // Only windows of at most 128 keys back carry short_window (attention/window_strip.h).
  a.window_left = 128;
  EXPECT_TRUE(signature_of(a).has("short_window"));
  a.window_left = 129;
  EXPECT_FALSE(signature_of(a).has("short_window"));
  a.window_left = -1;
  EXPECT_FALSE(signature_of(a).has("short_window"));
}

TEST(Validation, Decode) {
  static int lens_too_long[] = {10, 300, 5, 5};
  static int lens_short[] = {10, 1, 5, 5};
  static int pages_bad[64] = {0};
  run_cases<MhaDecodeArgs>(
      &valid_decode,
      {
          {.name = "q_len range", .breaks = [](auto& a) { a.q_len = 17; }, .expect = "q_len: must be 1..16"},
          {.name = "out in the cache", .breaks = [](auto& a) { a.out.data = a.k_cache.data; }, .expect = "out: overlaps k_cache in memory"},
          {.name = "q rows", .breaks = [](auto& a) { a.q_len = 3; }, .expect = "q: dimension 0 (8) must be batch * q_len"},
          {.name = "cache rank",
           .breaks =
               [](auto& a) {
                 a.k_cache = dev(fake(2), DType::kBF16, {64, 16, 1024});
               },
           .expect = "k_cache: expected rank 4"},
          {.name = "cache dtype",
           .breaks =
               [](auto& a) {
                 a.k_cache.dtype = DType::kF16;
                 a.v_cache.dtype = DType::kF16;
               },
           .expect = "k_cache: dtype must be q's dtype bf16 or e4m3"},
          {.name = "k/v dtype",
           .breaks = [](auto& a) { a.v_cache.dtype = DType::kF8E4M3; },
           .expect = "v_cache: dtype e4m3 must match k_cache's dtype bf16"},
          {.name = "v shape",
           .breaks =
               [](auto& a) {
                 a.v_cache = dev(fake(3), DType::kBF16, {64, 32, 8, 128});
               },
           .expect = "v_cache: dimension 1 must be k_cache's size = 16"},
          {.name = "head_dim",
           .breaks =
               [](auto& a) {
                 a.k_cache = dev(fake(2), DType::kBF16, {64, 16, 8, 64});
               },
           .expect = "k_cache: dimension 3 must be q's head_dim = 128"},
          {.name = "gqa",
           .breaks =
               [](auto& a) {
                 a.k_cache = dev(fake(2), DType::kBF16, {64, 16, 3, 128});
                 a.v_cache = dev(fake(3), DType::kBF16, {64, 16, 3, 128});
               },
           .expect = "Hq = 32 must be a multiple of Hkv = 3"},
          {.name = "page table batch",
           .breaks =
               [](auto& a) {
                 a.page_table = dev(fake(4), DType::kI32, {5, 16});
               },
           .expect = "page_table: dimension 0 must be batch (q rows / q_len) = 4"},
          {.name = "seqlens batch",
           .breaks = [](auto& a) { a.cache_seqlens = dev(fake(5), DType::kI32, {3}); },
           .expect = "cache_seqlens: dimension 0 must be batch"},
          {.name = "page table dtype",
           .breaks = [](auto& a) { a.page_table.dtype = DType::kI64; },
           .expect = "page_table: expected dtype i32"},
          {.name = "out shape",
           .breaks =
               [](auto& a) {
                 a.out = dev(fake(6), DType::kBF16, {4, 32, 128});
               },
           .expect = "out: dimension 0 must be q's size = 8"},
          {.name = "fp8 scale",
           .breaks =
               [](auto& a) {
                 a.k_cache.dtype = a.v_cache.dtype = DType::kF8E4M3;
                 a.k_scale = 0.0f;
               },
           .expect = "k_scale: must be finite and > 0"},
          {.name = "host seqlens too long",
           .breaks = [](auto& a) { a.cache_seqlens = TensorView::contiguous(lens_too_long, DType::kI32, {4}, kHostDevice); },
           .expect = "cache_seqlens[1] = 300 is outside [0, max_pages_per_seq * page_size = 256]"},
          {.name = "host seqlens < q_len",
           .breaks = [](auto& a) { a.cache_seqlens = TensorView::contiguous(lens_short, DType::kI32, {4}, kHostDevice); },
           .expect = "cache_seqlens[1] = 1 is smaller than q_len = 2"},
          {.name = "host page index",
           .breaks =
               [](auto& a) {
                 pages_bad[3] = 64;
                 a.page_table = TensorView::contiguous(pages_bad, DType::kI32, {4, 16}, kHostDevice);
               },
           .expect = "page_table[0][3] = 64 is outside [0, num_pages = 64)"},
          {.name = "lse",
           .breaks =
               [](auto& a) {
                 a.lse = dev(fake(7), DType::kF32, {4, 32});
               },
           .expect = "lse: dimension 0 must be q rows = 8"},
          {.name = "sinks",
           .breaks = [](auto& a) { a.sinks = dev(fake(8), DType::kF32, {33}); },
           .expect = "sinks: dimension 0 must be Hq = 32"},
          {.name = "window", .breaks = [](auto& a) { a.window_left = -5; }, .expect = "window_left"},
          {.name = "cache misaligned",
           .breaks = [](auto& a) { a.k_cache.data = static_cast<char*>(a.k_cache.data) + 8; },
           .expect = "k_cache: data pointer"},
      });
}

TEST(Validation, Extend) {
  static int cu_host[] = {0, 60, 100};
  static int lens_short[] = {60, 39};
  static int lens_ok[] = {60, 500};
  run_cases<MhaExtendArgs>(
      &valid_extend,
      {
          {.name = "cu missing", .breaks = [](auto& a) { a.cu_seqlens_q = {}; }, .expect = "cu_seqlens_q: required tensor is missing"},
          {.name = "batch",
           .breaks =
               [](auto& a) {
                 a.page_table = dev(fake(4), DType::kI32, {3, 32});
               },
           .expect = "page_table: dimension 0 must be batch (cu_seqlens_q entries - 1) = 2"},
          {.name = "page size",
           .breaks =
               [](auto& a) {
                 a.k_cache = a.v_cache = dev(fake(2), DType::kBF16, {64, 24, 8, 128});
               },
           .expect = "k_cache: page_size (dimension 1) must be a power of two from 1 to 256, got 24"},
          {.name = "page size 512",
           .breaks =
               [](auto& a) {
                 a.k_cache = a.v_cache = dev(fake(2), DType::kBF16, {4, 512, 8, 128});
               },
           .expect = "got 512"},
          {.name = "max_seqlen_q",
           .breaks = [](auto& a) { a.max_seqlen_q = 101; },
           .expect = "max_seqlen_q: must be in [0, total_q = 100]"},
          {.name = "host cu past max",
           .breaks =
               [](auto& a) {
                 a.cu_seqlens_q = TensorView::contiguous(cu_host, DType::kI32, {3}, kHostDevice);
                 a.max_seqlen_q = 50;
               },
           .expect = "cu_seqlens_q: sequence 0 has length 60 > max_seqlen_q = 50"},
          {.name = "new tokens missing from the cache",
           .breaks =
               [](auto& a) {
                 a.cu_seqlens_q = TensorView::contiguous(cu_host, DType::kI32, {3}, kHostDevice);
                 a.cache_seqlens = TensorView::contiguous(lens_short, DType::kI32, {2}, kHostDevice);
               },
           .expect = "cache_seqlens[1] = 39 is smaller than the sequence's q rows = 40"},
          {.name = "fp8 scale",
           .breaks =
               [](auto& a) {
                 a.k_cache.dtype = a.v_cache.dtype = DType::kF8E4M3;
                 a.v_scale = -1.0f;
               },
           .expect = "v_scale: must be finite and > 0"},
          {.name = "out over q", .breaks = [](auto& a) { a.out.data = a.q.data; }, .expect = "out: overlaps q in memory"},
      });
  MhaExtendArgs a = valid_extend();
  a.cu_seqlens_q = TensorView::contiguous(cu_host, DType::kI32, {3}, kHostDevice);
  a.cache_seqlens = TensorView::contiguous(lens_ok, DType::kI32, {2}, kHostDevice);
  EXPECT_NO_THROW(validate(a));
  a.window_left = 200;
  EXPECT_EQ(signature_of(a).canonical(),
            "attention.extend:causal=1,dtype=bf16,group=4,head_dim=128,kv_dtype=bf16,lse=0,page_size=16,sinks=0,softcap=0,window=1");
  // short_window: windows of at most 128 keys back (attention/window_strip.h), whatever the
  // caches' layout.
  a.window_left = 128;
  EXPECT_EQ(signature_of(a).canonical(),
            "attention.extend:causal=1,dtype=bf16,group=4,head_dim=128,kv_dtype=bf16,lse=0,page_size=16,short_window=1,sinks=0,"
            "softcap=0,window=1");
  a.window_left = 129;
  EXPECT_FALSE(signature_of(a).has("short_window"));
  a.window_left = 0;
  EXPECT_TRUE(signature_of(a).has("short_window"));
  MhaExtendArgs heads_first = a;  // [pages, Hkv, page_size, D] seen as [pages, page_size, Hkv, D]
  heads_first.k_cache.strides = heads_first.v_cache.strides = {16 * 8 * 128, 128, 16 * 128, 1};
  EXPECT_TRUE(signature_of(heads_first).has("short_window"));
}

TEST(Validation, KvAppend) {
  run_cases<KvAppendArgs>(
      &valid_append,
      {
          {.name = "slots int32",
           .breaks = [](auto& a) { a.slot_mapping.dtype = DType::kI32; },
           .expect = "slot_mapping: expected dtype i64, got i32"},
          {.name = "slots length",
           .breaks = [](auto& a) { a.slot_mapping = dev(fake(3), DType::kI64, {39}); },
           .expect = "slot_mapping: dimension 0 must be k's tokens (dimension 0) = 40"},
          {.name = "v shape",
           .breaks =
               [](auto& a) {
                 a.v = dev(fake(2), DType::kBF16, {40, 4, 128});
               },
           .expect = "v: dimension 1 must be k's size = 8"},
          {.name = "cache heads",
           .breaks =
               [](auto& a) {
                 a.k_cache = a.v_cache = dev(fake(4), DType::kBF16, {64, 16, 4, 128});
               },
           .expect = "k_cache: dimension 2 must be k's Hkv = 8"},
          {.name = "cache dtype",
           .breaks = [](auto& a) { a.k_cache.dtype = a.v_cache.dtype = DType::kF16; },
           .expect = "k_cache: dtype must be k's dtype bf16 or e4m3, got f16"},
          {.name = "page size",
           .breaks =
               [](auto& a) {
                 a.k_cache = a.v_cache = dev(fake(4), DType::kBF16, {64, 3, 8, 128});
               },
           .expect = "page_size (dimension 1) must be a power of two"},
          {.name = "cache over k", .breaks = [](auto& a) { a.k_cache.data = a.k.data; }, .expect = "k_cache: overlaps k in memory"},
          {.name = "e4m3 scale",
           .breaks =
               [](auto& a) {
                 a.k_cache.dtype = a.v_cache.dtype = DType::kF8E4M3;
                 a.k_scale = std::numeric_limits<float>::infinity();
               },
           .expect = "k_scale: must be finite and > 0"},
          {.name = "host k", .breaks = [](auto& a) { a.k.device = kHostDevice; }, .expect = "k: must be in device memory"},
      });
  KvAppendArgs a = valid_append();
  a.k_cache.dtype = a.v_cache.dtype = DType::kF8E4M3;
  EXPECT_EQ(signature_of(a).canonical(), "attention.kv_append:dtype=bf16,kv_dtype=e4m3");
}

TEST(Validation, DecodeSignature) {
  MhaDecodeArgs a = valid_decode();
  a.k_cache.dtype = a.v_cache.dtype = DType::kF8E4M3;
  a.k_scale = 0.5f;
  a.v_scale = 0.25f;
  EXPECT_NO_THROW(validate(a));
  EXPECT_EQ(signature_of(a).canonical(),
            "attention.decode:dtype=bf16,group=4,head_dim=128,kv_dtype=e4m3,lse=0,page_size=16,q_len=2,sinks=0,softcap=0,window=0");
}

TEST(Validation, Moe) {
  static int ids_bad[32] = {0, 9};
  run_cases<MoeArgs>(
      &valid_moe,
      {
          {.name = "x dtype", .breaks = [](auto& a) { a.x.dtype = DType::kF16; }, .expect = "x: expected dtype bf16"},
          {.name = "in place", .breaks = [](auto& a) { a.out.data = a.x.data; }, .expect = "out: overlaps x in memory"},
          {.name = "out shape",
           .breaks =
               [](auto& a) {
                 a.out = dev(fake(2), DType::kBF16, {16, 128});
               },
           .expect = "out: dimension 1 must be x's hidden size H = 256"},
          {.name = "both routings",
           .breaks =
               [](auto& a) {
                 a.topk_ids = dev(fake(8), DType::kI32, {16, 2});
                 a.topk_weights = dev(fake(9), DType::kF32, {16, 2});
               },
           .expect = "give exactly one way of routing"},
          {.name = "no routing", .breaks = [](auto& a) { a.router_logits = {}; }, .expect = "give exactly one way of routing"},
          {.name = "top_k", .breaks = [](auto& a) { a.top_k = 9; }, .expect = "top_k: must be in [1, E = 8]"},
          {.name = "activation dtype",
           .breaks = [](auto& a) { a.activation_dtype = DType::kF8E5M2; },
           .expect = "activation_dtype: must be bf16 or e4m3 (W4A8), got e5m2"},
          {.name = "W4A8 with bf16 weights",
           .breaks = [](auto& a) { a.activation_dtype = DType::kF8E4M3; },
           .expect = "activation_dtype: e4m3 (W4A8) needs MXFP4 weights (e2m1x2), got w13 in bf16"},
          {.name = "logits experts",
           .breaks =
               [](auto& a) {
                 a.router_logits = dev(fake(3), DType::kF32, {16, 7});
               },
           .expect = "router_logits: dimension 1 must be w13's expert count E = 8"},
          {.name = "logits tokens",
           .breaks =
               [](auto& a) {
                 a.router_logits = dev(fake(3), DType::kF32, {15, 8});
               },
           .expect = "router_logits: dimension 0 must be T = 16"},
          {.name = "w13 odd",
           .breaks =
               [](auto& a) {
                 a.w13 = dev(fake(4), DType::kBF16, {8, 255, 256});
               },
           .expect = "w13: dimension 1 must be 2 * I"},
          {.name = "w13 hidden",
           .breaks =
               [](auto& a) {
                 a.w13 = dev(fake(4), DType::kBF16, {8, 256, 128});
               },
           .expect = "w13: dimension 2 must be x's hidden size H = 256"},
          {.name = "w2 experts",
           .breaks =
               [](auto& a) {
                 a.w2 = dev(fake(5), DType::kBF16, {7, 256, 128});
               },
           .expect = "w2: dimension 0 must be w13's expert count E = 8"},
          {.name = "w2 inter",
           .breaks =
               [](auto& a) {
                 a.w2 = dev(fake(5), DType::kBF16, {8, 256, 64});
               },
           .expect = "w2: dimension 2 must be w13's intermediate size I = 128"},
          {.name = "w2 dtype", .breaks = [](auto& a) { a.w2.dtype = DType::kF4E2M1x2; }, .expect = "w2: expected dtype bf16"},
          {.name = "bias shape",
           .breaks =
               [](auto& a) {
                 a.w13_bias = dev(fake(10), DType::kF32, {8, 128});
               },
           .expect = "w13_bias: dimension 1 must be 2 * I = 256"},
          {.name = "bias dtype",
           .breaks =
               [](auto& a) {
                 a.w2_bias = dev(fake(11), DType::kF16, {8, 256});
               },
           .expect = "w2_bias: expected dtype f32 or bf16"},
          {.name = "scale on bf16",
           .breaks =
               [](auto& a) {
                 a.w13_scale = dev(fake(6), DType::kE8M0, {8, 256, 8});
               },
           .expect = "only MXFP4 (e2m1x2) weights take scales"},
          {.name = "ids shape",
           .breaks =
               [](auto& a) {
                 a.router_logits = {};
                 a.topk_ids = dev(fake(8), DType::kI32, {16, 3});
                 a.topk_weights = dev(fake(9), DType::kF32, {16, 3});
               },
           .expect = "topk_ids: dimension 1 must be top_k = 2"},
          {.name = "weights dtype",
           .breaks =
               [](auto& a) {
                 a.router_logits = {};
                 a.topk_ids = dev(fake(8), DType::kI32, {16, 2});
                 a.topk_weights = dev(fake(9), DType::kBF16, {16, 2});
               },
           .expect = "topk_weights: expected dtype f32"},
          {.name = "host ids range",
           .breaks =
               [](auto& a) {
                 a.router_logits = {};
                 a.topk_ids = TensorView::contiguous(ids_bad, DType::kI32, {16, 2}, kHostDevice);
                 a.topk_weights = dev(fake(9), DType::kF32, {16, 2});
               },
           .expect = "topk_ids[0][1] = 9 is outside [0, E = 8)"},
          {.name = "routing enum", .breaks = [](auto& a) { a.routing = static_cast<MoeRouting>(7); }, .expect = "routing: must be 0"},
          {.name = "activation enum",
           .breaks = [](auto& a) { a.activation = static_cast<MoeActivation>(-1); },
           .expect = "activation: must be 0"},
          {.name = "layout enum",
           .breaks = [](auto& a) { a.gate_up_layout = static_cast<GateUpLayout>(2); },
           .expect = "gate_up_layout: must be 0"},
          {.name = "w13 on host", .breaks = [](auto& a) { a.w13.device = kHostDevice; }, .expect = "w13: must be in device memory"},
      });
}

TEST(Validation, MoeMxfp4) {
  run_cases<MoeArgs>(
      &valid_moe_mxfp4,
      {
          {.name = "scale missing", .breaks = [](auto& a) { a.w13_scale = {}; }, .expect = "w13_scale: required tensor is missing"},
          {.name = "scale blocks",
           .breaks =
               [](auto& a) {
                 a.w13_scale = dev(fake(6), DType::kE8M0, {8, 256, 16});
               },
           .expect = "w13_scale: dimension 2 must be H / 32 = 8"},
          {.name = "w2 scale",
           .breaks =
               [](auto& a) {
                 a.w2_scale = dev(fake(7), DType::kE8M0, {8, 256, 8});
               },
           .expect = "w2_scale: dimension 2 must be I / 32 = 4"},
          {.name = "packed hidden",
           .breaks =
               [](auto& a) {
                 a.w13 = dev(fake(4), DType::kF4E2M1x2, {8, 256, 256});
               },
           .expect = "w13: dimension 2 must be H / 2 (packed e2m1) = 128"},
          {.name = "w2 format",
           .breaks =
               [](auto& a) {
                 a.w2 = dev(fake(5), DType::kBF16, {8, 256, 128});
               },
           .expect = "w2: expected dtype e2m1x2"},
      });
  EXPECT_EQ(signature_of(valid_moe_mxfp4()).get("weights"), "mxfp4");
}

// Prepared MXFP4 (moe_prepare_weights): w13 and w2 both prepared (rows are 16-byte aligned, as
// for every weight format, so the kernels read their 4-byte words whole).
MoeArgs valid_moe_mxfp4_prepared() {
  MoeArgs a = valid_moe_mxfp4();
  a.w13.dtype = a.w2.dtype = DType::kF4E2M1x2Prepared;
  return a;
}

TEST(Validation, MoeMxfp4Prepared) {
  run_cases<MoeArgs>(
      &valid_moe_mxfp4_prepared,
      {
          {.name = "w2 standard",
           .breaks = [](auto& a) { a.w2.dtype = DType::kF4E2M1x2; },
           .expect = "w2: expected dtype e2m1x2_prepared, got e2m1x2"},
          {.name = "scale missing", .breaks = [](auto& a) { a.w2_scale = {}; }, .expect = "w2_scale: required tensor is missing"},
      });
  EXPECT_EQ(signature_of(valid_moe_mxfp4_prepared()).get("weights"), "mxfp4_prepared");
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

void expect_keys_match(const Signature& sig) {
  const SignatureKeys keys = signature_keys(sig.op());
  for (const auto& k : keys.required) EXPECT_TRUE(sig.has(k)) << sig.canonical() << " lacks " << k;
  for (const auto& [k, v] : sig.fields()) {
    const bool known =
        std::count(keys.required.begin(), keys.required.end(), k) + std::count(keys.optional.begin(), keys.optional.end(), k);
    EXPECT_TRUE(known) << sig.canonical() << ": " << k << " is not in signature_keys()";
  }
}

TEST(Validation, SignatureKeysAreWhatSignatureOfProduces) {
  expect_keys_match(signature_of(valid_prefill()));
  expect_keys_match(signature_of(valid_decode()));
  expect_keys_match(signature_of(valid_moe()));
  MoeArgs softmax = valid_moe();
  softmax.routing = MoeRouting::kSoftmaxThenTopk;
  EXPECT_TRUE(signature_of(softmax).has("renormalize"));
  expect_keys_match(signature_of(softmax));
  expect_keys_match(signature_of(valid_moe_mxfp4()));
  expect_keys_match(signature_of(valid_moe_mxfp4_prepared()));
}

// MXFP4 calls whose experts average at least 96 routed pairs carry large_batch=1 (their kernel
// build differs); smaller batches and bf16 weights keep the signatures they had.
TEST(Validation, MoeLargeBatchSignature) {
  MoeArgs a = valid_moe_mxfp4();  // 8 experts, top-2: from 384 tokens
  a.x.shape[0] = 383;
  EXPECT_FALSE(signature_of(a).has("large_batch"));
  a.x.shape[0] = 384;
  EXPECT_EQ(signature_of(a).get("large_batch"), "1");
  expect_keys_match(signature_of(a));
  a.w13.dtype = a.w2.dtype = DType::kF4E2M1x2Prepared;
  EXPECT_EQ(signature_of(a).get("large_batch"), "1");
  MoeArgs bf16 = valid_moe();
  bf16.x.shape[0] = 4096;
  EXPECT_FALSE(signature_of(bf16).has("large_batch"));
}

}  // namespace
}  // namespace kiln
