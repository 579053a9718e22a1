#include "tools/device_buffer.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "backends/backend.hpp"
#include "core/parallel.hpp"
#include "kiln/platform.hpp"

namespace kiln::tools {

namespace {

detail::VendorBackend& gpu() { return detail::launch_backend(); }

// Fills elements [0, n) a chunk of 2^20 at a time, each chunk from its own generator seeded by
// (seed, chunk index), on every hardware thread: the values do not depend on the thread count,
// and GPT-OSS-120B's 3.2e9 expert weights take seconds instead of a minute or more on one thread.
// fill(rng, begin, end) writes elements [begin, end).
template <typename Fill>
void fill_in_chunks(uint32_t seed, size_t n, const Fill& fill) {
  constexpr size_t kChunk = size_t{1} << 20;
  detail::for_each_index_in_parallel((n + kChunk - 1) / kChunk, 1, [&](size_t c) {
    std::seed_seq seq{seed, static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32)};
    std::mt19937 rng(seq);
    fill(rng, c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

}  // namespace

bool use_first_gpu() {
  if (detect_devices().devices.empty()) return false;
  // Entered and never left: device 0 stays current for this thread, as the tools expect.
  gpu().enter(0);
  return true;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : ptr_(gpu().device_alloc(bytes ? bytes : 16)), bytes_(bytes ? bytes : 16) {}
DeviceBuffer::~DeviceBuffer() { gpu().device_free(ptr_); }
void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes == 0) return;
  gpu().copy_to_device(ptr_, host, bytes, nullptr);
  gpu().synchronize(nullptr);
}
void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes == 0) return;
  gpu().copy_to_host(host, ptr_, bytes, nullptr);
  gpu().synchronize(nullptr);
}
void DeviceBuffer::fill_bytes(uint8_t value) { gpu().memset(ptr_, value, bytes_); }
void synchronize() { gpu().synchronize_device(); }

Event::Event() : event_(gpu().event_create()) {}
Event::~Event() { gpu().event_destroy(event_); }
void Event::record() { gpu().event_record(event_, nullptr); }
void Event::wait() const { gpu().event_synchronize(event_); }
float Event::since(const Event& start) const { return gpu().event_elapsed_ms(start.event_, event_); }

std::vector<uint16_t> random_half(std::mt19937& rng, size_t n, DType dtype, float scale) {
  std::vector<uint16_t> bits(n);
  fill_in_chunks(static_cast<uint32_t>(rng()), n, [&](std::mt19937& chunk_rng, size_t begin, size_t end) {
    std::normal_distribution<float> dist(0.0f, scale);
    for (size_t i = begin; i < end; ++i) {
      const float f = dist(chunk_rng);
      bits[i] = dtype == DType::kBF16 ? float_to_bf16(f) : float_to_f16(f);
    }
  });
  return bits;
}

std::vector<uint16_t> random_half(std::mt19937& rng, size_t n, DType dtype, float scale, std::vector<double>& values) {
  auto bits = random_half(rng, n, dtype, scale);
  values = decode_half(bits, dtype);
  return bits;
}

std::vector<uint8_t> random_e4m3(std::mt19937& rng, size_t n, float scale, std::vector<double>& values) {
  std::vector<uint8_t> bits(n);
  values.resize(n);
  fill_in_chunks(static_cast<uint32_t>(rng()), n, [&](std::mt19937& chunk_rng, size_t begin, size_t end) {
    std::uniform_int_distribution<int> byte(0, 255);
    for (size_t i = begin; i < end; ++i) {
      uint8_t b;
      do {
        b = static_cast<uint8_t>(byte(chunk_rng));
      } while ((b & 0x7f) == 0x7f || ((b >> 3) & 0xF) > 9);  // not NaN; exponent field at most 9
      bits[i] = b;
      values[i] = static_cast<double>(e4m3_to_float(b)) * scale;
    }
  });
  return bits;
}

std::vector<double> decode_half(const std::vector<uint16_t>& bits, DType dtype) {
  std::vector<double> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = dtype == DType::kBF16 ? bf16_to_float(bits[i]) : f16_to_float(bits[i]);
  return values;
}

void random_mxfp4(std::mt19937& rng, size_t rows, size_t k, std::vector<uint8_t>& packed, std::vector<uint8_t>& scales) {
  packed.assign(rows * k / 2, 0);
  scales.assign(rows * k / 32, 0);
  fill_in_chunks(static_cast<uint32_t>(rng()), scales.size(), [&](std::mt19937& chunk_rng, size_t begin, size_t end) {
    std::uniform_int_distribution<int> scale(121, 124);
    for (size_t i = begin; i < end; ++i) scales[i] = static_cast<uint8_t>(scale(chunk_rng));
  });
  fill_in_chunks(static_cast<uint32_t>(rng()), packed.size(), [&](std::mt19937& chunk_rng, size_t begin, size_t end) {
    std::uniform_int_distribution<int> byte(0, 255);  // two independent uniform nibbles
    for (size_t i = begin; i < end; ++i) packed[i] = static_cast<uint8_t>(byte(chunk_rng));
  });
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
