// Non-owning tensor views and the opaque stream handle of kiln's public API.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace kiln {

// Element types. Values match kiln_dtype in kiln.h.
enum class DType : int32_t {
  kBF16 = 1,
  kF16 = 2,
  kF32 = 3,
  kF8E4M3 = 4,
  kF8E5M2 = 5,
  // Two e2m1 values packed in one byte (low nibble first). Shapes and strides count bytes,
  // so a row of K fp4 values has K/2 elements of this type.
  kF4E2M1x2 = 6,
  kE8M0 = 7,  // OCP MX block scale: a biased power-of-two exponent in one byte
  kI32 = 8,
  kI64 = 9,
  // kF4E2M1x2 rewritten by moe_prepare_weights into kiln's prepared order (the bits of every
  // 4-byte word permuted; kernel-sources/moe/mxfp4_prepared.h). Same shapes, strides and scales.
  kF4E2M1x2Prepared = 10,
};

// Size in bytes of one element as counted by shape and strides.
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "bf16", "f16", "f32", "e4m3", ...
// Parses a name from dtype_name; throws kiln::Error naming `what` when it is unknown.
DType parse_dtype(const std::string& name, const char* what = "dtype");

inline constexpr int kMaxDims = 6;
inline constexpr int kHostDevice = -1;  // TensorView::device for host memory

// A view of memory someone else owns. `ndim == 0` means "absent" (optional arguments);
// a present tensor has ndim >= 1. Strides count elements, not bytes.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int32_t ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};
  int32_t device = 0;  // GPU ordinal, or kHostDevice

  bool defined() const { return ndim > 0; }
  int64_t size(int dim) const { return shape[static_cast<size_t>(dim < 0 ? dim + ndim : dim)]; }
  int64_t stride(int dim) const { return strides[static_cast<size_t>(dim < 0 ? dim + ndim : dim)]; }
  int64_t numel() const;
  bool is_contiguous() const;
  std::string describe() const;  // "bf16[128, 8, 64] on cuda:0"

  // A contiguous (row-major) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape, int32_t device = 0);
};

// The caller's stream: a CUstream on NVIDIA, a hipStream_t on AMD. nullptr is the default stream.
using Stream = void*;

}  // namespace kiln
