// The host encodings the tools and GPU tests use to make inputs and read outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "moe/mxfp8_activations.h"
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

// W4A8's MXFP8 quantization (moe/mxfp8_activations.h) against the tools' own e4m3 conversion and
// a search over every e4m3 value: the block exponent is the smallest that leaves nothing above
// 448, and rounding goes to the nearest value, ties to the even code, subnormals included.
TEST(NumberFormats, Mxfp8ActivationsRoundToNearestE4m3) {
  std::vector<float> values;  // the 126 finite positive e4m3 values, ascending
  for (uint8_t code = 1; code < 0x7F; ++code) values.push_back(e4m3_to_float(code));
  std::vector<float> probes;
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float mid = (values[i] + values[i + 1]) / 2;  // exact in f32: a tie
    probes.insert(probes.end(), {values[i], mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)});
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-14.0f, 8.8f);
  for (int i = 0; i < 20000; ++i) probes.push_back(std::exp2(exponent(rng)));
  probes.insert(probes.end(), {0.0f, 448.0f, std::ldexp(1.0f, -10), std::ldexp(3.0f, -11), 1e-30f});
  for (float p : probes) {
    if (p > 448.0f) continue;
    for (float v : {p, -p}) {
      const float q = kiln_round_to_e4m3(v);
      ASSERT_EQ(q, e4m3_to_float(float_to_e4m3_saturated(v))) << v;
      ASSERT_EQ(kiln_e4m3_code(q), float_to_e4m3_saturated(v)) << v;
      // Nearest by search (zero included); on a tie between two values, the even code.
      float best_error = std::fabs(v);
      int nearest = 1;
      for (float c : values) {
        const float e = std::fabs(c - std::fabs(v));
        if (e < best_error) {
          best_error = e;
          nearest = 1;
        } else if (e == best_error) {
          ++nearest;
        }
      }
      ASSERT_EQ(std::fabs(std::fabs(q) - std::fabs(v)), best_error) << v;
      if (nearest == 2) {
        ASSERT_EQ(kiln_e4m3_code(q) & 1u, 0u) << v;
      }
      ASSERT_EQ(std::signbit(q), std::signbit(v)) << v;
    }
  }
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f);
  for (int i = 0; i < 20000; ++i) {
    const float amax = std::exp2(wide(rng));
    const int s = kiln_mxfp8_exponent(amax);
    ASSERT_LE(amax, 448.0f * std::ldexp(1.0f, s)) << amax;
    if (s > -126) {  // else the least exponent kept
      ASSERT_GT(amax, 448.0f * std::ldexp(1.0f, s - 1)) << amax;
    }
    ASSERT_EQ(kiln_mxfp8_value(amax, s), kiln_round_to_e4m3(amax * std::ldexp(1.0f, -s)) * std::ldexp(1.0f, s));
  }
  EXPECT_EQ(kiln_mxfp8_exponent(448.0f), 0);
  EXPECT_EQ(kiln_mxfp8_exponent(std::nextafter(448.0f, 1000.0f)), 1);
  EXPECT_EQ(kiln_mxfp8_exponent(0.0f), -126);
}

// bf16 activations as two MXFP8 terms (gfx950's scaled MFMAs take no bf16): exact for every bf16
// value at or above 2^-6 of its block's scale, and within 2^-14 of the scale below, for block
// exponents across the range a bf16 block can have.
TEST(NumberFormats, Bf16SplitsIntoTwoMxfp8Terms) {
  for (int s : {-133 + 7, -100, -20, -1, 0, 1, 7, 50, 119}) {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
      const float x = bf16_to_float(static_cast<uint16_t>(bits));
      if (!std::isfinite(x) || std::fabs(x) > 448.0f * std::ldexp(1.0f, s)) continue;  // outside any block of exponent s
      const float q = kiln_round_to_e4m3(x * std::ldexp(1.0f, -s));
      const float r = kiln_mxfp8_residual(x, s, q);
      const double sum = std::ldexp(static_cast<double>(q) + static_cast<double>(r) / 16, s);
      if (std::fabs(x) >= std::ldexp(1.0, s - 6)) {
        ASSERT_EQ(sum, static_cast<double>(x)) << "x " << x << " s " << s;
      } else {
        ASSERT_LE(std::fabs(sum - x), std::ldexp(1.0, s - 14)) << "x " << x << " s " << s;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::tools
