// Prepared MXFP4 weights (kernel-sources/moe/mxfp4_prepared.h, moe_prepare_weights): the layout is
// a permutation of each word's bits, the stream kernel's decode of a prepared word gives the same
// bf16 pairs as its decode of the standard word, and bad tensors are refused by name.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/kiln.h"
#include "kiln/ops.hpp"
#include "moe/mxfp4_prepared.h"

namespace kiln {
namespace {

uint32_t rotate_right(uint32_t w, unsigned n) { return (w >> n) | (w << (32 - n)); }

// apply_stream.cuh's e2m1x8_to_tiny_bf16x2 (standard words) and e2m1x8_prepared_to_tiny_bf16x2.
std::array<uint32_t, 4> standard_decode(uint32_t w) {
  constexpr uint32_t kMagnitudes = 0x01C001C0u, kSigns = 0x80008000u;
  return {((w << 6) & kMagnitudes) | ((w << 12) & kSigns), ((w << 2) & kMagnitudes) | ((w << 8) & kSigns),
          ((w >> 2) & kMagnitudes) | ((w << 4) & kSigns), ((w >> 6) & kMagnitudes) | (w & kSigns)};
}
std::array<uint32_t, 4> prepared_decode(uint32_t w) {
  constexpr uint32_t kBits = 0x81C081C0u;
  return {w & kBits, (rotate_right(w, 2) & 0x81808180u) | (rotate_right(w, 10) & 0x00400040u), rotate_right(w, 6) & kBits,
          rotate_right(w, 12) & kBits};
}

// One word prepared by moe_prepare_weights (in a row of the 16 bytes it takes at least).
uint32_t prepare_word(uint32_t w) {
  std::array<uint32_t, 4> row = {w, 0, 0, 0};
  const TensorView prepared = moe_prepare_weights(TensorView::contiguous(row.data(), DType::kF4E2M1x2, {16}, kHostDevice), nullptr);
  EXPECT_EQ(prepared.dtype, DType::kF4E2M1x2Prepared);
  return row[0];
}

TEST(Mxfp4Prepared, SlotsArePermutationOfTheWord) {
  std::set<unsigned> slots;
  for (unsigned b = 0; b < 32; ++b) slots.insert(kiln_mxfp4_prepared_slot(b));
  EXPECT_EQ(slots.size(), 32u);
  EXPECT_EQ(*slots.rbegin(), 31u);
}

TEST(Mxfp4Prepared, EveryValueReadsBackAndDecodesAsTheStandardWord) {
  std::vector<uint32_t> words;
  for (uint32_t v = 0; v < 8; ++v) {  // each code at each position, among zeros and among ones
    for (uint32_t code = 0; code < 16; ++code) {
      words.push_back(code << (4 * v));
      words.push_back(~(0xFu << (4 * v)) | (code << (4 * v)));
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) words.push_back(rng());
  int wrong = 0;
  for (const uint32_t w : words) {
    const uint32_t p = prepare_word(w);
    for (unsigned v = 0; v < 8; ++v) {
      if (kiln_mxfp4_prepared_value(p, v) != ((w >> (4 * v)) & 0xFu) && ++wrong <= 4) ADD_FAILURE() << std::hex << w << " value " << v;
    }
    if (prepared_decode(p) != standard_decode(w) && ++wrong <= 4) ADD_FAILURE() << "decode of " << std::hex << w;
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Mxfp4Prepared, PreparesAHostTensorInPlace) {
  std::mt19937 rng(3);
  std::vector<uint32_t> words(2 * 3 * 8);  // [2, 3, 32 bytes]
  for (auto& w : words) w = rng();
  const std::vector<uint32_t> standard = words;
  const TensorView prepared = moe_prepare_weights(TensorView::contiguous(words.data(), DType::kF4E2M1x2, {2, 3, 32}, kHostDevice), nullptr);
  EXPECT_EQ(prepared.dtype, DType::kF4E2M1x2Prepared);
  EXPECT_EQ(prepared.data, words.data());
  EXPECT_EQ(prepared.size(2), 32);
  for (size_t i = 0; i < words.size(); ++i) EXPECT_EQ(words[i], prepare_word(standard[i])) << i;
}

void expect_refused(const TensorView& t, const char* message) {
  try {
    moe_prepare_weights(t, nullptr);
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.message().find(message), std::string::npos) << e.message();
  }
}

TEST(Mxfp4Prepared, RefusesWhatItCannotPrepare) {
  alignas(16) static uint8_t bytes[256];
  auto host = [](DType dtype, std::initializer_list<int64_t> shape, size_t offset = 0) {
    return TensorView::contiguous(bytes + offset, dtype, shape, kHostDevice);
  };
  expect_refused(TensorView{}, "weights: a tensor is required");
  expect_refused(host(DType::kBF16, {4, 16}), "weights: must be MXFP4 values (e2m1x2), got bf16[4, 16]");
  expect_refused(host(DType::kF4E2M1x2Prepared, {4, 16}), "weights: already prepared");
  expect_refused(host(DType::kF4E2M1x2, {4, 24}), "the last dimension must be a multiple of 16 bytes");
  expect_refused(host(DType::kF4E2M1x2, {4, 16}, 2), "weights: data must be 4-byte aligned");
  TensorView strided = host(DType::kF4E2M1x2, {4, 16});
  strided.strides[0] = 32;
  expect_refused(strided, "weights: must be contiguous");
  TensorView null_data = host(DType::kF4E2M1x2, {4, 16});
  null_data.data = nullptr;
  expect_refused(null_data, "weights: data is null");
  // Shapes whose element count is negative or overflows: each once crashed or "succeeded".
  expect_refused(host(DType::kF4E2M1x2, {-16}), "weights: dimension 0 has negative size -16");
  expect_refused(host(DType::kF4E2M1x2, {(int64_t{1} << 59) + 1, 16}), "weights: element count overflows 64-bit");
  expect_refused(host(DType::kF4E2M1x2, {int64_t{1} << 62, 16}), "weights: element count overflows 64-bit");
  TensorView no_rank = host(DType::kF4E2M1x2, {16});
  no_rank.ndim = kMaxDims + 1;
  expect_refused(no_rank, "weights: rank must be 1 to 6");
}

TEST(Mxfp4Prepared, CApiSetsThePreparedDtype) {
  alignas(16) uint8_t bytes[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  kiln_tensor t{};
  t.data = bytes;
  t.dtype = KILN_F4_E2M1X2;
  t.ndim = 2;
  t.shape[0] = 2, t.shape[1] = 16;
  t.strides[0] = 16, t.strides[1] = 1;
  t.device = -1;
  uint32_t first = 0;
  std::memcpy(&first, bytes, 4);
  ASSERT_EQ(kiln_moe_prepare_weights(&t, nullptr), KILN_OK) << kiln_last_error();
  EXPECT_EQ(t.dtype, KILN_F4_E2M1X2_PREPARED);
  uint32_t now = 0;
  std::memcpy(&now, bytes, 4);
  EXPECT_EQ(now, prepare_word(first));
  EXPECT_EQ(kiln_moe_prepare_weights(&t, nullptr), KILN_ERROR_INVALID_ARGUMENT);  // twice
  EXPECT_NE(std::string(kiln_last_error()).find("already prepared"), std::string::npos);
  EXPECT_EQ(kiln_moe_prepare_weights(nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  // A refused call leaves the caller's descriptor as it was.
  kiln_tensor huge = t;
  huge.dtype = KILN_F4_E2M1X2;
  huge.shape[0] = int64_t{1} << 62;
  EXPECT_EQ(kiln_moe_prepare_weights(&huge, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(huge.dtype, KILN_F4_E2M1X2);
  EXPECT_NE(std::string(kiln_last_error()).find("overflows"), std::string::npos) << kiln_last_error();
}

}  // namespace
}  // namespace kiln
