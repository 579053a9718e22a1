// Tensor argument checks shared by the operators. Each failure throws
// kiln::Error(kInvalidArgument) naming the argument and what was expected.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "kiln/tensor.hpp"

namespace kiln::detail {

struct TensorRule {
  const char* name;  // argument name as the caller knows it: "q", "k_cache"
  int rank;
  std::initializer_list<DType> dtypes;
  size_t alignment = 16;  // bytes, for the data pointer and every outer stride
};

// Checks one tensor: present, rank, dtype, non-null data (unless empty), sizes >= 0,
// last dimension contiguous, alignment, and that its largest offset fits 32-bit indexing.
void check_tensor(const TensorView& t, const TensorRule& rule);
// Same, for an optional tensor: absent is fine.
void check_optional_tensor(const TensorView& t, const TensorRule& rule);

// The element count of `t`: every size must be >= 0 and their product fit in int64 (stride-0
// dimensions included), else kiln::Error(kInvalidArgument) naming `name`. TensorView::numel()
// itself does not check, and an overflowed count is how absurd shapes slipped through.
int64_t checked_numel(const TensorView& t, const char* name);

// Refuses an output whose bytes overlap an input's (the kernels read inputs while other CTAs write
// the output, so an in-place call would read half-written values). Both already checked.
void check_disjoint(const TensorView& out, const char* out_name, std::initializer_list<std::pair<const TensorView*, const char*>> inputs);

void check_dim(const TensorView& t, const char* name, int dim, int64_t expected, const char* expected_what);
void check_same_device(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name);
[[noreturn]] void invalid_argument(const std::string& message);
// Host-resident cumulative lengths (cu_seqlens_q or _k) are checked entry by entry: 0 first,
// non-decreasing, no step above `max_seqlen`, last equal to `total`. Device-resident ones are not.
void check_host_cu_seqlens(const TensorView& cu, const char* name, int64_t total, int32_t max_seqlen, const char* max_name);

}  // namespace kiln::detail
