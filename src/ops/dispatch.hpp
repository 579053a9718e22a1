// The one path every operator takes after validation: select a kernel for the signature on the
// device's platform, get it compiled and loaded (JIT pipeline), launch it on the caller's stream.
#pragma once

#include <cstddef>

#include "kiln/registry.hpp"
#include "kiln/tensor.hpp"

namespace kiln::detail {

// `params` is the operator's parameter block (kernel-sources/<family>/params.h); it is passed
// by value as the kernel's only argument.
void run_operator(const Signature& sig, int device, const void* params, size_t params_size,
                  Stream stream);

}  // namespace kiln::detail
