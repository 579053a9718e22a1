// KV-cache append: each new token's key and value rows into its slot of the paged caches, eight
// elements (one 16-byte read) per thread and step, so the copy runs at the memory's rate. A
// cache of the tokens' own type takes the bytes as they are; an e4m3 cache takes value / scale,
// saturated to +-448 and rounded to nearest even (NaN stays NaN). Portable C++: runs on NVIDIA
// and AMD alike.
// Launch: any 1-D grid of 256-thread blocks (a grid-stride loop over tokens x Hkv x D / 8 chunks).
#pragma once

#include "attention/params.h"
#include "common/prelude.cuh"

namespace kiln {

struct alignas(16) Bytes16 {
  u32 w[4];
};
struct alignas(8) Bytes8 {
  u32 w[2];
};

// OCP E4M3 (bias 7, largest finite 448 = 0x7E, NaN 0x7F) from f32: saturating, round to nearest
// even, in software so it runs on every architecture.
__device__ __forceinline__ u32 e4m3_saturated(float x) {
  const u32 sign = (__float_as_uint(x) >> 24) & 0x80u;
  u32 bits = __float_as_uint(x) & 0x7FFFFFFFu;
  const float a = __uint_as_float(bits);
  if (!(a == a)) return sign | 0x7Fu;
  if (a >= 448.0f) return sign | 0x7Eu;
  if (a < 0.015625f) {
    // Subnormals, multiples of 2^-9 (8 of them make the least normal): adding 2^23 rounds a * 2^9
    // to an integer, to nearest even.
    return sign | static_cast<u32>((a * 512.0f + 8388608.0f) - 8388608.0f);
  }
  bits += 0x7FFFFu + ((bits >> 20) & 1u);  // round away the 20 low mantissa bits, ties to even
  return sign | ((((bits >> 23) - 120u) << 3) | ((bits >> 20) & 7u));
}

// Eight 16-bit values as eight e4m3 bytes.
template <typename T>
__device__ __forceinline__ Bytes8 to_e4m3x8(const Bytes16& in, float inverse_scale) {
  Bytes8 out;
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    u32 packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const u32 word = in.w[2 * w + i / 2];
      T value;
      value.bits = static_cast<u16>(i % 2 == 0 ? word & 0xFFFFu : word >> 16);
      packed |= e4m3_saturated(to_float(value) * inverse_scale) << (8 * i);
    }
    out.w[w] = packed;
  }
  return out;
}

template <typename T, typename Cache>
__device__ __forceinline__ void append_chunk(const void* src, void* dst, float scale) {
  const Bytes16 chunk = *static_cast<const Bytes16*>(src);
  if (sizeof(Cache) == 2) {
    *static_cast<Bytes16*>(dst) = chunk;
  } else {
    *static_cast<Bytes8*>(dst) = to_e4m3x8<T>(chunk, 1.0f / scale);
  }
}

template <typename T, typename Cache>
__global__ void __launch_bounds__(256) kv_append(const KilnKvAppendParams p) {
  const int chunks_per_head = p.head_dim / 8;
  const long long chunks_per_token = static_cast<long long>(p.num_heads_kv) * chunks_per_head;
  const long long total = chunks_per_token * p.tokens;
  const int page_mask = (1 << p.page_shift) - 1;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < total; i += 256LL * gridDim.x) {
    const int token = static_cast<int>(i / chunks_per_token);
    const int within = static_cast<int>(i - token * chunks_per_token);
    const int head = within / chunks_per_head, column = (within - head * chunks_per_head) * 8;
    const long long slot = p.slot_mapping[token * p.slot_stride];
    if (slot < 0) continue;
    const long long page = slot >> p.page_shift, row = slot & page_mask;
    const T* k = static_cast<const T*>(p.k) + token * p.k_row_stride + head * p.k_head_stride + column;
    const T* v = static_cast<const T*>(p.v) + token * p.v_row_stride + head * p.v_head_stride + column;
    Cache* k_cache =
        static_cast<Cache*>(p.k_cache) + page * p.k_cache_page_stride + row * p.k_cache_row_stride + head * p.k_cache_head_stride + column;
    Cache* v_cache =
        static_cast<Cache*>(p.v_cache) + page * p.v_cache_page_stride + row * p.v_cache_row_stride + head * p.v_cache_head_stride + column;
    append_chunk<T, Cache>(k, k_cache, p.k_scale);
    append_chunk<T, Cache>(v, v_cache, p.v_scale);
  }
}

}  // namespace kiln
