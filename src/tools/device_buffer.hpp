// Helpers for the GPU tools and tests (kiln check, kiln bench, tests/gpu): the first GPU made
// current, and RAII device buffers and events through the backend interface.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kiln/tensor.hpp"
#include "tools/number_formats.hpp"

namespace kiln::tools {

// True when a GPU is usable; makes device 0's primary context current for the calling thread.
bool use_first_gpu();

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) { other.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  void fill_bytes(uint8_t value);  // poison

  template <typename T>
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer b(host.size() * sizeof(T) + 16);
    b.upload(host.data(), host.size() * sizeof(T));
    return b;
  }
  template <typename T>
  std::vector<T> to_host(size_t count) const {
    std::vector<T> out(count);
    download(out.data(), count * sizeof(T));
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

void synchronize();

// A timing event on the default stream.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record();
  // Milliseconds from `start` to this event; both must have completed.
  float since(const Event& start) const;
  void wait() const;

 private:
  void* event_ = nullptr;
};

// Random values of a 16-bit float type, normal with deviation `scale`; `values` receives what the
// bits decode to, so the reference computes on exactly what the kernel reads.
std::vector<uint16_t> random_half(std::mt19937& rng, size_t n, DType dtype, float scale);
std::vector<uint16_t> random_half(std::mt19937& rng, size_t n, DType dtype, float scale, std::vector<double>& values);
// Random e4m3 codes for a KV cache, finite with |value| <= 7.5; `values` receives each code's
// value times `scale` (the dequantized cache).
std::vector<uint8_t> random_e4m3(std::mt19937& rng, size_t n, float scale, std::vector<double>& values);
// Decoded values of bf16 or f16 bits.
std::vector<double> decode_half(const std::vector<uint16_t>& bits, DType dtype);

// Random MXFP4 weights [rows, k]: e2m1 nibbles packed two per byte (low first), one e8m0 scale
// per 32 values (2^-6 .. 2^-3); `values` receives what they decode to (decode_mxfp4).
void random_mxfp4(std::mt19937& rng, size_t rows, size_t k, std::vector<uint8_t>& packed, std::vector<uint8_t>& scales);
void random_mxfp4(std::mt19937& rng, size_t rows, size_t k, std::vector<uint8_t>& packed, std::vector<uint8_t>& scales,
                  std::vector<double>& values);
std::vector<double> decode_mxfp4(const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scales);

}  // namespace kiln::tools
