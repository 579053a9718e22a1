// MoE layer on AMD matrix cores (MFMA; gfx90a, gfx942 = CDNA3, gfx950 = CDNA4) with bf16 or MXFP4
// weights and bf16 activations, or W4A8 (MXFP4 weights, activations quantized to MXFP8 as
// moe/mxfp8_activations.h defines), the reference's semantics. On gfx950 MXFP4 weights run on
// the scaled MXFP4 x MXFP8 MFMAs with no software decode (partial_product_scaled): W4A8 in one,
// bf16 activations split into two MXFP8 terms, exactly but for values below about 2^-15 of their
// 32-block's largest. Elsewhere the weights are decoded to bf16, and W4A8's quantized values go
// through the bf16 MFMAs. COMPILE-VERIFIED ONLY: no AMD GPU has run it, so neither its numerics
// nor its speed are known.
//
// One cooperative launch, a workgroup of 8 wavefronts per CU, five phases between grid-wide
// barriers, in moe_apply_stream's workspace layout (moe/stream_workspace.h):
//   1. route: a thread per token picks its experts (route_token) and counts them per expert;
//   2. group: each workgroup prefixes the counts in LDS, and the (token, slot) pairs are scattered
//      into per-expert lists. Their order inside a list varies from run to run; the results do
//      not, since each pair's column of a product is computed on its own;
//   3. up: a workgroup per item (expert, 16 intermediate units, 32 of the expert's pairs): the 16
//      gate and 16 up rows of w13 times the pairs' x rows, then bias and activation; act in bf16;
//   4. down: a workgroup per item (expert, 32 rows of w2, 32 pairs): y = W2 act + bias, in f32;
//   5. combine: out = the sum over each token's slots of weight x y, in slot order.
// An item's product is the attention kernels' transposed one (common/mfma.cuh): weight rows are
// A's 32 rows, pairs are B's 32 columns. Its K range is dealt over the 8 wavefronts in 64-deep
// chunks (wavefront w takes chunks w, w + 8, ...: together they read 512 consecutive values of
// each row), and the partial products meet in LDS, summed in wavefront order. Within a chunk,
// lane (row, half h) streams the row's 32 values from h * 32 on and feeds them to the MFMAs
// kMfmaHalfK at a time; B takes the same values of the activations, which only reorders the sum
// over K.
// Launch: cooperative, grid = CUs, block 512; the workspace's leading counters (the barrier's
// arrivals, counts and fill) zeroed, the rest written before it is read.
#pragma once

#include "common/mfma.cuh"
#include "moe/moe_common.cuh"
#include "moe/stream_workspace.h"

namespace kiln {

#if defined(KILN_AMD)

enum { kMoeMfmaWaves = 8, kMoeMfmaMaxExperts = 256, kMoeMfmaChunk = 64, kMoeMfmaSpan = 32 };

typedef u32 moe_words4 __attribute__((ext_vector_type(4)));

// This lane's 32 values of a chunk, as 16 packed bf16 pairs (value 2i in the low half of word i).
struct MoeSpan {
  u32 w[kMoeMfmaSpan / 2];
};

// One lane's row of a product: a weight row (bf16 values, or MXFP4's packed e2m1 bytes and the
// row's e8m0 scales) or an activation row (bf16). Null values: a row past the matrix (zeros).
struct MoeRow {
  const void* values;
  const u8* scales;
};

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15u) == 0; }

// 16 bytes at p, which lies in global memory: kiln's pointers are generic, and a generic load is a
// flat_load, which also waits on the LDS counter; this one is a global_load_dwordx4.
__device__ __forceinline__ moe_words4 load_global16(const void* p) {
  return *(const __attribute__((address_space(1))) moe_words4*)(p);  // an address-space cast
}

// Values k .. k + 31 of a bf16 row, zeros past K: four 16-byte loads where the span is whole and
// aligned, element loads otherwise.
__device__ __forceinline__ void load_bf16_span(const void* row, int k, int K, MoeSpan& s) {
  const u16* values = static_cast<const u16*>(row);
  if (values != nullptr && k + kMoeMfmaSpan <= K && aligned16(values + k)) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const moe_words4 x = load_global16(values + k + 8 * q);
#pragma unroll
      for (int i = 0; i < 4; ++i) s.w[4 * q + i] = x[i];
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kMoeMfmaSpan / 2; ++i) {
    const int at = k + 2 * i;
    const u32 lo = values != nullptr && at < K ? values[at] : 0u;
    const u32 hi = values != nullptr && at + 1 < K ? values[at + 1] : 0u;
    s.w[i] = lo | (hi << 16);
  }
}

// An e2m1 value (one nibble) times a scale, as bf16 bits. Exact: the product has at most two
// significant bits, so truncating its f32 bits loses nothing (beyond f32's range it is infinite,
// and a NaN scale gives NaN); products below f32's normal range need the GPU to keep f32
// subnormals.
__device__ __forceinline__ u32 e2m1_scaled_bf16(u32 nibble, float scale) {
  const u32 e = (nibble >> 1) & 3u, m = nibble & 1u;
  const u32 magnitude = e != 0u ? ((e + 126u) << 23) | (m << 22) : m * 0x3F000000u;
  return __float_as_uint(__uint_as_float(magnitude | ((nibble & 8u) << 28)) * scale) >> 16;
}

// Values k .. k + 31 of an MXFP4 row: 16 bytes, one scale. K is a multiple of 32 (moe_apply
// checks), so a span lies wholly inside the row or wholly past it (zeros).
__device__ __forceinline__ void load_mxfp4_span(const MoeRow& row, int k, int K, MoeSpan& s) {
  if (row.values == nullptr || k >= K) {
#pragma unroll
    for (int i = 0; i < kMoeMfmaSpan / 2; ++i) s.w[i] = 0u;
    return;
  }
  const float scale = e8m0_to_float(row.scales[k / 32]);
  const u8* bytes = static_cast<const u8*>(row.values) + k / 2;
  u32 words[4];
  if (aligned16(bytes)) {
    const moe_words4 v = load_global16(bytes);
#pragma unroll
    for (int q = 0; q < 4; ++q) words[q] = v[q];
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      words[q] = u32(bytes[4 * q]) | (u32(bytes[4 * q + 1]) << 8) | (u32(bytes[4 * q + 2]) << 16) | (u32(bytes[4 * q + 3]) << 24);
    }
  }
#pragma unroll
  for (int i = 0; i < kMoeMfmaSpan / 2; ++i) {  // byte i: value 2i in its low nibble, 2i + 1 in its high
    const u32 byte = (words[i / 4] >> (8 * (i % 4))) & 0xFFu;
    s.w[i] = e2m1_scaled_bf16(byte & 0xFu, scale) | (e2m1_scaled_bf16(byte >> 4, scale) << 16);
  }
}

template <int kFormat>
__device__ __forceinline__ void load_weight_span(const MoeRow& row, int k, int K, MoeSpan& s) {
  if (kFormat == kWeightsMxfp4)
    load_mxfp4_span(row, k, K, s);
  else
    load_bf16_span(row.values, k, K, s);
}

// W4A8: a span of 32 activations (one MXFP8 block: spans start at multiples of 32). Value v of
// the span quantized to e4m3 with the block's 2^-s (`down`), as moe/mxfp8_activations.h defines.
__device__ __forceinline__ float mxfp8_span_q(const MoeSpan& s, int v, float down) {
  return kiln_round_to_e4m3(bf16_pair_value(s.w[v / 2], v % 2) * down);
}

#if defined(__gfx950__)
typedef int moe_words8 __attribute__((ext_vector_type(8)));

// gfx950: a span of 32 activations as B operands of the scaled MFMAs (value v in byte v): W4A8's
// MXFP8 codes and e8m0 scale, or for bf16 activations those of both terms of x = 2^s (q + 2^-4 r)
// (kiln_mxfp8_residual: exact but for values below about 2^-15 of the block's largest). Blocks
// whose largest magnitude is below 2^-115, where 2^(s - 4) has no e8m0 code, keep only q.
struct MoeScaledSpan {
  moe_words8 q, r;
  int q_scale, r_scale;
};
template <bool kActMxfp8>
__device__ __forceinline__ MoeScaledSpan encode_scaled_span(const MoeSpan& s) {
  const int e = mxfp8_pairs_exponent(s.w);
  const float down = kiln_pow2(-e);
  const bool residual = !kActMxfp8 && e >= -123;
  MoeScaledSpan out;
  out.q_scale = e + 127;
  out.r_scale = residual ? e + 123 : 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    u32 q = 0, r = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int v = 4 * i + b;
      const float qv = mxfp8_span_q(s, v, down);
      q |= kiln_e4m3_code(qv) << (8 * b);
      if (residual) {
        r |= kiln_e4m3_code(kiln_mxfp8_residual(bf16_pair_value(s.w[v / 2], v % 2), e, qv)) << (8 * b);
      }
    }
    out.q[i] = static_cast<int>(q);
    out.r[i] = static_cast<int>(r);
  }
  return out;
}

// gfx950: an MXFP4 row's values k .. k + 31 as stored (e2m1, the first in the low nibble) in the
// low 16 bytes, and their e8m0 scale; zeros (scale 1) past the row or past K.
__device__ __forceinline__ moe_words8 load_mxfp4_raw(const MoeRow& row, int k, int K, int& scale) {
  moe_words8 v = {};
  scale = 127;
  if (row.values == nullptr || k >= K) return v;
  scale = row.scales[k / 32];
  const u8* bytes = static_cast<const u8*>(row.values) + k / 2;
  if (aligned16(bytes)) {
    const moe_words4 w = load_global16(bytes);
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = static_cast<int>(w[q]);
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[q] = static_cast<int>(u32(bytes[4 * q]) | (u32(bytes[4 * q + 1]) << 8) | (u32(bytes[4 * q + 2]) << 16) |
                              (u32(bytes[4 * q + 3]) << 24));
    }
  }
  return v;
}

// gfx950, MXFP4 weights: the wavefront's chunks on CDNA4's scaled matrix cores, which take the
// e2m1 weights as stored, with their e8m0 scale (v_mfma_scale_f32_32x32x64_f8f6f4; no software
// decode). Lane (row or column, half h) holds values h * 32 .. h * 32 + 31 of the chunk: one MX
// block of A and of B. The activations are e4m3 with their own scale: one MFMA a chunk for W4A8,
// two for bf16 activations (encode_scaled_span). The next chunk's loads go out before the MFMAs.
template <bool kActMxfp8>
__device__ mfma_f32x16 partial_product_scaled(const MoeRow& a, const void* b, int K, int wave, int h) {
  mfma_f32x16 acc = {};
  const int chunks = (K + kMoeMfmaChunk - 1) / kMoeMfmaChunk;
  int a_scale = 127, a_scale_next = 127;
  moe_words8 a_values = {}, a_next = {};
  MoeSpan b_span = {}, b_next = {};
  if (wave < chunks) {
    a_values = load_mxfp4_raw(a, wave * kMoeMfmaChunk + h * kMoeMfmaSpan, K, a_scale);
    load_bf16_span(b, wave * kMoeMfmaChunk + h * kMoeMfmaSpan, K, b_span);
  }
  for (int c = wave; c < chunks; c += kMoeMfmaWaves) {
    const int next = c + kMoeMfmaWaves;
    if (next < chunks) {
      a_next = load_mxfp4_raw(a, next * kMoeMfmaChunk + h * kMoeMfmaSpan, K, a_scale_next);
      load_bf16_span(b, next * kMoeMfmaChunk + h * kMoeMfmaSpan, K, b_next);
    }
    const MoeScaledSpan bs = encode_scaled_span<kActMxfp8>(b_span);
    acc = __builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4(a_values, bs.q, acc, 4 /* A: e2m1 */, 0 /* B: e4m3 */, 0, a_scale, 0, bs.q_scale);
    if (!kActMxfp8) {
      acc = __builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4(a_values, bs.r, acc, 4, 0, 0, a_scale, 0, bs.r_scale);
    }
    a_values = a_next;
    a_scale = a_scale_next;
    b_span = b_next;
  }
  return acc;
}
#endif

// This wavefront's share of an item's product over K: its chunks of the lane's weight row `a`
// and activation row `b`, the next chunk's loads issued before the current one's MFMAs.
// W4A8 quantizes each activation span. On gfx950 MXFP4 weights take the scaled MFMAs.
template <int kFormat, bool kActMxfp8>
__device__ mfma_f32x16 partial_product(const MoeRow& a, const void* b, int K, int wave, int h) {
#if defined(__gfx950__)
  if constexpr (kFormat == kWeightsMxfp4) return partial_product_scaled<kActMxfp8>(a, b, K, wave, h);
#endif
  mfma_f32x16 acc = {};
  const int chunks = (K + kMoeMfmaChunk - 1) / kMoeMfmaChunk;
  MoeSpan a_span = {}, b_span = {}, a_next = {}, b_next = {};
  if (wave < chunks) {
    load_weight_span<kFormat>(a, wave * kMoeMfmaChunk + h * kMoeMfmaSpan, K, a_span);
    load_bf16_span(b, wave * kMoeMfmaChunk + h * kMoeMfmaSpan, K, b_span);
    if (kActMxfp8) quantize_mxfp8_pairs(b_span.w);
  }
  for (int c = wave; c < chunks; c += kMoeMfmaWaves) {
    const int next = c + kMoeMfmaWaves;
    if (next < chunks) {
      load_weight_span<kFormat>(a, next * kMoeMfmaChunk + h * kMoeMfmaSpan, K, a_next);
      load_bf16_span(b, next * kMoeMfmaChunk + h * kMoeMfmaSpan, K, b_next);
      if (kActMxfp8) quantize_mxfp8_pairs(b_next.w);
    }
#pragma unroll
    for (int step = 0; step < kMoeMfmaSpan / kMfmaHalfK; ++step) {
      acc = mfma_32x32_bf16_words(&a_span.w[step * kMfmaHalfK / 2], &b_span.w[step * kMfmaHalfK / 2], acc);
    }
    a_span = a_next;
    b_span = b_next;
  }
  return acc;
}

// Weight row `row` of expert e (valid: inside the matrix).
template <int kFormat>
__device__ __forceinline__ MoeRow weight_row(const void* w, const u8* scales, long long expert_stride, long long row_stride,
                                             long long scale_expert_stride, long long scale_row_stride, int e, int row, bool valid) {
  if (!valid) return MoeRow{nullptr, nullptr};
  const long long at = e * expert_stride + row * row_stride;
  if (kFormat == kWeightsMxfp4) return MoeRow{static_cast<const u8*>(w) + at, scales + e * scale_expert_stride + row * scale_row_stride};
  return MoeRow{static_cast<const u16*>(w) + at, nullptr};
}

// The exclusive sum of v over the lanes below this one, within a wavefront.
__device__ __forceinline__ int wave_exclusive_sum(int v, int lane) {
  int inclusive = v;
#pragma unroll
  for (int d = 1; d < 64; d <<= 1) {
    const int other = __builtin_amdgcn_ds_bpermute((lane - d) << 2, inclusive);
    if (lane >= d) inclusive += other;
  }
  return inclusive - v;
}

// By one wavefront (four experts a lane): pair_start[0..E] and tile_start[0..E], the exclusive
// prefixes over the experts of their routed pairs and 32-pair tiles.
__device__ __forceinline__ void prefix_counts(const int* counts, int E, int lane, int* pair_start, int* tile_start) {
  int c[4], pairs = 0, tiles = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int e = 4 * lane + i;
    c[i] = e < E ? counts[e] : 0;
    pairs += c[i];
    tiles += (c[i] + 31) / 32;
  }
  int pairs_before = wave_exclusive_sum(pairs, lane), tiles_before = wave_exclusive_sum(tiles, lane);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int e = 4 * lane + i;
    if (e < E) pair_start[e] = pairs_before, tile_start[e] = tiles_before;
    pairs_before += c[i];
    tiles_before += (c[i] + 31) / 32;
    if (e + 1 == E) pair_start[E] = pairs_before, tile_start[E] = tiles_before;
  }
}

// A grid-wide barrier over the cooperative launch's workgroups: a monotonic arrival count in the
// workspace (zero at launch); the n-th barrier waits until it reaches n x workgroups. The agent
// fences publish this workgroup's writes before it arrives and, once all have, drop the CU's
// stale L1 lines before anything is read.
__device__ __forceinline__ void grid_barrier(unsigned* arrivals, unsigned& target) {
  target += gridDim.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
    __atomic_fetch_add(arrivals, 1u, __ATOMIC_RELAXED);
    while (__atomic_load_n(arrivals, __ATOMIC_RELAXED) < target) __builtin_amdgcn_s_sleep(1);
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent");
  }
  __syncthreads();
}

// Item `item` of a product phase with `blocks` row blocks per expert: the expert, the row block,
// and the first of the (at most 32) pairs of the expert's list that are its columns. An expert's
// tiles are adjacent items, so neighbouring workgroups read the same weight rows at about the
// same time.
struct MoeItem {
  int expert, block, pair0, columns;
};
__device__ __forceinline__ MoeItem moe_item(const int* tile_start, const int* pair_start, int E, int item, int blocks) {
  MoeItem it;
  it.expert = find_expert(tile_start, E, item, blocks);
  const int tiles = tile_start[it.expert + 1] - tile_start[it.expert];
  const int rem = item - tile_start[it.expert] * blocks;
  it.block = rem / tiles;
  it.pair0 = pair_start[it.expert] + 32 * (rem % tiles);
  it.columns = min(32, pair_start[it.expert + 1] - it.pair0);
  return it;
}

template <int kFormat, int kActivation, int kLayout, int kRouting, bool kLogitsBf16, int kBias13, int kBias2, bool kActMxfp8>
__global__ void __launch_bounds__(512) moe_apply_mfma(const KilnMoeParams p) {
  __shared__ int pair_start[kMoeMfmaMaxExperts + 1], tile_start[kMoeMfmaMaxExperts + 1];
  __shared__ float partial[kMoeMfmaWaves][16][64];  // each wavefront's accumulators, by register and lane

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 63, wave = tid >> 6, col = lane & 31, h = lane >> 5;
  const int T = p.num_tokens, k = p.top_k, E = p.num_experts, H = p.hidden, I = p.intermediate;
  const int threads = static_cast<int>(gridDim.x * blockDim.x), first = static_cast<int>(blockIdx.x * blockDim.x) + tid;
  const KilnMoeStreamWorkspace layout = kiln_moe_stream_workspace(T, k, E, H, I);
  unsigned char* ws = static_cast<unsigned char*>(p.workspace);
  unsigned* arrivals = reinterpret_cast<unsigned*>(ws + layout.gemm_counters);
  int* counts = reinterpret_cast<int*>(ws + layout.counts);
  int* fill = reinterpret_cast<int*>(ws + layout.fill);
  int* ids = reinterpret_cast<int*>(ws + layout.ids);
  float* weights = reinterpret_cast<float*>(ws + layout.weights);
  int* pairs = reinterpret_cast<int*>(ws + layout.pairs);
  u16* act = reinterpret_cast<u16*>(ws + layout.act);  // [T * k, I] bf16
  float* y = reinterpret_cast<float*>(ws + layout.y);  // [T * k, H]
  unsigned barrier_target = 0;

  // 1. Route; ids outside [0, E) become -1 (route_token) and contribute nothing.
  for (int t = first; t < T; t += threads) {
    route_token<kRouting, kLogitsBf16>(p, t, ids + t * k, weights + t * k);
    for (int j = 0; j < k; ++j) {
      const int e = ids[t * k + j];
      if (e >= 0) __atomic_fetch_add(&counts[e], 1, __ATOMIC_RELAXED);
    }
  }
  grid_barrier(arrivals, barrier_target);

  // 2. Group.
  if (wave == 0) prefix_counts(counts, E, lane, pair_start, tile_start);
  __syncthreads();
  for (int q = first; q < T * k; q += threads) {
    const int e = ids[q];
    if (e >= 0) pairs[pair_start[e] + __atomic_fetch_add(&fill[e], 1, __ATOMIC_RELAXED)] = q;
  }
  grid_barrier(arrivals, barrier_target);

  // In the epilogues thread (wave, lane) takes accumulator registers wave and wave + 8 of its own
  // lane, so its column (col, h) and pair q are those it loaded; summed over the wavefronts.
  auto reduced = [&](int r) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kMoeMfmaWaves; ++w) sum += partial[w][r][lane];
    return sum;
  };
  auto keep_partial = [&](const mfma_f32x16& acc) {
#pragma unroll
    for (int r = 0; r < 16; ++r) partial[wave][r][lane] = acc[r];
    __syncthreads();
  };
  const int tiles = tile_start[E];

  // 3. Up: A rows 0-15 are the gate rows of the block's 16 units, rows 16-31 their up rows, so
  // accumulator registers r and r + 8 (r < 8) hold one unit's gate and up.
  const int unit_blocks = (I + 15) / 16;
  for (int item = static_cast<int>(blockIdx.x); item < tiles * unit_blocks; item += static_cast<int>(gridDim.x)) {
    const MoeItem it = moe_item(tile_start, pair_start, E, item, unit_blocks);
    const int q = col < it.columns ? pairs[it.pair0 + col] : -1;
    const int u = 16 * it.block + (col & 15);
    const GateUpRows rows = gate_up_rows<kLayout>(min(u, I - 1), I);
    const MoeRow a = weight_row<kFormat>(p.w13, p.w13_scale, p.w13_expert_stride, p.w13_row_stride, p.w13_scale_expert_stride,
                                         p.w13_scale_row_stride, it.expert, col < 16 ? rows.gate : rows.up, u < I);
    const u16* x_row = q >= 0 ? static_cast<const u16*>(p.x) + (q / k) * p.x_row_stride : nullptr;
    keep_partial(partial_product<kFormat, kActMxfp8>(a, x_row, H, wave, h));
    const int unit = 16 * it.block + 8 * (wave / 4) + 4 * h + wave % 4;
    if (q >= 0 && unit < I) {
      const GateUpRows unit_rows = gate_up_rows<kLayout>(unit, I);
      const long long bias_at = it.expert * p.w13_bias_expert_stride;
      const float gate = reduced(wave) + moe_bias<kBias13>(p.w13_bias, bias_at + unit_rows.gate);
      const float up = reduced(wave + 8) + moe_bias<kBias13>(p.w13_bias, bias_at + unit_rows.up);
      act[static_cast<long long>(q) * I + unit] = from_float<bf16>(glu_activation<kActivation>(gate, up)).bits;
    }
    __syncthreads();
  }
  grid_barrier(arrivals, barrier_target);

  // 4. Down: A rows are 32 rows of w2; accumulator register r holds row 8 (r / 4) + 4 h + r % 4.
  const int row_blocks = (H + 31) / 32;
  for (int item = static_cast<int>(blockIdx.x); item < tiles * row_blocks; item += static_cast<int>(gridDim.x)) {
    const MoeItem it = moe_item(tile_start, pair_start, E, item, row_blocks);
    const int q = col < it.columns ? pairs[it.pair0 + col] : -1;
    const int row = 32 * it.block + col;
    const MoeRow a = weight_row<kFormat>(p.w2, p.w2_scale, p.w2_expert_stride, p.w2_row_stride, p.w2_scale_expert_stride,
                                         p.w2_scale_row_stride, it.expert, row, row < H);
    keep_partial(partial_product<kFormat, kActMxfp8>(a, q >= 0 ? act + static_cast<long long>(q) * I : nullptr, I, wave, h));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wave + 8 * half, out_row = 32 * it.block + 8 * (r / 4) + 4 * h + r % 4;
      if (q >= 0 && out_row < H) {
        y[static_cast<long long>(q) * H + out_row] =
            reduced(r) + moe_bias<kBias2>(p.w2_bias, it.expert * p.w2_bias_expert_stride + out_row);
      }
    }
    __syncthreads();
  }
  grid_barrier(arrivals, barrier_target);

  // 5. Combine.
  u16* out = static_cast<u16*>(p.out);
  for (long long i = first; i < static_cast<long long>(T) * H; i += threads) {
    const int t = static_cast<int>(i / H), column = static_cast<int>(i % H);
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int q = t * k + j;
      if (ids[q] >= 0) sum += weights[q] * y[static_cast<long long>(q) * H + column];
    }
    out[t * p.out_row_stride + column] = from_float<bf16>(sum).bits;
  }
}

#endif  // KILN_AMD

}  // namespace kiln
