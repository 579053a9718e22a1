// For decode kernels that split the KV sequences over CTAs: which piece a CTA computes, the merge
// of per-warp softmax states across the CTA, then across the CTAs of one (sequence, KV head) pair
// through the workspace.
//
// Two grids. Unsplit, grid (1, Hkv, batch): one CTA per pair, which writes out directly. Split,
// grid (G Hkv), one-dimensional, with G > batch: the G ranges are dealt to the sequences by their
// tile counts (the smallest R such that ranges of at most R tiles, at least one per sequence,
// number at most G; ranges left over do nothing), and CTA g Hkv + h computes range g against KV
// head h. So a ragged batch is split where its tiles are, not evenly per sequence. The Hkv CTAs
// of a range, numbered side by side, read the same tokens, whose KV heads sit side by side in the
// cache, at the same time. (Ranges that crossed sequence boundaries, cut per pair and out of step
// across heads, measured slower on an H200. So did a grid (G, Hkv), the ranges of one head
// numbered side by side, with two CTAs per SM: an e4m3 cache at head_dim 64 took 0.058-0.070 ms
// at B1 from process to process, against a steady 0.056 in this order.)
//
// A CTA that holds only part of a pair writes its state to the workspace (layout:
// attention/decode_workspace.h) and takes a ticket; the CTA that draws the pair's last ticket
// merges all its states and writes out. No CTA waits for another, so the grid needs no
// co-residency and no cluster.
#pragma once

#include "attention/decode_workspace.h"
#include "attention/merge_states.cuh"
#include "attention/params.h"
#include "common/atomics.cuh"
#include "common/prelude.cuh"

namespace kiln {

enum : int { kDecodeTile = 16 };  // tokens per tile; a warp computes one tile at a time

// A CTA's piece: tokens [t0, t1) of sequence b against KV head kv_head. Its pair's `parts`
// pieces have workspace slots first_slot + i Hkv for i < parts, this one `slot`; a pair of one
// piece writes out directly. parts == 0: no piece (a range left over).
struct DecodeSegment {
  int b, kv_head, len, t0, t1;
  int slot, first_slot, parts;
};

// The first token of a sequence of `len` whose tiles are computed: the window's first key, rounded
// down to a tile (the masks drop what lies before the window).
template <int kQLen>
__device__ __forceinline__ int decode_first_token(int len, int window) {
  return max(0, len - kQLen - window) & ~(kDecodeTile - 1);
}
template <int kQLen>
__device__ __forceinline__ int decode_tiles(int len, int window) {
  return (len - decode_first_token<kQLen>(len, window) + kDecodeTile - 1) / kDecodeTile;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// This CTA's piece, into `seg` (shared memory), by every thread; ends with a __syncthreads.
template <int kQLen>
__device__ __forceinline__ void decode_find_piece(const KilnDecodeParams& p, DecodeSegment& seg) {
  const int window = p.window_left >= 0 ? p.window_left : (1 << 30);
  if (threadIdx.x == 0 && gridDim.x == 1) {  // unsplit: the whole pair (blockIdx.z, blockIdx.y)
    const int b = blockIdx.z, len = p.cache_seqlens[b];
    seg = DecodeSegment{b, static_cast<int>(blockIdx.y), len, decode_first_token<kQLen>(len, window), len, 0, 0, 1};
  }
  if (threadIdx.x < 32 && gridDim.x > 1) {  // split: warp 0 deals the ranges (decode_merge.cuh's head)
    // Lane l holds the tile counts of sequences l + 32 i, for the rows i < used (-1 past the batch).
    constexpr int kRowsMax = kiln_decode_split_max_batch / 32;
    const int lane = threadIdx.x, ranges = gridDim.x / p.num_heads_kv, used = (p.batch + 31) / 32;
    int tiles[kRowsMax], total = 0, longest = 0;
#pragma unroll
    for (int i = 0; i < kRowsMax; ++i) {
      const int b = lane + 32 * i;
      tiles[i] = i < used && b < p.batch ? decode_tiles<kQLen>(p.cache_seqlens[b], window) : -1;
      total += max(tiles[i], 0);
      longest = max(longest, tiles[i]);
    }
    total = warp_sum_int(total);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) longest = max(longest, __shfl_xor_sync(0xffffffffu, longest, offset));
    auto ranges_of = [](int n, int r) { return n < 0 ? 0 : n <= r ? 1 : (n + r - 1) / r; };  // n tiles, at most r a range
    // The smallest R with sum over sequences of max(1, ceil(tiles / R)) <= G. That sum lies in
    // [U / R, U / R + batch], so R lies in [ceil(U / G), ceil(U / (G - batch))] (G > batch).
    int lo = max(1, (total + ranges - 1) / ranges), hi = max(lo, (total + ranges - p.batch - 1) / (ranges - p.batch));
    // Equal lengths (the usual case) need no search: G / batch ranges each. (The search took up
    // to 4% of B8 ctx32768 on an H200.)
    if (static_cast<long long>(longest) * p.batch == total) lo = hi = max(1, (longest + ranges / p.batch - 1) / (ranges / p.batch));
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      int needed = 0;
#pragma unroll
      for (int i = 0; i < kRowsMax; ++i) {
        if (i < used) needed += ranges_of(tiles[i], mid);
      }
      if (warp_sum_int(needed) <= ranges)
        hi = mid;
      else
        lo = mid + 1;
    }
    // Sequence b's ranges start after those of the sequences before it: a scan per row.
    const int g = blockIdx.x / p.num_heads_kv, h = blockIdx.x % p.num_heads_kv;
    if (lane == 0) seg.parts = 0;  // a range left over, unless a lane claims it
    __syncwarp();
    int carry = 0;
#pragma unroll
    for (int i = 0; i < kRowsMax; ++i) {
      if (i >= used) break;
      const int parts = ranges_of(tiles[i], lo);
      int before = parts;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int other = __shfl_up_sync(0xffffffffu, before, offset);
        if (lane >= offset) before += other;
      }
      const int row_total = __shfl_sync(0xffffffffu, before, 31);
      before += carry - parts;
      if (g >= before && g < before + parts) {
        const int b = lane + 32 * i, len = p.cache_seqlens[b], first = decode_first_token<kQLen>(len, window);
        // Piece j of `parts` covers tiles [j t / parts, (j + 1) t / parts), in 32 bits: with
        // t = q parts + r, j t / parts = j q + j r / parts (j, r < parts).
        const int j = g - before, q = tiles[i] / parts, r = tiles[i] - q * parts;
        seg.b = b;
        seg.kv_head = h;
        seg.len = len;
        seg.t0 = first + kDecodeTile * (j * q + j * r / parts);
        seg.t1 = min(len, first + kDecodeTile * ((j + 1) * q + (j + 1) * r / parts));
        seg.slot = g * p.num_heads_kv + h;
        seg.first_slot = before * p.num_heads_kv + h;
        seg.parts = parts;
      }
      carry += row_total;
    }
  }
  __syncthreads();
}

// Merges the states of the first `warps` warps (warp_acc[w][row][d], warp_m[w][row], warp_l[w][row]; rows
// r = j * kGroup + g) over the warps of the CTA, then over the pieces of the segment's pair, adds
// the sink, and writes out (and lse). Once the warps are merged, warp_acc's memory is scratch for
// 2 * parts * kRows floats (the launch sizes it so).
template <typename T, int kHeadDim, int kQLen, int kGroup, int kMaxWarps>
__device__ void merge_and_store(const KilnDecodeParams& p, float (&warp_acc)[kMaxWarps][kQLen * kGroup][kHeadDim],
                                float (&warp_m)[kMaxWarps][kQLen * kGroup], float (&warp_l)[kMaxWarps][kQLen * kGroup], int warps,
                                const DecodeSegment& seg) {
  constexpr int kRows = kQLen * kGroup;
  constexpr int kStateFloats = static_cast<int>(kiln_decode_state_floats(kRows, kHeadDim));
  __shared__ float cta_m[kRows], cta_l[kRows];
  __shared__ int is_last;
  __syncthreads();

  // Merge the warps of the CTA: thread i owns (row, dim) pairs i, i + blockDim.x, ... A whole
  // pair is written out directly; a piece's state goes to the workspace.
  const int b = seg.b, kv_head = seg.kv_head, parts = seg.parts;
  float* const states = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kiln_decode_states_offset(p.batch * p.num_heads_kv));
  float* const mine = parts > 1 ? states + static_cast<long long>(seg.slot) * kStateFloats : nullptr;
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
    const int r = i / kHeadDim, d = i % kHeadDim;
    const MergedState s = merge_parts(warp_acc, warp_m, warp_l, warps, r, d);
    if (parts == 1) {
      store_decode_row<T, kQLen, kGroup>(p, b, kv_head, r, d, s);
      continue;
    }
    mine[2 * kRows + i] = s.acc;
    if (d == 0) {
      mine[r] = s.m;
      mine[kRows + r] = s.l;
    }
  }
  if (parts == 1) return;

  // The ticket: release this CTA's state, and the last CTA acquires everyone's.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomic_add_global(static_cast<int*>(p.workspace) + b * p.num_heads_kv + kv_head, 1) == parts - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  // Per piece and row, the weight exp(m_piece - m) of its state; per row, the merged m and l.
  // Other CTAs' states are read from L2 (__ldcg): L1 is not coherent.
  float* const part_weight = &warp_acc[0][0][0];  // [parts][kRows]; the warp states are merged
  float* const part_l = part_weight + parts * kRows;
  const float* const first = states + static_cast<long long>(seg.first_slot) * kStateFloats;
  const long long piece_stride = static_cast<long long>(p.num_heads_kv) * kStateFloats;  // slots Hkv apart
  for (int i = threadIdx.x; i < parts * kRows; i += blockDim.x) {
    const float* state = first + (i / kRows) * piece_stride;
    part_weight[i] = __ldcg(state + i % kRows);
    part_l[i] = __ldcg(state + kRows + i % kRows);
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float m = neg_inf(), l = 0.0f;
    for (int s = 0; s < parts; ++s) m = fmaxf(m, part_weight[s * kRows + r]);
    for (int s = 0; s < parts; ++s) {
      const float w = rescale(part_weight[s * kRows + r], m);
      l += part_l[s * kRows + r] * w;
      part_weight[s * kRows + r] = w;
    }
    cta_m[r] = m;
    cta_l[r] = l;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += blockDim.x) {
    const int r = i / kHeadDim, d = i % kHeadDim;
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < parts; ++s) acc += __ldcg(first + s * piece_stride + 2 * kRows + i) * part_weight[s * kRows + r];
    store_decode_row<T, kQLen, kGroup>(p, b, kv_head, r, d, MergedState{cta_m[r], cta_l[r], acc});
  }
}

}  // namespace kiln
