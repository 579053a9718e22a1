// Portable kernels: one source (kernel-sources/, written against common/prelude.cuh) registered
// once per vendor.
#pragma once

#include "kiln/registry.hpp"

namespace kiln::detail {

// The AMD registration of a portable NVIDIA kernel spec: the name gains ".amd", the backend is
// HIP, and it runs from gfx90a on (the prelude's AMD half needs nothing newer).
inline KernelSpec amd_registration(KernelSpec spec) {
  spec.name += ".amd";
  spec.backend = Backend::kHip;
  spec.requirements = Requirements{};
  spec.requirements.vendor = Vendor::kAmd;
  spec.requirements.min_arch = 910;  // gfx90a
  return spec;
}

}  // namespace kiln::detail
