// The platform model: what a kernel may require of the GPU it runs on. A Platform comes either
// from a detected device or from the table of known targets, so that kiln can select and compile
// for a GPU it does not have (offline compiles, warm-up on a build box, tests).
#pragma once

#include <string>
#include <vector>

namespace kiln {

enum class Vendor { kNvidia, kAmd };
const char* vendor_name(Vendor vendor);  // "nvidia", "amd"

struct Platform {
  Vendor vendor = Vendor::kNvidia;
  // The exact compile target: "sm_90a", "sm_100a", "gfx942", "gfx950:sramecc+:xnack-".
  std::string arch;
  // Comparable within a vendor: sm_90a -> 90, sm_100a -> 100, gfx90a -> 910, gfx942 -> 942.
  int arch_version = 0;
  // Capability strings kernels require: "mma:mma_sync", "mma:wgmma", "memory:tma",
  // "memory:cp_async", "tensor_core:fp8", "tensor_core:fp4", "mma:mfma", "mma:mfma_f8f6f4", ...
  std::vector<std::string> features;
  int multiprocessor_count = 0;        // SMs or CUs
  size_t shared_memory_per_block = 0;  // opt-in maximum, bytes
  size_t l2_bytes = 0;
  int warp_size = 32;
  // True when this describes a device kiln found; false for a target from the table.
  bool detected = false;
  int device_index = -1;
  std::string device_name;  // "NVIDIA H100 80GB HBM3", or "(target sm_90a)"

  bool has_feature(const std::string& feature) const;
  std::string describe() const;
};

// A platform for a named target from kiln's table, with that GPU family's typical figures.
// Throws kiln::Error(kInvalidArgument) listing the known targets when `arch` is not one of them.
// AMD names may carry feature flags ("gfx950:sramecc+:xnack-"); the base name is looked up and
// the full name kept as the target.
Platform platform_for_target(const std::string& arch);

// Every target in the table, in a stable order.
std::vector<std::string> known_targets();

// The GPUs kiln can use in this process. Never throws: when none is usable, `devices` is empty
// and `notes` says why (no driver, no device, a device of an arch kiln does not know).
struct DeviceReport {
  std::vector<Platform> devices;
  std::vector<std::string> notes;
};
DeviceReport detect_devices();

}  // namespace kiln
