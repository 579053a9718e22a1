#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "kiln/error.hpp"
#include "ops/validate.hpp"

#include <optional>

namespace kiln::detail {

void invalid_argument(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

void check_tensor(const TensorView& t, const TensorRule& rule) {
  if (!t.defined()) invalid_argument(fmt::format("{}: required tensor is missing", rule.name));
  if (t.ndim != rule.rank) {
    invalid_argument(fmt::format("{}: expected rank {}, got {} ({})", rule.name, rule.rank, t.ndim, t.describe()));
  }
  bool dtype_ok = false;
  std::string allowed;
  for (DType d : rule.dtypes) {
    dtype_ok |= (d == t.dtype);
    allowed += allowed.empty() ? dtype_name(d) : std::string(" or ") + dtype_name(d);
  }
  if (!dtype_ok) {
    invalid_argument(fmt::format("{}: expected dtype {}, got {}", rule.name, allowed, dtype_name(t.dtype)));
  }
  int64_t max_offset = 0;
  for (int d = 0; d < t.ndim; ++d) {
    const int64_t size = t.size(d);
    const int64_t stride = t.stride(d);
    if (size < 0) invalid_argument(fmt::format("{}: dimension {} has negative size {}", rule.name, d, size));
    if (stride < 0) invalid_argument(fmt::format("{}: dimension {} has negative stride {}", rule.name, d, stride));
    if (size > 0) {
      if (stride > 0 && size - 1 > (std::numeric_limits<int64_t>::max() - max_offset) / stride) {
        invalid_argument(fmt::format("{}: offsets overflow 64-bit ({})", rule.name, t.describe()));
      }
      max_offset += (size - 1) * stride;
    }
  }
  const int64_t numel = checked_numel(t, rule.name);
  if (numel == 0) return;  // an empty tensor is never dereferenced
  if (t.data == nullptr) invalid_argument(fmt::format("{}: data pointer is null ({})", rule.name, t.describe()));
  if (t.stride(-1) != 1 && t.size(-1) > 1) {
    invalid_argument(fmt::format("{}: last dimension must be contiguous (stride 1), got stride {}", rule.name, t.stride(-1)));
  }
  if (max_offset >= std::numeric_limits<int32_t>::max()) {
    invalid_argument(fmt::format("{}: largest element offset {} exceeds 32-bit indexing (2^31 - 1); split the call ({})", rule.name,
                                 max_offset, t.describe()));
  }
  const size_t elem = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % rule.alignment != 0) {
    invalid_argument(fmt::format("{}: data pointer {} is not {}-byte aligned", rule.name, t.data, rule.alignment));
  }
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (t.size(d) > 1 && (static_cast<size_t>(t.stride(d)) * elem) % rule.alignment != 0) {
      invalid_argument(fmt::format("{}: stride of dimension {} is {} elements = {} bytes, not a multiple of {} bytes", rule.name, d,
                                   t.stride(d), static_cast<size_t>(t.stride(d)) * elem, rule.alignment));
    }
  }
}

int64_t checked_numel(const TensorView& t, const char* name) {
  if (t.ndim < 1 || t.ndim > kMaxDims) invalid_argument(fmt::format("{}: rank must be 1 to {}, got {}", name, kMaxDims, t.ndim));
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) {
    const int64_t size = t.size(d);
    if (size < 0) invalid_argument(fmt::format("{}: dimension {} has negative size {}", name, d, size));
    if (size > 0 && n > std::numeric_limits<int64_t>::max() / size) {
      invalid_argument(fmt::format("{}: element count overflows 64-bit ({})", name, t.describe()));
    }
    n *= size;
  }
  return n;
}

namespace {

// The bytes a checked tensor spans: [first, last] of its elements, or nothing when it is empty.
std::optional<std::pair<uintptr_t, uintptr_t>> byte_extent(const TensorView& t) {
  if (!t.defined() || t.data == nullptr || t.numel() == 0) return std::nullopt;
  uint64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += static_cast<uint64_t>(t.size(d) - 1) * static_cast<uint64_t>(t.stride(d));
  const auto first = reinterpret_cast<uintptr_t>(t.data);
  return std::pair{first, first + (last + 1) * dtype_size(t.dtype) - 1};
}

}  // namespace

void check_disjoint(const TensorView& out, const char* out_name, std::initializer_list<std::pair<const TensorView*, const char*>> inputs) {
  const auto o = byte_extent(out);
  if (!o) return;
  for (const auto& [in, name] : inputs) {
    if (in->device != out.device) continue;
    const auto i = byte_extent(*in);
    if (i && o->first <= i->second && i->first <= o->second) {
      invalid_argument(fmt::format("{}: overlaps {} in memory; the output must not alias an input", out_name, name));
    }
  }
}

void check_optional_tensor(const TensorView& t, const TensorRule& rule) {
  if (t.defined()) check_tensor(t, rule);
}

void check_dim(const TensorView& t, const char* name, int dim, int64_t expected, const char* expected_what) {
  if (t.size(dim) != expected) {
    invalid_argument(
        fmt::format("{}: dimension {} must be {} = {}, got {} ({})", name, dim, expected_what, expected, t.size(dim), t.describe()));
  }
}

void check_same_device(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name) {
  if (t.defined() && t.device != ref.device && t.device != kHostDevice) {
    invalid_argument(fmt::format("{}: on device {}, but {} is on device {}", name, t.device, ref_name, ref.device));
  }
}

void check_host_cu_seqlens(const TensorView& cu, const char* name, int64_t total, int32_t max_seqlen, const char* max_name) {
  if (cu.device != kHostDevice || cu.numel() == 0) return;
  const int* v = static_cast<const int*>(cu.data);
  const int64_t n = cu.size(0);
  if (v[0] != 0) invalid_argument(fmt::format("{}[0] must be 0, got {}", name, v[0]));
  for (int64_t i = 1; i < n; ++i) {
    if (v[i] < v[i - 1]) {
      invalid_argument(fmt::format("{} must be non-decreasing: [{}] = {} < [{}] = {}", name, i, v[i], i - 1, v[i - 1]));
    }
    if (v[i] - v[i - 1] > max_seqlen) {
      invalid_argument(fmt::format("{}: sequence {} has length {} > {} = {}", name, i - 1, v[i] - v[i - 1], max_name, max_seqlen));
    }
  }
  if (v[n - 1] != total) {
    invalid_argument(fmt::format("{}[{}] must equal the total row count {}, got {}", name, n - 1, total, v[n - 1]));
  }
}

}  // namespace kiln::detail
