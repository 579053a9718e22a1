#include "tools/device_buffer.hpp"

#include <cmath>

#include "backends/cuda/driver.hpp"
#include "kiln/platform.hpp"

namespace kiln::tools {

bool use_first_gpu() {
  if (detect_devices().devices.empty()) return false;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  KILN_CU_CALL(cuDeviceGet, &dev, 0);
  KILN_CU_CALL(cuDevicePrimaryCtxRetain, &ctx, dev);
  KILN_CU_CALL(cuCtxSetCurrent, ctx);
  return true;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes ? bytes : 16) { KILN_CU_CALL(cuMemAlloc, &ptr_, bytes_); }
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) KILN_CU_FN(cuMemFree)(ptr_);
}
void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes) KILN_CU_CALL(cuMemcpyHtoD, ptr_, host, bytes);
}
void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes) KILN_CU_CALL(cuMemcpyDtoH, host, ptr_, bytes);
}
void DeviceBuffer::fill_bytes(uint8_t value) { KILN_CU_CALL(cuMemsetD8, ptr_, value, bytes_); }
void synchronize() { KILN_CU_CALL(cuCtxSynchronize); }

Event::Event() { KILN_CU_CALL(cuEventCreate, &event_, CU_EVENT_DEFAULT); }
Event::~Event() {
  if (event_) KILN_CU_FN(cuEventDestroy)(event_);
}
void Event::record() { KILN_CU_CALL(cuEventRecord, event_, nullptr); }
void Event::wait() const { KILN_CU_CALL(cuEventSynchronize, event_); }
float Event::since(const Event& start) const {
  float ms = 0;
  KILN_CU_CALL(cuEventElapsedTime, &ms, start.event_, event_);
  return ms;
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t out;
  std::memcpy(&out, &h, 2);
  return out;
}
float f16_to_float(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}
float e4m3_to_float(uint8_t v) {
  const int sign = v >> 7, exponent = (v >> 3) & 0xF, mantissa = v & 7;
  if (exponent == 0xF && mantissa == 7) return NAN;
  const float m = static_cast<float>(mantissa) / 8.0f;
  const float magnitude = exponent == 0 ? std::ldexp(m, -6) : std::ldexp(1.0f + m, exponent - 7);
  return sign ? -magnitude : magnitude;
}
float e2m1_to_float(uint8_t nibble) {
  static const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  return (nibble & 8) ? -magnitudes[nibble & 7] : magnitudes[nibble & 7];
}
float e8m0_to_float(uint8_t v) { return v == 0xFF ? NAN : std::ldexp(1.0f, v - 127); }

std::vector<uint16_t> random_half(std::mt19937& rng, size_t n, DType dtype, float scale, std::vector<double>& values) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint16_t> bits(n);
  values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float f = dist(rng);
    bits[i] = dtype == DType::kBF16 ? float_to_bf16(f) : float_to_f16(f);
    values[i] = dtype == DType::kBF16 ? bf16_to_float(bits[i]) : f16_to_float(bits[i]);
  }
  return bits;
}

}  // namespace kiln::tools
