// Host encodings of the GPU number formats, for the tools and tests that make inputs and read
// outputs: bf16 and f16 (round to nearest even), e4m3 (saturating, nearest even), e2m1 and e8m0
// (decode only).
#pragma once

#include <cstdint>

namespace kiln::tools {

uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);
float e4m3_to_float(uint8_t v);
uint8_t float_to_e4m3_saturated(float f);  // +-448 beyond the range, NaN kept
float e2m1_to_float(uint8_t nibble);
float e8m0_to_float(uint8_t v);

}  // namespace kiln::tools
