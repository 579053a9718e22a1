// moe_prepare_weights: MXFP4 weights rewritten once into kiln's prepared order
// (kernel-sources/moe/mxfp4_prepared.h), on the host or through it.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "backends/backend.hpp"
#include "kiln/error.hpp"
#include "kiln/ops.hpp"
#include "moe/mxfp4_prepared.h"
#include "ops/validate.hpp"

namespace kiln {
namespace {

// A word's prepared form is the OR of each of its bytes' bits moved to their slots: one table of
// 256 words per byte position.
using PrepareTables = std::array<std::array<uint32_t, 256>, 4>;
const PrepareTables& prepare_tables() {
  static const PrepareTables tables = [] {
    PrepareTables t{};
    for (unsigned position = 0; position < 4; ++position) {
      for (unsigned byte = 0; byte < 256; ++byte) {
        uint32_t word = 0;
        for (unsigned bit = 0; bit < 8; ++bit) {
          if (byte >> bit & 1u) word |= 1u << kiln_mxfp4_prepared_slot(8 * position + bit);
        }
        t[position][byte] = word;
      }
    }
    return t;
  }();
  return tables;
}

void prepare_host_bytes(uint8_t* bytes, size_t count) {
  const PrepareTables& t = prepare_tables();
  for (size_t i = 0; i < count; i += 4) {
    uint32_t word = t[0][bytes[i]] | t[1][bytes[i + 1]] | t[2][bytes[i + 2]] | t[3][bytes[i + 3]];
    std::memcpy(bytes + i, &word, 4);  // little-endian, as the GPU reads it
  }
}

// Device memory: each piece is copied out, prepared and copied back, in stream order; the call
// returns once the last piece is back.
void prepare_device_bytes(const TensorView& w, size_t count, Stream stream) {
  constexpr size_t kPieceBytes = size_t{64} << 20;
  detail::VendorBackend& backend = detail::launch_backend();
  const detail::ScopedLaunch scope(backend, w.device);
  std::vector<uint8_t> piece(std::min(count, kPieceBytes));
  auto* base = static_cast<uint8_t*>(w.data);
  for (size_t at = 0; at < count; at += kPieceBytes) {
    const size_t bytes = std::min(kPieceBytes, count - at);
    backend.copy_to_host(piece.data(), base + at, bytes, stream);
    backend.synchronize(stream);
    prepare_host_bytes(piece.data(), bytes);
    backend.copy_to_device(base + at, piece.data(), bytes, stream);
    backend.synchronize(stream);  // before `piece` is reused or freed
  }
}

}  // namespace

TensorView moe_prepare_weights(const TensorView& w, Stream stream) {
  using detail::invalid_argument;
  if (!w.defined()) invalid_argument("weights: a tensor is required");
  if (w.dtype == DType::kF4E2M1x2Prepared)
    invalid_argument("weights: already prepared (e2m1x2_prepared); preparing twice would scramble them");
  if (w.dtype != DType::kF4E2M1x2) invalid_argument(fmt::format("weights: must be MXFP4 values (e2m1x2), got {}", w.describe()));
  // Sizes and their product first: the checks below multiply them.
  const int64_t count = detail::checked_numel(w, "weights");
  if (w.data == nullptr && count > 0) invalid_argument("weights: data is null");
  if (count > 0 && !w.is_contiguous()) invalid_argument(fmt::format("weights: must be contiguous, got {}", w.describe()));
  if (w.size(-1) % 16 != 0) {
    invalid_argument(
        fmt::format("weights: the last dimension must be a multiple of 16 bytes (32 values, one scale block), got {}", w.size(-1)));
  }
  if (reinterpret_cast<uintptr_t>(w.data) % 4 != 0) invalid_argument("weights: data must be 4-byte aligned");
  if (w.device == kHostDevice) {
    prepare_host_bytes(static_cast<uint8_t*>(w.data), static_cast<size_t>(count));
  } else if (count > 0) {
    prepare_device_bytes(w, static_cast<size_t>(count), stream);
  }
  TensorView prepared = w;
  prepared.dtype = DType::kF4E2M1x2Prepared;
  return prepared;
}

}  // namespace kiln
