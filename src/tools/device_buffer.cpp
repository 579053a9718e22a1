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

std::vector<uint16_t> random_half(std::mt19937& rng, size_t n, DType dtype, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) {
    const float f = dist(rng);
    bits[i] = dtype == DType::kBF16 ? float_to_bf16(f) : float_to_f16(f);
  }
  return bits;
}

std::vector<uint16_t> random_half(std::mt19937& rng, size_t n, DType dtype, float scale, std::vector<double>& values) {
  auto bits = random_half(rng, n, dtype, scale);
  values = decode_half(bits, dtype);
  return bits;
}

std::vector<double> decode_half(const std::vector<uint16_t>& bits, DType dtype) {
  std::vector<double> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = dtype == DType::kBF16 ? bf16_to_float(bits[i]) : f16_to_float(bits[i]);
  return values;
}

void random_mxfp4(std::mt19937& rng, size_t rows, size_t k, std::vector<uint8_t>& packed, std::vector<uint8_t>& scales) {
  std::uniform_int_distribution<int> nibble(0, 15), scale(121, 124);
  packed.assign(rows * k / 2, 0);
  scales.assign(rows * k / 32, 0);
  for (auto& s : scales) s = static_cast<uint8_t>(scale(rng));
  for (size_t i = 0; i < rows * k; ++i) packed[i / 2] |= static_cast<uint8_t>(i % 2 ? nibble(rng) << 4 : nibble(rng));
}

void random_mxfp4(std::mt19937& rng, size_t rows, size_t k, std::vector<uint8_t>& packed, std::vector<uint8_t>& scales,
                  std::vector<double>& values) {
  random_mxfp4(rng, rows, k, packed, scales);
  values = decode_mxfp4(packed, scales);
}

std::vector<double> decode_mxfp4(const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scales) {
  std::vector<double> values(packed.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint8_t v = static_cast<uint8_t>(i % 2 ? packed[i / 2] >> 4 : packed[i / 2] & 0xF);
    values[i] = static_cast<double>(e2m1_to_float(v)) * e8m0_to_float(scales[i / 32]);
  }
  return values;
}

}  // namespace kiln::tools
