// Paged decode attention on tensor cores, the KV sequence split over CTAs that merge through the
// workspace.
//
// The query rows that share a KV head (q_len new tokens x the GQA group, at most 64) form the
// M side of mma.sync m16n8k16, 16 rows a warp: per tile of 16 tokens a warp computes S = Q K^T
// (two n-tiles of 8 tokens) and O += P V for its 16 rows, with one online-softmax rescale per
// tile. With more than 16 rows (speculative verification over a GQA group) the CTA's warps take
// the row tiles in turn, warp w rows 16 (w % R) on of R tiles, and the warps of one row tile split
// the tokens; each warp keeps its own copy ring and the registers of 16 rows. Each warp
// double-buffers its K and V tiles in dynamic shared memory with cp.async (zero-filled past the
// end), so the next tile loads while this one computes. K fragments are read 16 bytes at a time:
// within each 32-dimension block lane quad c takes dims 8c..8c+7 of one token, and the same
// permutation of the reduction dimension is applied to Q, so S is unchanged. V is read with
// ldmatrix.trans.
// An fp8 (e4m3) cache is copied as bytes and multiplied in f16 (e4m3 converts to f16 exactly, one
// cvt per pair; a bf16 q is converted to f16 once): K fragments are converted as they are read,
// V tiles into an f16 staging tile for ldmatrix. The per-tensor k_scale joins the softmax scale
// and v_scale scales O.
// Grid (1, Hkv, batch) unsplit or (G Hkv) split, block 32 x warps (warps <= kDecodeMaxWarps),
// dynamic shared memory warps x DecodeTileLayout::kWarpBytes + kDecodeRingAlign; which CTA
// computes which tokens, the merge and the workspace are decode_merge.cuh's.
#pragma once

#include "attention/decode_merge.cuh"
#include "attention/mma_softmax.cuh"
#include "attention/params.h"
#include "common/cp_async.cuh"
#include "common/mma_sm80.cuh"
#include "common/prelude.cuh"
#include "common/vector_memory.cuh"

namespace kiln {

// Warps per CTA, at most: the launch (attention_decode_split.cpp) picks 4 or 8 and the kernel
// reads blockDim. Stages of each warp's copy ring: two. On an H200 a third or fourth stage was
// slower wherever tried (bench/RESULTS.md). Enumerators, not constexpr variables: NVRTC emits a
// namespace-scope constexpr as a global under a per-compile name, so the binary would differ from
// compile to compile.
enum : int { kDecodeMaxWarps = 8, kDecodeStages = 2 };

// The copy rings start on a 128-byte boundary of shared memory. Dynamic shared memory follows the
// kernel's static arrays, 16-byte aligned, so its base moves with their sizes: with the rings 80
// bytes past a 128-byte boundary an H200 ran head_dim 64 at B64 ctx4096 11% slower than at 0, 32,
// 64 or 96 (bench/RESULTS.md). The launch adds kDecodeRingAlign bytes of slack for the shift.
enum : int { kDecodeRingAlign = 128 };

// Shared memory of one warp, in bytes: kDecodeStages stages of [K tile | V tile] (16 rows each,
// padded so the fragment reads and ldmatrix are conflict-free), then for an e4m3 cache the f16 V
// tile ldmatrix reads. attention_decode_split.cpp computes the same sizes.
template <typename Cache, int kHeadDim>
struct DecodeTileLayout {
  static constexpr bool kFp8 = SameType<Cache, e4m3>::value;
  // 16-bit K rows padded by 64 bytes at head_dim 64 and 16 at 128 and 256 (64 would leave room for
  // 2 CTAs per SM instead of 3 at 128, which measured slower); e4m3 rows by 32 bytes.
  static constexpr int kKRowBytes = kFp8 ? kHeadDim + 32 : 2 * (kHeadDim + (kHeadDim == 64 ? 32 : 8));
  static constexpr int kVRowBytes = kFp8 ? kHeadDim + 16 : 2 * (kHeadDim + 8);
  static constexpr int kStageBytes = 16 * (kKRowBytes + kVRowBytes);
  static constexpr int kStagingRowBytes = 2 * (kHeadDim + 8);
  static constexpr int kWarpBytes = kDecodeStages * kStageBytes + (kFp8 ? 16 * kStagingRowBytes : 0);
  static constexpr int kChunksPerRow = kHeadDim * static_cast<int>(sizeof(Cache)) / 16;  // 16-byte copies
};

// At most 168 registers: three 128-thread CTAs fit an SM (the batch-filled launches use them).
// At head_dim 256 a warp holds 64 registers of Q fragments and 128 of O: up to 255, one CTA an SM
// (its shared memory allows no more; attention_decode_mma_split.cpp). At head_dim 64 with an e4m3
// cache at most 128, so that two 8-warp CTAs an SM stay resident (the launch counts on it; 16
// query rows took 131 uncapped).
// kSmallPages: pages of 1 to 8 tokens (a template flag, so the common path keeps its registers).
template <typename Cache, int kHeadDim>
struct DecodeRegisterCap {
  enum { value = kHeadDim == 256 ? 255 : kHeadDim == 64 && SameType<Cache, e4m3>::value ? 128 : 168 };
};
template <typename T, typename Cache, int kHeadDim, int kQLen, int kGroup, bool kSmallPages = false>
__global__ void __maxnreg__((DecodeRegisterCap<Cache, kHeadDim>::value)) decode_mma_split(const KilnDecodeParams p) {
  typedef typename MmaType<T, Cache>::type M;
  typedef DecodeTileLayout<Cache, kHeadDim> Layout;
  constexpr int kRows = kQLen * kGroup;  // <= 64
  constexpr int kRowTiles = (kRows + 15) / 16;
  constexpr int kMaxTokenWarps = kDecodeMaxWarps / kRowTiles;
  static_assert(kRowTiles <= 4, "at most 64 query rows a KV head");
  constexpr int kTile = kDecodeTile;      // tokens per warp iteration
  constexpr int kBlocks = kHeadDim / 32;  // 32-dimension blocks: two k-steps each
  constexpr int kDTiles = kHeadDim / 8;   // n-tiles of O

  // Per warp Layout::kWarpBytes (from a 128-byte boundary); after the token loop the same memory
  // holds the per-warp softmax states for the merge.
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  __shared__ float warp_m[kMaxTokenWarps][kRows], warp_l[kMaxTokenWarps][kRows];
  __shared__ DecodeSegment piece;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;  // mma groupID and thread-in-group
  // This warp's rows start at row0; it computes every token_warps-th tile from its token_warp-th.
  // The launch makes the warp count a multiple of kRowTiles.
  const int row0 = 16 * (warp % kRowTiles), token_warp = warp / kRowTiles, token_warps = (blockDim.x >> 5) / kRowTiles;
  decode_find_piece<kQLen>(p, piece);
  if (piece.parts == 0) return;  // a range left over
  const int kv_head = piece.kv_head, b = piece.b, len = piece.len;

  // A fragments of Q for every k-step, rows g and g + 8 (zeros beyond kRows), in the permuted order.
  unsigned qa[kBlocks][2][4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + g + 8 * half;
    Bf16x8 words[kBlocks];
#pragma unroll
    for (int m = 0; m < kBlocks; ++m) {
      words[m] = Bf16x8{{0u, 0u, 0u, 0u}};
      if (r < kRows) {
        const int j = r / kGroup, h = r % kGroup;
        words[m] = load16(static_cast<const T*>(p.q) + (b * kQLen + j) * p.q_row_stride + (kv_head * kGroup + h) * p.q_head_stride +
                          32 * m + 8 * c);
      }
    }
#pragma unroll
    for (int m = 0; m < kBlocks; ++m) {
      if (!SameType<M, T>::value) {  // bf16 q against an e4m3 cache: multiply in f16
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          words[m].w[w] = pack2<f16>(__uint_as_float(words[m].w[w] << 16), __uint_as_float(words[m].w[w] & 0xffff0000u));
        }
      }
      // k-step 2m uses words 0,1; k-step 2m+1 words 2,3. a[0]/a[2]: row g; a[1]/a[3]: row g + 8.
      qa[m][0][half] = words[m].w[0];
      qa[m][0][2 + half] = words[m].w[1];
      qa[m][1][half] = words[m].w[2];
      qa[m][1][2 + half] = words[m].w[3];
    }
  }

  // Tiles start at multiples of 16 tokens (the masks drop what lies before the window), so with
  // page sizes that are powers of two from 16 up a tile never straddles a page: one page index
  // per tile. Smaller pages (1 to 8 tokens) split a tile: lane l then holds the page of the tile's
  // token l % 16, read an iteration ahead like a tile's page, and each copy takes its row's page
  // from the lane that holds it.
  const int window = p.window_left >= 0 ? p.window_left : (1 << 30);
  const int t0 = piece.t0, t1 = piece.t1;

  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_row[2] = {neg_inf(), neg_inf()}, l_row[2] = {0.0f, 0.0f};  // rows row0 + g, + 8 (log2 domain)
  const float score_scale = p.softmax_scale * p.k_scale;             // k_scale is 1 for a 16-bit cache

  const int* pages = p.page_table + b * p.page_table_stride;
  const int page_shift = __ffs(p.page_size) - 1;

  constexpr int stages = kDecodeStages;
  unsigned char* const ring = align_shared<kDecodeRingAlign>(shared_bytes) + warp * Layout::kWarpBytes;
  unsigned char* const v_staging = ring + stages * Layout::kStageBytes;  // e4m3 cache only
  // Copies the K and V tiles of tokens [tile, tile + 16), which lie in page `page`, into `stage`
  // (zeros past the end: P is 0 there, and 0 * garbage could be NaN), as one commit group; an
  // empty group past the end.
  constexpr bool small_pages = kSmallPages;
  auto issue = [&](int tile, int stage, long long page) {
    if (tile < t1) {
      const int slot = small_pages ? 0 : tile & (p.page_size - 1);
      const Cache* k_rows = static_cast<const Cache*>(p.k_cache) + slot * p.k_row_stride + kv_head * p.k_head_stride;
      const Cache* v_rows = static_cast<const Cache*>(p.v_cache) + slot * p.v_row_stride + kv_head * p.v_head_stride;
      unsigned char* k_tile = ring + stage * Layout::kStageBytes;
      unsigned char* v_tile = k_tile + kTile * Layout::kKRowBytes;
      constexpr int kPerChunk = 16 / static_cast<int>(sizeof(Cache));  // elements per 16-byte copy
#pragma unroll
      for (int i = 0; i < kTile * Layout::kChunksPerRow / 32; ++i) {
        const int idx = i * 32 + lane, tok = idx / Layout::kChunksPerRow, chunk = idx % Layout::kChunksPerRow;
        const bool valid = tile + tok < t1;  // rows past the end are still inside the page
        // The row's page and its row within: the tile's page, or (small pages) lane tok's.
        const long long row_page = small_pages ? __shfl_sync(0xffffffffu, static_cast<int>(page), tok) : page;
        const int row = small_pages ? (tile + tok) & (p.page_size - 1) : tok;
        copy16_async_or_zero_l2_256(k_tile + tok * Layout::kKRowBytes + chunk * 16,
                                    k_rows + row_page * p.k_page_stride + row * p.k_row_stride + chunk * kPerChunk, valid);
        copy16_async_or_zero_l2_256(v_tile + tok * Layout::kVRowBytes + chunk * 16,
                                    v_rows + row_page * p.v_page_stride + row * p.v_row_stride + chunk * kPerChunk, valid);
      }
    }
    commit_copies();
  };
  // A ring of `stages` tiles per warp: while one is computed the next stages - 1 are in flight.
  // (One cp.async.bulk per K/V row with an mbarrier instead of 16-byte cp.async measured slower
  // on an H200: 0.35-0.51 ms against 0.27-0.32 ms at B8 ctx32768.)
  const int stride = token_warps * kTile;  // a warp's consecutive tiles are this far apart
  const int first_tile = t0 + token_warp * kTile;
  // The page of `tile`, the warp's tile number `it` (it counts up by one per call, from 0), read an
  // iteration before its copies are issued. With kPageChunks the page indices come 32 tiles per register
  // (lane l of chunk c holds the page of the warp's tile 32 c + l), the next chunk loaded 32 tiles
  // ahead: one page-table read per tile was 23% of the stall samples of B1 (ncu, H100), and the
  // chunks made B8 ctx32768 page 16 2.5% faster and the e4m3 cache up to 8% (bench/RESULTS.md).
  // With a 16-bit cache at head_dim 64 (168 registers, the cap) they made B1 3-6% slower: there
  // each tile's index is read from the table.
  constexpr bool kPageChunks = Layout::kFp8 || kHeadDim >= 128;
  auto load_page_chunk = [&](int chunk) -> int {
    const int tile = first_tile + (32 * chunk + lane) * stride;
    return kPageChunks && tile < t1 ? pages[tile >> page_shift] : 0;
  };
  int page_chunk = load_page_chunk(0), next_page_chunk = load_page_chunk(1);
  auto page_of = [&](int it, int tile) -> long long {
    if (small_pages) return tile + (lane & 15) < t1 ? pages[(tile + (lane & 15)) >> page_shift] : 0;
    if (!kPageChunks) return tile < t1 ? pages[tile >> page_shift] : 0;
    if (it > 0 && (it & 31) == 0) {
      page_chunk = next_page_chunk;
      next_page_chunk = load_page_chunk((it >> 5) + 1);
    }
    return __shfl_sync(0xffffffffu, page_chunk, it & 31);
  };
#pragma unroll
  for (int s = 0; s < stages - 1; ++s) issue(first_tile + s * stride, s, page_of(s, first_tile + s * stride));
  long long next_page = page_of(stages - 1, first_tile + (stages - 1) * stride);
  int read_stage = 0, write_stage = stages - 1;
  for (int base = first_tile, it = 0; base < t1; base += stride, ++it) {
    const long long page_after_next = page_of(it + stages, base + stages * stride);  // in flight during this tile
    issue(base + (stages - 1) * stride, write_stage, next_page);                     // into the stage read last iteration
    next_page = page_after_next;
    wait_copies<stages - 1>();  // this tile's group is complete
    __syncwarp();               // every lane's copies of this stage are in place
    const int stage = read_stage;
    read_stage = read_stage == stages - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == stages - 1 ? 0 : write_stage + 1;
    const unsigned char* k_tile = ring + stage * Layout::kStageBytes;
    const unsigned char* v_tile = k_tile + kTile * Layout::kKRowBytes;
    if (Layout::kFp8) {
      // This tile's e4m3 V rows to f16 for ldmatrix; lane-strided 16-byte chunks.
#pragma unroll
      for (int i = 0; i < kTile * Layout::kChunksPerRow / 32; ++i) {
        const int idx = i * 32 + lane, tok = idx / Layout::kChunksPerRow, chunk = idx % Layout::kChunksPerRow;
        const Bf16x8 raw = load16_shared(v_tile + tok * Layout::kVRowBytes + chunk * 16);
        Bf16x8 lo, hi;
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          lo.w[2 * w] = e4m3x2_to_f16x2(static_cast<unsigned short>(raw.w[w] & 0xffffu));
          lo.w[2 * w + 1] = e4m3x2_to_f16x2(static_cast<unsigned short>(raw.w[w] >> 16));
          hi.w[2 * w] = e4m3x2_to_f16x2(static_cast<unsigned short>(raw.w[2 + w] & 0xffffu));
          hi.w[2 * w + 1] = e4m3x2_to_f16x2(static_cast<unsigned short>(raw.w[2 + w] >> 16));
        }
        store16_shared(v_staging + tok * Layout::kStagingRowBytes + chunk * 32, lo);
        store16_shared(v_staging + tok * Layout::kStagingRowBytes + chunk * 32 + 16, hi);
      }
      __syncwarp();
    }
    // S = Q K^T for tokens base + 8n + g.
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int m = 0; m < kBlocks; ++m) {
        Bf16x8 kw;
        if (Layout::kFp8) {  // dims 32m + 8c .. + 7 of token 8n + g: 8 bytes, 4 f16 pairs
          const unsigned char* row = k_tile + (8 * n + g) * Layout::kKRowBytes + 32 * m + 8 * c;
          unsigned raw[2];
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(raw[0]), "=r"(raw[1]) : "r"(shared_address(row)));
          kw = e4m3x8_to_pairs<f16>(raw[0], raw[1]);
        } else {
          kw = load16_shared(k_tile + (8 * n + g) * Layout::kKRowBytes + 2 * (32 * m + 8 * c));
        }
        mma_16816<M>(s[n], qa[m][0], kw.w[0], kw.w[1]);
        mma_16816<M>(s[n], qa[m][1], kw.w[2], kw.w[3]);
      }
    }
    // Scale, cap, mask; one online-softmax step per row for the whole tile.
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row0 + g + 8 * (e >> 1);
        const int tok = base + 8 * n + 2 * c + (e & 1);
        const int rel = tok - (len - kQLen), j = r / kGroup;
        float x = softcap_score(s[n][e] * score_scale, p.softcap) * 1.4426950408889634f;
        if (r >= kRows || tok >= t1 || rel > j || rel < j - window) x = neg_inf();
        s[n][e] = x;
      }
    }
    online_softmax_step(s, m_row, l_row, o);
    // O += P V: P's A fragments are S's accumulators; V's B fragments come from ldmatrix.trans.
    const unsigned pa[4] = {pack2<M>(s[0][0], s[0][1]), pack2<M>(s[0][2], s[0][3]), pack2<M>(s[1][0], s[1][1]), pack2<M>(s[1][2], s[1][3])};
    const unsigned char* v_rows = Layout::kFp8 ? v_staging : v_tile;
    constexpr int kVRead = Layout::kFp8 ? Layout::kStagingRowBytes : Layout::kVRowBytes;
#pragma unroll
    for (int q = 0; q < kDTiles / 2; ++q) {
      unsigned vb[4];
      const int tok = (lane & 7) + 8 * ((lane >> 3) & 1), d = (2 * q + (lane >> 4)) * 8;
      ldmatrix_x4_trans(vb, v_rows + tok * kVRead + 2 * d);
      mma_16816<M>(o[2 * q], pa, vb[0], vb[1]);
      mma_16816<M>(o[2 * q + 1], pa, vb[2], vb[3]);
    }
    __syncwarp();  // every lane is done with this stage before the next iteration refills it
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();  // all warps are done with their stages: the memory now holds warp states
  // Indexed by token warp: the rows of warp_acc[w] come from the row tiles' w-th warps. At most
  // 16 x kHeadDim floats a warp, inside its ring.
  auto& warp_acc = *reinterpret_cast<float(*)[kMaxTokenWarps][kRows][kHeadDim]>(shared_bytes);

  // Per-warp state: m (log2 domain -> natural), l summed over the quad, O rows row0 + g and + 8.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l_row[half] = quad_sum(l_row[half]);
    const int r = row0 + g + 8 * half;
    if (r < kRows) {
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) {
        warp_acc[token_warp][r][8 * n + 2 * c] = o[n][2 * half] * p.v_scale;  // v_scale is 1 for a 16-bit cache
        warp_acc[token_warp][r][8 * n + 2 * c + 1] = o[n][2 * half + 1] * p.v_scale;
      }
      if (c == 0) {
        warp_m[token_warp][r] = m_row[half] == neg_inf() ? neg_inf() : m_row[half] * 0.6931471805599453f;
        warp_l[token_warp][r] = l_row[half];
      }
    }
  }
  merge_and_store<T, kHeadDim, kQLen, kGroup, kMaxTokenWarps>(p, warp_acc, warp_m, warp_l, token_warps, piece);
}

}  // namespace kiln
