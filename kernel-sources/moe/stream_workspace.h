// Layout of moe_apply_stream's workspace (moe/apply_stream.cuh; AMD's apply_mfma.cuh uses it too), shared
// verbatim by the kernels and their registrations (src/kernels/moe_apply_stream.cpp, moe_apply_mfma.cpp),
// which size the allocation: plain C only.
// Byte offsets, each region aligned to 256 bytes. Where tokens are routed in the grid (not in every
// CTA), gemm_counters, counts and fill must start at zero (kiln clears the bytes before `ids`);
// the kernel writes every other region before reading it. The grid-wide barriers use the driver's
// word for the cooperative launch, which needs no clearing (apply_stream.cuh).
//   gemm_counters  2 x int, the grouped GEMMs' tile counters (up, down); on AMD, moe_apply_mfma's
//             grid barrier counts its arrivals in the first
//   counts    [E] int, tokens routed to each expert
//   fill      [E] int, the scatter's cursor per expert
//   ids       [T * k] int, chosen expert per (token, slot); -1 for an id outside [0, E)
//   weights   [T * k] float, routing weight per (token, slot)
//   pairs     [T * k] int, (token * k + slot) grouped by expert
//   x_reordered  [T, H] bf16, x in the MXFP4 path's k order (written only for MXFP4 weights, and
//             not when every CTA routes locally and keeps its own copy)
//   act       [T * k, I] bf16 (the first half of the region), the activated intermediate vector
//             of each (token, slot); on the grouped-GEMM path in grouped order (row = slot of
//             the pair list), which the down GEMM's TMA copies read as consecutive rows, and
//             with MXFP4 weights each 64-deep slice in those GEMMs' K order
//   y         [T * k, H] float, the expert's output of each (token, slot), bias included (bf16,
//             in the first half of the region, on the grouped-GEMM path; the second half then
//             holds x_grouped [T * k, H] bf16, the x row of each slot, for the up GEMM's copies;
//             with MXFP4 weights in the same K order as act)
#pragma once

#include "common/host_device.h"

// Large batches: calls whose experts average at least 96 routed pairs (T x top_k >= 96 E; from
// T = 3072 in GPT-OSS's layer), the signature's `large_batch`. Their kernel is built with
// KILN_MOE_LARGE_BATCH=1 (src/kernels/moe_apply_stream.cpp), whose MXFP4 tiles hold 144 pairs, so
// that experts of about 128 pairs fit one tile, not two (one nearly empty); the other calls'
// build keeps 128-pair tiles, which decode a whole slice ahead (the 144-pair ones' accumulators
// leave registers for half slices only) and keep the streaming phases' sums in static shared
// memory (bench/RESULTS.md, 2026-11-29 (fourth)).
#define KILN_MOE_LARGE_BATCH_PAIRS 96  // routed pairs an expert averages in a large batch
KILN_HOST_DEVICE inline int kiln_moe_large_batch(long long tokens, long long top_k, long long experts) {
  return tokens * top_k >= KILN_MOE_LARGE_BATCH_PAIRS * experts;
}
// The fewest tokens that make a large batch (top_k >= 1).
KILN_HOST_DEVICE inline long long kiln_moe_large_batch_tokens(long long top_k, long long experts) {
  return (KILN_MOE_LARGE_BATCH_PAIRS * experts + top_k - 1) / top_k;
}
#ifndef KILN_MOE_LARGE_BATCH
#define KILN_MOE_LARGE_BATCH 0
#endif

// The grouped-GEMM phases (moe/apply_stream_gemm_sm90.cuh, sm_90a only): routed pairs per tile
// (with bf16 weights, and with MXFP4 in each build), and the dynamic shared memory whose presence
// at launch selects them (four stages of (128 + 256) x 64 bf16, plus 1 KB to align the swizzle
// atoms). They write act and y as bf16 into their regions.
#define KILN_MOE_GEMM_ROWS 128
KILN_HOST_DEVICE inline constexpr int kiln_moe_mxfp4_rows(int large_batch) { return large_batch ? 144 : KILN_MOE_GEMM_ROWS; }
// The MXFP4 tiles' x and act rows come in TMA boxes of these (whole boxes fill a tile).
KILN_HOST_DEVICE inline constexpr int kiln_moe_mxfp4_box_rows(int large_batch) { return large_batch ? 48 : 64; }
// Warps per CTA: 16 with MXFP4 weights; 12 with bf16, whose grouped GEMMs run two warpgroups of
// m64n256 MMAs (128 accumulators a thread, more than a 512-thread CTA's 128 registers allow) and
// a third that issues the copies.
KILN_HOST_DEVICE inline constexpr int kiln_moe_stream_warps(int mxfp4) { return mxfp4 ? 16 : 12; }
#define KILN_MOE_GEMM_SHARED_BYTES (4 * (128 + 256) * 64 * 2 + 1024)
// With MXFP4 weights (standard or prepared) the grouped GEMMs run in the 16-warp CTA with the
// operands swapped: 192 weight rows a tile, decoded in the math threads' registers into wgmma's A
// operand, against up to 128 or 144 routed pairs' rows. Eight stages, each a slice's 128 or 144 x
// 64 bf16 x or act rows, the 192 weight rows' 32 bytes as stored and 384 scale words (in 2 KB);
// warpgroup 3 copies them. They take over from this many routed pairs (kiln_moe_mxfp4_gemm_pays).
KILN_HOST_DEVICE inline constexpr int kiln_moe_gemm_mxfp4_shared_bytes(int large_batch) {
  return 8 * (kiln_moe_mxfp4_rows(large_batch) * 64 * 2 + 192 * 32 + 2048) + 1024;
}
#define KILN_MOE_GEMM_MXFP4_MIN_PAIRS 2048
// The streaming phases' dynamic shared memory with MXFP4 weights: per warp (16) a ring of stages
// of 32 lanes x 2 x 16 bytes of weight rows plus 32 x 8 bytes of scale words (apply_stream.cuh),
// in the large-batch build then the split-tile sums (16 KB, kept out of its static shared memory
// so that its grouped GEMMs' eight stages of 144 rows fit), and 128 bytes to align the rings:
// 60 KB, or 76 KB, which beside the 30 KB, or 14 KB, of static shared memory fits the 99 KB of
// sm_86, sm_89 and sm_120 (four ring stages would not).
#define KILN_MOE_RING_STAGES 3
#define KILN_MOE_PARTIALS_BYTES (2 * 16 * 32 * 4 * 4)  // the streaming phases' split-tile sums
KILN_HOST_DEVICE inline constexpr int kiln_moe_ring_bytes(int large_batch) {
  return 16 * KILN_MOE_RING_STAGES * (1024 + 256) + (large_batch ? KILN_MOE_PARTIALS_BYTES : 0) + 128;
}
// Up to this many tokens every CTA routes all tokens itself (its shared routing lists hold them).
// With MXFP4 weights it also keeps x, in the MXFP4 k order, in shared memory after the rings: the
// launch adds kiln_moe_local_x_bytes when the GPU has room for them (src/kernels/moe_apply_stream.cpp),
// and the kernel routes locally when it finds them.
#define KILN_MOE_LOCAL_MAX_TOKENS 16
KILN_HOST_DEVICE inline long long kiln_moe_local_x_bytes(long long tokens, long long hidden) {
  return tokens <= KILN_MOE_LOCAL_MAX_TOKENS ? 2 * tokens * hidden : 0;
}
// Whether MXFP4 weights take the grouped GEMMs (given sm_90a and the shapes they need): enough
// routed pairs, and more tokens than local routing handles, whose dynamic shared memory could
// otherwise be the GEMMs' size.
KILN_HOST_DEVICE inline int kiln_moe_mxfp4_gemm_pays(long long tokens, long long top_k) {
  return tokens > KILN_MOE_LOCAL_MAX_TOKENS && tokens * top_k >= KILN_MOE_GEMM_MXFP4_MIN_PAIRS;
}
// Whether every CTA routes all tokens itself: at most KILN_MOE_LOCAL_MAX_TOKENS on the streaming
// phases (not the grouped GEMMs), and with MXFP4 weights a launch whose dynamic shared memory holds
// x after the rings. The kernel decides by it, and so does its registration, which then clears no
// workspace before the launch.
KILN_HOST_DEVICE inline int kiln_moe_routes_locally(long long tokens, long long hidden, int mxfp4, int grouped_gemm, int large_batch,
                                                    long long dynamic_bytes) {
  if (tokens > KILN_MOE_LOCAL_MAX_TOKENS || grouped_gemm) return 0;
  return !mxfp4 || dynamic_bytes >= kiln_moe_ring_bytes(large_batch) + kiln_moe_local_x_bytes(tokens, hidden);
}

struct KilnMoeStreamWorkspace {
  long long gemm_counters, counts, fill, ids, weights, pairs, x_reordered, act, y, total;
  long long x_grouped;  // inside y's region: the half after bf16 y (grouped-GEMM path only)
};

KILN_HOST_DEVICE inline long long kiln_moe_align256(long long bytes) { return (bytes + 255) / 256 * 256; }

KILN_HOST_DEVICE inline KilnMoeStreamWorkspace kiln_moe_stream_workspace(long long tokens, long long top_k, long long experts,
                                                                         long long hidden, long long inter) {
  const long long pairs = tokens * top_k;
  KilnMoeStreamWorkspace w;
  w.gemm_counters = 0;
  w.counts = 256;
  w.fill = w.counts + kiln_moe_align256(4 * experts);
  w.ids = w.fill + kiln_moe_align256(4 * experts);
  w.weights = w.ids + kiln_moe_align256(4 * pairs);
  w.pairs = w.weights + kiln_moe_align256(4 * pairs);
  w.x_reordered = w.pairs + kiln_moe_align256(4 * pairs);
  w.act = w.x_reordered + kiln_moe_align256(2 * tokens * hidden);
  w.y = w.act + kiln_moe_align256(4 * pairs * inter);
  w.total = w.y + kiln_moe_align256(4 * pairs * hidden);
  w.x_grouped = w.y + 2 * pairs * hidden;
  return w;
}
