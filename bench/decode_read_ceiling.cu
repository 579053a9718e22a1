// How fast the memory side of paged decode can go, without the math: reads the KV bytes of a
// decode shape (default B8 ctx32768 Hkv 8 head_dim 128, bf16) in several access patterns and
// prints each one's time and read rate. Answers whether kiln's decode is limited by its memory
// pattern (16-token tiles of one KV head per warp, through a cp.async ring, over random pages) and
// partition (ranges x KV heads CTAs), or by the work between its loads.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a bench/decode_read_ceiling.cu -o decode_read_ceiling
//   ./decode_read_ceiling [batch ctx]
//
// Every read byte is consumed (xor-folded into a value a CTA writes), inputs are random, times are
// CUDA-event medians of 30 launches after 5 warm-ups, and the 1 GB working set is 20x an H100's L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

constexpr int kHeadDim = 128, kTile = 16, kRowBytes = 2 * kHeadDim, kChunks = kRowBytes / 16;

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// Contiguous read, grid-stride, four 16-byte loads in flight per thread.
__global__ void stream_read(const uint4* __restrict__ a, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * step < n; i += 4 * step) {
    uint4 x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = __ldcs(a + i + u * step);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= x[u].x ^ x[u].y ^ x[u].z ^ x[u].w;
  }
  for (; i < n; i += step) {
    const uint4 x = __ldcs(a + i);
    acc ^= x.x ^ x.y ^ x.z ^ x.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

struct Paged {
  const unsigned char* k;
  const unsigned char* v;
  const int* pages;  // [batch, pages_per_seq]
  int batch, page_size, pages_per_seq, ctx, heads_kv;
  int ranges;                 // per KV head; the batch's tiles end to end, cut into `ranges` equal pieces
  int work_cycles;            // spun per tile after it is read, standing in for the math between loads
  unsigned long long* trace;  // per CTA: %smid, %globaltimer at start and at the end of its reads
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// kiln's decode memory pattern: CTA c reads range c / Hkv against KV head c % Hkv; warp w of W reads
// tiles w, w + W, ... of the range, each the 16 token rows of K and of V of its head (256 bytes
// each, Hkv x 256 bytes apart), through a ring of kStages stages with cp.async.cg (L2::256B).
template <int kStages>
__global__ void paged_read(Paged p, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char ring_all[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned long long start = global_ns();
  const int head = blockIdx.x % p.heads_kv, range = blockIdx.x / p.heads_kv;
  const int tiles_per_seq = p.ctx / kTile;
  const long long all_tiles = static_cast<long long>(tiles_per_seq) * p.batch;
  const int t0 = static_cast<int>(all_tiles * range / p.ranges), t1 = static_cast<int>(all_tiles * (range + 1) / p.ranges);
  unsigned char* ring = ring_all + warp * kStages * 2 * kTile * kRowBytes;
  const size_t token_bytes = static_cast<size_t>(p.heads_kv) * kRowBytes;
  auto issue = [&](int tile, int stage) {
    if (tile < t1) {
      const int b = tile / tiles_per_seq, token = (tile % tiles_per_seq) * kTile;
      const size_t page = p.pages[b * p.pages_per_seq + token / p.page_size];
      const size_t row0 = page * p.page_size + token % p.page_size;
      unsigned char* dst = ring + stage * 2 * kTile * kRowBytes;
#pragma unroll
      for (int i = 0; i < kTile * kChunks / 32; ++i) {
        const int idx = i * 32 + lane, tok = idx / kChunks, chunk = idx % kChunks;
        const size_t src = (row0 + tok) * token_bytes + head * kRowBytes + chunk * 16;
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_addr(dst + tok * kRowBytes + chunk * 16)),
                     "l"(p.k + src));
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_addr(dst + (kTile + tok) * kRowBytes + chunk * 16)),
                     "l"(p.v + src));
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  const int stride = warps;
  unsigned acc = 0;
  int tile = t0 + warp;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(tile + s * stride, s);
  for (int it = 0; tile < t1; tile += stride, ++it) {
    issue(tile + (kStages - 1) * stride, (it + kStages - 1) % kStages);
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
    __syncwarp();
    const uint4* stage = reinterpret_cast<const uint4*>(ring + (it % kStages) * 2 * kTile * kRowBytes);
#pragma unroll
    for (int i = 0; i < 2 * kTile * kChunks / 32; ++i) {
      const uint4 x = stage[i * 32 + lane];
      acc ^= x.x ^ x.y ^ x.z ^ x.w;
    }
    if (p.work_cycles > 0) {
      const long long until = clock64() + p.work_cycles;
      while (clock64() < until) acc = acc * 1664525u + 1013904223u;
    }
    __syncwarp();
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
  if (p.trace != nullptr) {
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      p.trace[3 * blockIdx.x] = sm;
      p.trace[3 * blockIdx.x + 1] = start;
      p.trace[3 * blockIdx.x + 2] = global_ns();
    }
  }
}

template <typename Launch>
float median_ms(Launch launch) {
  for (int i = 0; i < 5; ++i) launch();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(31);
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  CHECK(cudaEventRecord(ev[0]));
  for (int i = 0; i < 30; ++i) {
    launch();
    CHECK(cudaEventRecord(ev[i + 1]));
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventSynchronize(ev[30]));
  std::vector<float> t(30);
  for (int i = 0; i < 30; ++i) CHECK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
  std::sort(t.begin(), t.end());
  return 0.5f * (t[14] + t[15]);
}

__global__ void fill_random(unsigned* a, size_t n, unsigned seed) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 0x9e3779b1u ^ seed;
    x ^= x >> 15;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    a[i] = x & 0x3fff3fffu;  // finite bf16 pairs
  }
}

int main(int argc, char** argv) {
  const int batch = argc == 3 ? std::atoi(argv[1]) : 8, ctx = argc == 3 ? std::atoi(argv[2]) : 32768, heads_kv = 8;
  if ((argc != 1 && argc != 3) || batch <= 0 || ctx <= 0 || ctx % 128 != 0 || static_cast<long long>(batch) * ctx > (1LL << 30)) {
    std::fprintf(stderr, "usage: %s [batch ctx]: batch > 0, ctx a multiple of 128, batch x ctx at most 2^30\n", argv[0]);
    return 2;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const size_t half = static_cast<size_t>(batch) * ctx * heads_kv * kRowBytes;  // K (or V) bytes
  unsigned char *k, *v;
  unsigned* sink;
  CHECK(cudaMalloc(&k, half));
  CHECK(cudaMalloc(&v, half));
  CHECK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
  unsigned long long* trace;
  CHECK(cudaMalloc(&trace, 3 * 4096 * sizeof(unsigned long long)));
  fill_random<<<4 * sms, 256>>>(reinterpret_cast<unsigned*>(k), half / 4, 1u);
  fill_random<<<4 * sms, 256>>>(reinterpret_cast<unsigned*>(v), half / 4, 2u);
  CHECK(cudaGetLastError());
  std::printf("%s, %d SMs, L2 %d MiB; B%d ctx%d Hkv%d d%d bf16: %.3f GB of K and V\n", prop.name, sms, prop.l2CacheSize >> 20, batch, ctx,
              heads_kv, kHeadDim, 2.0 * half / 1e9);
  std::printf("%-58s %9s %9s\n", "pattern", "ms", "TB/s");
  auto report = [&](const char* what, float ms, double bytes) { std::printf("%-58s %9.4f %9.3f\n", what, ms, bytes / (ms * 1e-3) / 1e12); };

  // Device copy as side_by_side.py counts it (read + write) and pure contiguous reads.
  report("cudaMemcpy device to device (2 x bytes)", median_ms([&] { CHECK(cudaMemcpyAsync(v, k, half, cudaMemcpyDeviceToDevice)); }),
         2.0 * half);
  fill_random<<<4 * sms, 256>>>(reinterpret_cast<unsigned*>(v), half / 4, 2u);
  const size_t n16 = half / 16;
  for (int per_sm : {1, 2, 4}) {
    char what[96];
    std::snprintf(what, sizeof what, "contiguous, %d x %d CTAs of 512 threads", per_sm, sms);
    report(what, median_ms([&] {
             stream_read<<<per_sm * sms, 512>>>(reinterpret_cast<const uint4*>(k), n16, sink);
             stream_read<<<per_sm * sms, 512>>>(reinterpret_cast<const uint4*>(v), n16, sink);
           }),
           2.0 * half);
  }
  {
    const int ctas = sms / heads_kv * heads_kv;
    char what[96];
    std::snprintf(what, sizeof what, "contiguous, %d CTAs of 1024 threads", ctas);
    report(what, median_ms([&] {
             stream_read<<<ctas, 1024>>>(reinterpret_cast<const uint4*>(k), n16, sink);
             stream_read<<<ctas, 1024>>>(reinterpret_cast<const uint4*>(v), n16, sink);
           }),
           2.0 * half);
  }

  for (int page_size : {16, 64}) {
    const int pages_per_seq = ctx / page_size, num_pages = batch * pages_per_seq;
    std::vector<int> shuffled(num_pages), identity(num_pages);
    std::iota(identity.begin(), identity.end(), 0);
    shuffled = identity;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
    int *d_shuffled, *d_identity;
    CHECK(cudaMalloc(&d_shuffled, num_pages * sizeof(int)));
    CHECK(cudaMalloc(&d_identity, num_pages * sizeof(int)));
    CHECK(cudaMemcpy(d_shuffled, shuffled.data(), num_pages * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_identity, identity.data(), num_pages * sizeof(int), cudaMemcpyHostToDevice));
    struct Form {
      int ranges_per_head, warps, stages;
      bool shuffled;
      int work_cycles = 0;
    };
    const int g1 = sms / heads_kv;      // kiln's split rule for one 8-warp CTA per SM
    const int g2 = 2 * sms / heads_kv;  // 4-warp CTAs two to an SM, all SMs busy
    // Each within 227 KB of shared memory a CTA; 2 or 3 stages (paged_read's instantiations).
    const Form forms[] = {{g1, 8, 2, true},       {g1, 8, 2, false},      {g1, 8, 3, true},       {g1, 12, 2, true},
                          {g2, 4, 2, true},       {g2, 4, 3, true},       {2 * g1, 8, 2, true},   {g1, 8, 2, true, 1000},
                          {g1, 8, 3, true, 1000}, {g1, 8, 2, true, 2000}, {g1, 8, 3, true, 2000}, {g2, 4, 2, true, 1000},
                          {g2, 4, 3, true, 1000}};
    for (const Form& f : forms) {
      Paged p{
          k,      v, f.shuffled ? d_shuffled : d_identity, batch, page_size, pages_per_seq, ctx, heads_kv, f.ranges_per_head, f.work_cycles,
          nullptr};
      const int smem = f.warps * f.stages * 2 * kTile * kRowBytes;
      const int ctas = f.ranges_per_head * heads_kv;
      const auto kernel = f.stages == 2 ? paged_read<2> : paged_read<3>;
      CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      char what[120];
      std::snprintf(what, sizeof what, "paged p%d %s: %d CTAs of %d warps, %d stages, %d cycles a tile", page_size,
                    f.shuffled ? "shuffled" : "in order", ctas, f.warps, f.stages, f.work_cycles);
      auto launch = [&] { kernel<<<ctas, 32 * f.warps, smem>>>(p, sink); };
      report(what, median_ms(launch), 2.0 * half);
      // One more launch, traced: when the CTAs' reads end, in us from the first CTA's start.
      p.trace = trace;
      launch();
      CHECK(cudaGetLastError());
      std::vector<unsigned long long> t(3 * ctas);
      CHECK(cudaMemcpy(t.data(), trace, t.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      unsigned long long first = ~0ull;
      for (int c = 0; c < ctas; ++c) first = std::min(first, t[3 * c + 1]);
      std::vector<double> ends(ctas);
      for (int c = 0; c < ctas; ++c) ends[c] = (t[3 * c + 2] - first) * 1e-3;
      std::sort(ends.begin(), ends.end());
      std::printf("    traced: reads end min %.1f p10 %.1f median %.1f p90 %.1f max %.1f us\n", ends[0], ends[ctas / 10], ends[ctas / 2],
                  ends[9 * ctas / 10], ends[ctas - 1]);
    }
    CHECK(cudaFree(d_shuffled));
    CHECK(cudaFree(d_identity));
  }
  CHECK(cudaDeviceSynchronize());
  return 0;
}
