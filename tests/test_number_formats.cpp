// The host encodings the tools and GPU tests use to make inputs and read outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tools/number_formats.hpp"

namespace kiln::tools {
namespace {

TEST(NumberFormats, EveryF16ValueRoundTrips) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float f = f16_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_f16(f), bits) << std::hex << bits;
  }
}

TEST(NumberFormats, F16RoundsToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16(1.0f + 0.5f / 1024), 0x3C00);  // halfway: to even
  EXPECT_EQ(float_to_f16(1.0f + 1.5f / 1024), 0x3C02);  // halfway: to even (up)
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);            // rounds up to infinity
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -26)), 0x0000);  // below half of it
  EXPECT_EQ(float_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f16_to_float(0x0400), std::ldexp(1.0f, -14));
}

TEST(NumberFormats, Bf16AndTheEightBitFormats) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float f = bf16_to_float(static_cast<uint16_t>(bits));
    if (!std::isnan(f)) {
      EXPECT_EQ(float_to_bf16(f), bits);
    }
  }
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_EQ(e2m1_to_float(0x7), 6.0f);
  EXPECT_EQ(e2m1_to_float(0xB), -1.5f);
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
}

}  // namespace
}  // namespace kiln::tools
