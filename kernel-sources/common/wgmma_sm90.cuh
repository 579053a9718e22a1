// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only) in inline PTX, for tiles kept in shared
// memory in the 128-byte swizzle: the matrix descriptor, the SS form (A and B in shared memory),
// the RS form (A in registers, B N-major), and the fence / commit / wait around them.
// Accumulators are m64nN f32 tiles held as float[N / 8][4]: warp w of the warpgroup owns rows
// 16 w .. 16 w + 15, and each [N / 8] entry is laid out as an mma.sync m16n8 accumulator, so the
// softmax helpers of the mma.sync kernels apply unchanged.
#pragma once

#include "common/prelude.cuh"
#include "common/shared_address.cuh"

namespace kiln {

// 128-byte swizzle atom: 8 rows of 128 bytes (64 16-bit elements); 16-byte chunk c of row r sits
// at chunk c ^ (r % 8). Atoms start on 1024-byte boundaries (the hardware swizzles address bits).
__device__ __forceinline__ unsigned swizzle128_offset(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }
// Row `row`, 16-byte chunk `chunk` of a tile of such atoms whose 64-column atom columns are
// `atom_bytes` apart.
__device__ __forceinline__ unsigned swizzle128_tile_offset(int row, int chunk, int atom_bytes) {
  return (chunk >> 3) * atom_bytes + swizzle128_offset(row, chunk & 7);
}

// Matrix descriptor of a 128-byte-swizzled operand. K-major: `stride_bytes` steps between 8-row
// groups (1024 for atoms stacked by row); `leading_bytes` is unused. N-major: `stride_bytes`
// steps 8 rows along K, `leading_bytes` steps to the next 64 columns along N.
__device__ __forceinline__ unsigned long long wgmma_descriptor(unsigned smem_address, unsigned leading_bytes, unsigned stride_bytes) {
  return static_cast<unsigned long long>((smem_address & 0x3FFFF) >> 4) | (static_cast<unsigned long long>(leading_bytes >> 4) << 16) |
         (static_cast<unsigned long long>(stride_bytes >> 4) << 32) | (1ull << 62);
}

// The descriptor of the same operand `bytes` (a multiple of 16) further on: only the low word's
// address field moves, and shared addresses stay below 2^18, so it never carries into the rest.
// One add where rebuilding a descriptor from its address took ptxas five uniform instructions.
__device__ __forceinline__ unsigned long long wgmma_descriptor_advance(unsigned long long descriptor, unsigned bytes) {
  return (descriptor & 0xFFFFFFFF00000000ull) | (static_cast<unsigned>(descriptor) + (bytes >> 4));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from touching accumulators between an MMA's issue and the wait that ends it.
template <int kTiles>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i) asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}
// Gives accumulators an (unspecified) value without an instruction, for MMAs that overwrite them
// (accumulate 0), where zeroing would cost a move per register.
template <int kTiles>
__device__ __forceinline__ void wgmma_define_operands(float (&d)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i) asm volatile("" : "=f"(d[i][0]), "=f"(d[i][1]), "=f"(d[i][2]), "=f"(d[i][3]));
}
// Makes shared memory written through the generic proxy (st.shared, cp.async) visible to wgmma's
// async proxy: each writing thread fences once its writes have landed, before the barrier.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Operand lists: the m64nN f32 accumulators, then the descriptors or A registers and the
// accumulate flag (0: D = A B, otherwise D += A B). The lists grow 16 columns at a time.
#define KILN_WGMMA_ACC8(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define KILN_WGMMA_ACC_16 KILN_WGMMA_ACC8(0), KILN_WGMMA_ACC8(1)
#define KILN_WGMMA_REGS_16 "%0, %1, %2, %3, %4, %5, %6, %7"
#define KILN_WGMMA_ACC_32 KILN_WGMMA_ACC_16, KILN_WGMMA_ACC8(2), KILN_WGMMA_ACC8(3)
#define KILN_WGMMA_REGS_32 KILN_WGMMA_REGS_16 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define KILN_WGMMA_ACC_48 KILN_WGMMA_ACC_32, KILN_WGMMA_ACC8(4), KILN_WGMMA_ACC8(5)
#define KILN_WGMMA_REGS_48 KILN_WGMMA_REGS_32 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define KILN_WGMMA_ACC_64 KILN_WGMMA_ACC_48, KILN_WGMMA_ACC8(6), KILN_WGMMA_ACC8(7)
#define KILN_WGMMA_REGS_64 KILN_WGMMA_REGS_48 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define KILN_WGMMA_ACC_80 KILN_WGMMA_ACC_64, KILN_WGMMA_ACC8(8), KILN_WGMMA_ACC8(9)
#define KILN_WGMMA_REGS_80 KILN_WGMMA_REGS_64 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define KILN_WGMMA_ACC_96 KILN_WGMMA_ACC_80, KILN_WGMMA_ACC8(10), KILN_WGMMA_ACC8(11)
#define KILN_WGMMA_REGS_96 KILN_WGMMA_REGS_80 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define KILN_WGMMA_ACC_112 KILN_WGMMA_ACC_96, KILN_WGMMA_ACC8(12), KILN_WGMMA_ACC8(13)
#define KILN_WGMMA_REGS_112 KILN_WGMMA_REGS_96 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define KILN_WGMMA_ACC_128 KILN_WGMMA_ACC_112, KILN_WGMMA_ACC8(14), KILN_WGMMA_ACC8(15)
#define KILN_WGMMA_REGS_128 KILN_WGMMA_REGS_112 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define KILN_WGMMA_ACC_144 KILN_WGMMA_ACC_128, KILN_WGMMA_ACC8(16), KILN_WGMMA_ACC8(17)
#define KILN_WGMMA_REGS_144 KILN_WGMMA_REGS_128 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define KILN_WGMMA_ACC_160 KILN_WGMMA_ACC_144, KILN_WGMMA_ACC8(18), KILN_WGMMA_ACC8(19)
#define KILN_WGMMA_REGS_160 KILN_WGMMA_REGS_144 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define KILN_WGMMA_ACC_176 KILN_WGMMA_ACC_160, KILN_WGMMA_ACC8(20), KILN_WGMMA_ACC8(21)
#define KILN_WGMMA_REGS_176 KILN_WGMMA_REGS_160 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define KILN_WGMMA_ACC_192 KILN_WGMMA_ACC_176, KILN_WGMMA_ACC8(22), KILN_WGMMA_ACC8(23)
#define KILN_WGMMA_REGS_192 KILN_WGMMA_REGS_176 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define KILN_WGMMA_ACC_208 KILN_WGMMA_ACC_192, KILN_WGMMA_ACC8(24), KILN_WGMMA_ACC8(25)
#define KILN_WGMMA_REGS_208 KILN_WGMMA_REGS_192 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define KILN_WGMMA_ACC_224 KILN_WGMMA_ACC_208, KILN_WGMMA_ACC8(26), KILN_WGMMA_ACC8(27)
#define KILN_WGMMA_REGS_224 KILN_WGMMA_REGS_208 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define KILN_WGMMA_ACC_240 KILN_WGMMA_ACC_224, KILN_WGMMA_ACC8(28), KILN_WGMMA_ACC8(29)
#define KILN_WGMMA_REGS_240 KILN_WGMMA_REGS_224 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define KILN_WGMMA_ACC_256 KILN_WGMMA_ACC_240, KILN_WGMMA_ACC8(30), KILN_WGMMA_ACC8(31)
#define KILN_WGMMA_REGS_256 KILN_WGMMA_REGS_240 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define KILN_WGMMA_D_48 "{" KILN_WGMMA_REGS_48 "}"
#define KILN_WGMMA_SS_TAIL_48 ", %24, %25, p, 1, 1, 0, 0;\n"
#define KILN_WGMMA_SS_PRED_48 "setp.ne.b32 p, %26, 0;\n"
#define KILN_WGMMA_RS_A_48 ", {%24, %25, %26, %27}, %28, p, 1, 1, "
#define KILN_WGMMA_RS_PRED_48 "setp.ne.b32 p, %29, 0;\n"
#define KILN_WGMMA_D_64 "{" KILN_WGMMA_REGS_64 "}"
#define KILN_WGMMA_SS_TAIL_64 ", %32, %33, p, 1, 1, 0, 0;\n"
#define KILN_WGMMA_SS_PRED_64 "setp.ne.b32 p, %34, 0;\n"
#define KILN_WGMMA_RS_A_64 ", {%32, %33, %34, %35}, %36, p, 1, 1, "
#define KILN_WGMMA_RS_PRED_64 "setp.ne.b32 p, %37, 0;\n"
#define KILN_WGMMA_D_80 "{" KILN_WGMMA_REGS_80 "}"
#define KILN_WGMMA_SS_TAIL_80 ", %40, %41, p, 1, 1, 0, 0;\n"
#define KILN_WGMMA_SS_PRED_80 "setp.ne.b32 p, %42, 0;\n"
#define KILN_WGMMA_RS_A_80 ", {%40, %41, %42, %43}, %44, p, 1, 1, "
#define KILN_WGMMA_RS_PRED_80 "setp.ne.b32 p, %45, 0;\n"
#define KILN_WGMMA_D_128 "{" KILN_WGMMA_REGS_128 "}"
#define KILN_WGMMA_SS_TAIL_128 ", %64, %65, p, 1, 1, 0, 0;\n"
#define KILN_WGMMA_SS_PRED_128 "setp.ne.b32 p, %66, 0;\n"
#define KILN_WGMMA_RS_A_128 ", {%64, %65, %66, %67}, %68, p, 1, 1, "
#define KILN_WGMMA_RS_PRED_128 "setp.ne.b32 p, %69, 0;\n"
#define KILN_WGMMA_D_144 "{" KILN_WGMMA_REGS_144 "}"
#define KILN_WGMMA_SS_TAIL_144 ", %72, %73, p, 1, 1, 0, 0;\n"
#define KILN_WGMMA_SS_PRED_144 "setp.ne.b32 p, %74, 0;\n"
#define KILN_WGMMA_RS_A_144 ", {%72, %73, %74, %75}, %76, p, 1, 1, "
#define KILN_WGMMA_RS_PRED_144 "setp.ne.b32 p, %77, 0;\n"
#define KILN_WGMMA_D_176 "{" KILN_WGMMA_REGS_176 "}"
#define KILN_WGMMA_SS_TAIL_176 ", %88, %89, p, 1, 1, 0, 0;\n"
#define KILN_WGMMA_SS_PRED_176 "setp.ne.b32 p, %90, 0;\n"
#define KILN_WGMMA_RS_A_176 ", {%88, %89, %90, %91}, %92, p, 1, 1, "
#define KILN_WGMMA_RS_PRED_176 "setp.ne.b32 p, %93, 0;\n"
#define KILN_WGMMA_D_256 "{" KILN_WGMMA_REGS_256 "}"
#define KILN_WGMMA_SS_TAIL_256 ", %128, %129, p, 1, 1, 0, 0;\n"
#define KILN_WGMMA_SS_PRED_256 "setp.ne.b32 p, %130, 0;\n"
#define KILN_WGMMA_RS_A_256 ", {%128, %129, %130, %131}, %132, p, 1, 1, "
#define KILN_WGMMA_RS_PRED_256 "setp.ne.b32 p, %133, 0;\n"

// D = A B (accumulate 0) or D += A B: A [64 x 16] and B [16 x N], both K-major in shared memory.
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate);
// D += A B: A [64 x 16] in registers (per warp, the mma.sync m16n8k16 A fragment of its 16 rows),
// B [16 x N] N-major in shared memory.
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b);
// D = A B (accumulate 0) or D += A B: A in registers as for wgmma_rs, B [16 x N] K-major in shared
// memory (N rows of 16 K values, as wgmma_ss takes it).
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs_k_major(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b, int accumulate);
// wgmma_rs with the accumulate operand: D = A B (0) or D += A B, B N-major.
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs_n_major(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b, int accumulate);

#define KILN_WGMMA_DEFINE(TYPE, N)                                                                                                     \
  template <>                                                                                                                          \
  __device__ __forceinline__ void wgmma_ss<TYPE, N>(float(&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate) { \
    asm volatile("{\n.reg .pred p;\n" KILN_WGMMA_SS_PRED_##N "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TYPE "." #TYPE         \
                                                             " " KILN_WGMMA_D_##N KILN_WGMMA_SS_TAIL_##N "}\n"                         \
                 : KILN_WGMMA_ACC_##N                                                                                                  \
                 : "l"(a), "l"(b), "r"(accumulate));                                                                                   \
  }                                                                                                                                    \
  template <>                                                                                                                          \
  __device__ __forceinline__ void wgmma_rs<TYPE, N>(float(&d)[N / 8][4], const unsigned(&a)[4], unsigned long long b) {                \
    KILN_WGMMA_RS_ASM(TYPE, N, 1, 1);                                                                                                  \
  }
// The register-A MMA's asm: TNSP is B's transpose flag (1: N-major, 0: K-major), ACCUMULATE the
// operand that selects D += A B (nonzero) or D = A B.
#define KILN_WGMMA_RS_ASM(TYPE, N, TNSP, ACCUMULATE)                                                                         \
  asm volatile("{\n.reg .pred p;\n" KILN_WGMMA_RS_PRED_##N "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TYPE "." #TYPE \
                                                           " " KILN_WGMMA_D_##N KILN_WGMMA_RS_A_##N #TNSP ";\n}\n"           \
               : KILN_WGMMA_ACC_##N                                                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(ACCUMULATE))
#define KILN_WGMMA_RS_K_MAJOR_DEFINE(TYPE, N)                                                                                 \
  template <>                                                                                                                 \
  __device__ __forceinline__ void wgmma_rs_k_major<TYPE, N>(float(&d)[N / 8][4], const unsigned(&a)[4], unsigned long long b, \
                                                            int accumulate) {                                                 \
    KILN_WGMMA_RS_ASM(TYPE, N, 0, accumulate);                                                                                \
  }
#define KILN_WGMMA_RS_N_MAJOR_DEFINE(TYPE, N)                                                                                 \
  template <>                                                                                                                 \
  __device__ __forceinline__ void wgmma_rs_n_major<TYPE, N>(float(&d)[N / 8][4], const unsigned(&a)[4], unsigned long long b, \
                                                            int accumulate) {                                                 \
    KILN_WGMMA_RS_ASM(TYPE, N, 1, accumulate);                                                                                \
  }
KILN_WGMMA_DEFINE(bf16, 64)
KILN_WGMMA_DEFINE(bf16, 128)
KILN_WGMMA_RS_K_MAJOR_DEFINE(bf16, 64)  // the MoE grouped GEMMs with MXFP4 weights
KILN_WGMMA_RS_K_MAJOR_DEFINE(bf16, 128)
KILN_WGMMA_RS_K_MAJOR_DEFINE(bf16, 144)
KILN_WGMMA_DEFINE(f16, 64)
KILN_WGMMA_DEFINE(f16, 128)
KILN_WGMMA_DEFINE(bf16, 256)  // the MoE grouped GEMMs, and P V at head_dim 256
KILN_WGMMA_DEFINE(f16, 256)
KILN_WGMMA_DEFINE(bf16, 80)  // the prefill kernel's key blocks at head_dim 256
KILN_WGMMA_DEFINE(f16, 80)
KILN_WGMMA_DEFINE(bf16, 176)  // the prefill kernel's key blocks at head_dim 128
KILN_WGMMA_DEFINE(f16, 176)
KILN_WGMMA_DEFINE(bf16, 48)  // the sliding-window kernel's key blocks
KILN_WGMMA_DEFINE(f16, 48)
KILN_WGMMA_DEFINE(bf16, 144)  // the window strip kernel's bands
KILN_WGMMA_DEFINE(f16, 144)
KILN_WGMMA_RS_N_MAJOR_DEFINE(bf16, 64)  // the window strip kernel's P V, whose first step overwrites O
KILN_WGMMA_RS_N_MAJOR_DEFINE(f16, 64)
#undef KILN_WGMMA_DEFINE
#undef KILN_WGMMA_RS_K_MAJOR_DEFINE
#undef KILN_WGMMA_RS_N_MAJOR_DEFINE
#undef KILN_WGMMA_RS_ASM

// D = A B^T over K in steps of 16 (the first step overwrites D), A [64 x K] and B [N x K] K-major
// in 128-byte-swizzled tiles whose 64-column atom columns are a_atom_bytes and b_atom_bytes apart:
// 32 bytes along an atom, then the next atom column. Issues only; commit and wait are the caller's.
template <typename T, int N, int K>
__device__ __forceinline__ void wgmma_ss_k_major(float (&d)[N / 8][4], unsigned a_address, unsigned a_atom_bytes, unsigned b_address,
                                                 unsigned b_atom_bytes) {
  const unsigned long long a = wgmma_descriptor(a_address, 16, 1024), b = wgmma_descriptor(b_address, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    const unsigned step = (ks & 3) * 32;
    wgmma_ss<T, N>(d, wgmma_descriptor_advance(a, (ks >> 2) * a_atom_bytes + step),
                   wgmma_descriptor_advance(b, (ks >> 2) * b_atom_bytes + step), ks > 0);
  }
}

// O += P V over kKeys keys: P as the register A fragments of m64nNk16 (16 keys each), V the B
// operand N-major from descriptor `v` at its first key, each 16 keys 2048 bytes (two 1024-byte
// atom row groups of 8 keys) on.
template <typename T, int N, int kKeys>
__device__ __forceinline__ void wgmma_rs_pv(float (&o)[N / 8][4], const unsigned (&p)[kKeys / 16][4], unsigned long long v) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs<T, N>(o, p[kk], wgmma_descriptor_advance(v, kk * 16 * 128));
}

// Four 8 x 8 matrices of 16-bit values into shared memory from their fragments (register i of
// lane l: row l / 4, columns 2 (l % 4) and + 1 of matrix i, as in an m16n8 accumulator packed to
// pairs); lanes 8 i .. 8 i + 7 give the addresses of matrix i's rows. sm_90+.
__device__ __forceinline__ void stmatrix_x4(unsigned smem, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

}  // namespace kiln
