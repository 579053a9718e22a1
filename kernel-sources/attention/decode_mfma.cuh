// Paged decode attention on AMD matrix cores (MFMA; gfx90a, gfx942 = CDNA3, gfx950 = CDNA4) for a
// cache of q's 16-bit type or of e4m3 (widened to q's type exactly; k_scale joins the scores'
// scale, v_scale the output's), same semantics as the reference. COMPILE-VERIFIED ONLY: no AMD
// GPU has run it.
//
// A workgroup of 4 wavefronts owns one range of one (sequence, KV head) pair. The query rows that
// share the KV head (q_len x group, at most 16; row r = query j * group + head g) are the columns
// of prefill_mfma's transposed products, columns past the rows being zeros:
//   S^T = K Q^T  (32 keys x 32 rows): lane l holds row l % 32 and 16 of the block's keys;
//   O^T = V^T P^T (D dims x 32 rows).
// Wavefront w walks the 32-key blocks w, w + 4, ... of its range (from the window's start),
// looking each key's page up in the page table; the four softmax states merge in LDS.
// Split (grid.x = S > 1, for a batch whose pairs leave CUs idle): the pair's blocks are cut into S
// ranges of equal blocks, one per workgroup. Each writes its state to the workspace (layout:
// attention/decode_workspace.h) and takes a ticket; the workgroup that draws the pair's last
// ticket merges the S states in range order and writes out. No workgroup waits for another.
// Launch: grid (S, Hkv, batch), block 256.
#pragma once

#include "attention/decode_workspace.h"
#include "attention/merge_states.cuh"
#include "attention/mfma_attention.cuh"
#include "attention/params.h"
#include "common/mfma.cuh"
#include "common/prelude.cuh"

namespace kiln {

#if defined(KILN_AMD)

template <typename T, typename KvT, int kHeadDim, int kQLen, int kGroup>
__global__ void __launch_bounds__(256) decode_mfma(const KilnDecodeParams p) {
  constexpr bool kFp8Cache = __is_same(KvT, e4m3);
  constexpr int kRows = kQLen * kGroup;  // <= 16
  constexpr int kWaves = 4;
  constexpr int kBlock = 32;                  // keys per block
  constexpr int kKSteps = kHeadDim / kMfmaK;  // steps of S^T = K Q^T
  constexpr int kDBlocks = kHeadDim / 32;     // 32-dim row blocks of O^T
  constexpr int kPSteps = kBlock / kMfmaK;    // steps of O^T = V^T P^T per key block
  __shared__ float wave_acc[kWaves][kRows][kHeadDim];
  __shared__ float wave_m[kWaves][kRows], wave_l[kWaves][kRows];

  const int lane = static_cast<int>(threadIdx.x) & 63, wave = static_cast<int>(threadIdx.x) >> 6;
  const int col = lane & 31, h = lane >> 5;
  const int kv_head = blockIdx.y, b = blockIdx.z, split = blockIdx.x, splits = gridDim.x;
  const int len = p.cache_seqlens[b];
  const int window = p.window_left >= 0 ? p.window_left : (1 << 30);

  // Q^T as B operands: lane (col, h) holds row col, dims ks * kMfmaK + h * kMfmaHalfK + i.
  const bool row_valid = col < kRows;
  const int j = col / kGroup, g = col % kGroup;
  const u16* q_row = static_cast<const u16*>(p.q) + (b * kQLen + (row_valid ? j : 0)) * p.q_row_stride +
                     (kv_head * kGroup + (row_valid ? g : 0)) * p.q_head_stride;
  u16 qb[kKSteps][kMfmaHalfK];
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int i = 0; i < kMfmaHalfK; ++i) qb[ks][i] = row_valid ? q_row[ks * kMfmaK + h * kMfmaHalfK + i] : u16(0);
  }

  const int* pages = p.page_table + b * p.page_table_stride;
  // Element offset of `key`'s row for this KV head (the key lies before the sequence's end).
  auto k_row_of = [&](int key) -> long long {
    return pages[key / p.page_size] * p.k_page_stride + (key % p.page_size) * p.k_row_stride + kv_head * p.k_head_stride;
  };
  auto v_row_of = [&](int key) -> long long {
    return pages[key / p.page_size] * p.v_page_stride + (key % p.page_size) * p.v_row_stride + kv_head * p.v_head_stride;
  };
  const float score_scale = kFp8Cache ? p.softmax_scale * p.k_scale : p.softmax_scale;

  mfma_f32x16 o[kDBlocks];
#pragma unroll
  for (int d = 0; d < kDBlocks; ++d) o[d] = mfma_f32x16{};
  float m_run = neg_inf(), l_run = 0.0f;  // log2 domain; l_run sums this lane's keys only
  const float log2e = 1.4426950408889634f;
  const int first = max(0, len - kQLen - window) / kBlock * kBlock;
  // This workgroup's blocks: range `split` of the pair's, cut into `splits` of equal blocks.
  const int blocks = (len - first + kBlock - 1) / kBlock, range_blocks = (blocks + splits - 1) / splits;
  const int begin = first + split * range_blocks * kBlock, end = min(len, begin + range_blocks * kBlock);

  for (int key0 = begin + wave * kBlock; key0 < end; key0 += kWaves * kBlock) {
    // S^T: A = K rows (lane (col, h): key key0 + col, its dims of each step).
    const int a_key = key0 + col;
    const bool a_valid = a_key < len;
    const mfma_f32x16 s = mfma_scores_transposed<T, kKSteps, KvT>(p.k_cache, a_valid ? k_row_of(a_key) : 0, a_valid, h, qb);
    // Register r holds key key0 + 8 (r / 4) + 4 h + r % 4 for this lane's row.
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int key = key0 + 8 * (r / 4) + 4 * h + r % 4, rel = key - (len - kQLen);
      float v = softcap_score(s[r] * score_scale, p.softcap) * log2e;
      if (!row_valid || key >= len || rel > j || rel < j - window) v = neg_inf();
      x[r] = v;
    }
    u16 pt[16];  // P^T in this lane's accumulator order, as 16-bit values
    mfma_softmax_step<T>(x, m_run, l_run, o, pt);

    // O^T += V^T P^T: B item i of step t is pt[r], r = t * kMfmaHalfK + i; A takes V at the same
    // keys, key0 + 8 (r / 4) + 4 h + r % 4 (zeros past the end, where P is 0: no NaN).
#pragma unroll
    for (int t = 0; t < kPSteps; ++t) {
      u16 pb[kMfmaHalfK];
      long long v_rows[kMfmaHalfK];
#pragma unroll
      for (int i = 0; i < kMfmaHalfK; ++i) {
        const int r = t * kMfmaHalfK + i, key = key0 + 8 * (r / 4) + 4 * h + r % 4;
        pb[i] = pt[r];
        v_rows[i] = key < len ? v_row_of(key) : -1;
      }
#pragma unroll
      for (int d = 0; d < kDBlocks; ++d) {
        u16 va[kMfmaHalfK];
#pragma unroll
        for (int i = 0; i < kMfmaHalfK; ++i) va[i] = v_rows[i] >= 0 ? cache_bits<T, KvT>(p.v_cache, v_rows[i] + 32 * d + col) : u16(0);
        o[d] = mfma_32x32<T>(va, pb, o[d]);
      }
    }
  }

  // This wavefront's state per row: m (log2 -> natural), l over both halves, O^T register r of
  // block d = dim 32 d + 8 (r / 4) + 4 h + r % 4.
  const float l = l_run + other_half(l_run);
  if (row_valid) {
#pragma unroll
    for (int d = 0; d < kDBlocks; ++d) {
#pragma unroll
      for (int r = 0; r < 16; ++r) wave_acc[wave][col][32 * d + 8 * (r / 4) + 4 * h + r % 4] = kFp8Cache ? o[d][r] * p.v_scale : o[d][r];
    }
    if (h == 0) {
      wave_m[wave][col] = m_run == neg_inf() ? neg_inf() : m_run / log2e;
      wave_l[wave][col] = l;
    }
  }
  __syncthreads();

  // Merge the wavefronts (thread i: (row, dim) pairs i, i + 256, ...). Unsplit: add the sink,
  // normalize, store.
  if (splits == 1) {
    for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
      const int r = i / kHeadDim, d = i % kHeadDim;
      store_decode_row<T, kQLen, kGroup>(p, b, kv_head, r, d, merge_parts(wave_acc, wave_m, wave_l, kWaves, r, d));
    }
    return;
  }
  // Split: this range's state into its slot, (b Hkv + kv_head) S + split; then the ticket.
  constexpr long long kStateFloats = kiln_decode_state_floats(kRows, kHeadDim);
  const long long pair = static_cast<long long>(b) * p.num_heads_kv + kv_head;
  unsigned char* ws = static_cast<unsigned char*>(p.workspace);
  int* tickets = reinterpret_cast<int*>(ws);
  float* states = reinterpret_cast<float*>(ws + kiln_decode_states_offset(static_cast<long long>(p.batch) * p.num_heads_kv)) +
                  pair * splits * kStateFloats;  // the pair's S states: m[rows], l[rows], acc[rows][D]
  float* mine = states + split * kStateFloats;
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
    const int r = i / kHeadDim, d = i % kHeadDim;
    const MergedState st = merge_parts(wave_acc, wave_m, wave_l, kWaves, r, d);
    if (d == 0) mine[r] = st.m, mine[kRows + r] = st.l;
    mine[2 * kRows + i] = st.acc;
  }
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {  // publish the state (agent scope: other CUs, other XCDs), then count it
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
    last = __atomic_fetch_add(&tickets[pair], 1, __ATOMIC_RELAXED) == splits - 1;
  }
  __syncthreads();
  if (!last) return;
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent");  // the other ranges' states, not stale lines
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
    const int r = i / kHeadDim;
    MergedState st{neg_inf(), 0.0f, 0.0f};
    for (int part = 0; part < splits; ++part) st.m = fmaxf(st.m, states[part * kStateFloats + r]);
    for (int part = 0; part < splits; ++part) {
      const float* state = states + part * kStateFloats;
      const float c = rescale(state[r], st.m);
      st.l += state[kRows + r] * c;
      st.acc += state[2 * kRows + i] * c;
    }
    store_decode_row<T, kQLen, kGroup>(p, b, kv_head, r, i % kHeadDim, st);
  }
}

#endif  // KILN_AMD

}  // namespace kiln
