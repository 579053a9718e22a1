#include "kiln/tensor.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "kiln/error.hpp"

namespace kiln {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kBF16, "bf16", 2},   {DType::kF16, "f16", 2},
    {DType::kF32, "f32", 4},     {DType::kF8E4M3, "e4m3", 1},
    {DType::kF8E5M2, "e5m2", 1}, {DType::kF4E2M1x2, "e2m1x2", 1},
    {DType::kE8M0, "e8m0", 1},   {DType::kI32, "i32", 4},
    {DType::kI64, "i64", 8},     {DType::kF4E2M1x2Prepared, "e2m1x2_prepared", 1},
};

const DTypeInfo* find(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

size_t dtype_size(DType dtype) {
  const DTypeInfo* info = find(dtype);
  return info ? info->size : 0;
}

const char* dtype_name(DType dtype) {
  const DTypeInfo* info = find(dtype);
  return info ? info->name : "invalid";
}

DType parse_dtype(const std::string& name, const char* what) {
  std::string known;
  for (const auto& info : kDTypes) {
    if (name == info.name) return info.dtype;
    known += known.empty() ? info.name : std::string(", ") + info.name;
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: unknown dtype '{}' (expected one of {})", what, name, known));
}

int64_t TensorView::numel() const {
  if (!defined()) return 0;
  int64_t n = 1;
  for (int i = 0; i < std::min(ndim, kMaxDims); ++i) {
    // Saturates rather than overflow; validation (checked_numel) names such a shape.
    if (__builtin_mul_overflow(n, shape[static_cast<size_t>(i)], &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    auto d = static_cast<size_t>(i);
    if (shape[d] != 1 && strides[d] != expected) return false;
    if (__builtin_mul_overflow(expected, shape[d], &expected)) return false;  // no such tensor fits in memory
  }
  return true;
}

std::string TensorView::describe() const {
  if (!defined()) return "(absent)";
  std::string dims;
  for (int i = 0; i < ndim; ++i) {
    dims += (i ? ", " : "") + std::to_string(shape[static_cast<size_t>(i)]);
  }
  std::string where = device == kHostDevice ? "host" : fmt::format("device {}", device);
  return fmt::format("{}[{}] on {}", dtype_name(dtype), dims, where);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape, int32_t device) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  if (t.ndim < 1 || t.ndim > kMaxDims) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("TensorView::contiguous: rank {} is outside 1..{}", t.ndim, kMaxDims));
  }
  size_t i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  // Strides of an absurd shape saturate instead of overflowing; validation then refuses the view.
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[static_cast<size_t>(d)] = stride;
    if (__builtin_mul_overflow(stride, t.shape[static_cast<size_t>(d)], &stride)) stride = std::numeric_limits<int64_t>::max();
  }
  return t;
}

}  // namespace kiln
