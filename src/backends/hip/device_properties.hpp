// Where kiln reads a device's figures in hipDeviceProp_t as ROCm 5 laid it out ("R0000"). ROCm 6
// changed the struct but kept this layout behind hipGetDevicePropertiesR0000, so one table serves
// both. tests/test_amd.cpp checks every offset against ROCm's own header.
#pragma once

#include <cstddef>

namespace kiln::detail::hip {

struct DevicePropertiesR0000 {
  static constexpr size_t kSize = 792;
  static constexpr size_t kName = 0;                   // char[256]
  static constexpr size_t kSharedMemPerBlock = 264;    // size_t
  static constexpr size_t kWarpSize = 276;             // int
  static constexpr size_t kMultiProcessorCount = 336;  // int
  static constexpr size_t kL2CacheSize = 340;          // int
  static constexpr size_t kGcnArchName = 396;          // char[256], "gfx942:sramecc+:xnack-"
};

}  // namespace kiln::detail::hip
