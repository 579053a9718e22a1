// detect_devices(): the GPUs of both vendors this process can use, and why any are missing.
#include <fmt/format.h>

#include "backends/cuda/device.hpp"
#include "backends/cuda/driver.hpp"
#include "backends/hip/runtime.hpp"
#include "kiln/error.hpp"
#include "kiln/platform.hpp"

namespace kiln {
namespace {

void detect_nvidia(DeviceReport& report) {
  if (!detail::cuda::driver_available()) {
    try {
      detail::cuda::driver_symbol("cuInit");
    } catch (const Error& e) {
      report.notes.emplace_back("NVIDIA GPUs: " + e.message());
    }
    return;
  }
  int count = 0;
  try {
    count = detail::cuda::device_count();
  } catch (const Error& e) {
    report.notes.emplace_back("NVIDIA GPUs: " + e.message());
    return;
  }
  if (count == 0) report.notes.emplace_back("NVIDIA GPUs: the NVIDIA driver is loaded but reports no GPU");
  for (int i = 0; i < count; ++i) {
    try {
      report.devices.push_back(detail::cuda::device(i).platform);
    } catch (const Error& e) {
      report.notes.emplace_back(fmt::format("NVIDIA GPU {}: {}", i, e.message()));
    }
  }
}

void detect_amd(DeviceReport& report) {
  int count = 0;
  try {
    count = detail::hip::device_count();
  } catch (const Error& e) {
    // The usual case on a machine without an AMD GPU: the runtime loads and says hipErrorNoDevice.
    report.notes.emplace_back("AMD GPUs: none usable: " + e.message());
    return;
  }
  if (count == 0) report.notes.emplace_back("AMD GPUs: the HIP runtime is loaded but reports no GPU");
  for (int i = 0; i < count; ++i) {
    try {
      report.devices.push_back(detail::hip::device_platform(i));
    } catch (const Error& e) {
      report.notes.emplace_back(fmt::format("AMD GPU {}: {}", i, e.message()));
    }
  }
}

}  // namespace

DeviceReport detect_devices() {
  DeviceReport report;
  detect_nvidia(report);
  detect_amd(report);
  return report;
}

}  // namespace kiln
