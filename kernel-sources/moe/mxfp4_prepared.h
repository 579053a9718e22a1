// MXFP4 weights in kiln's prepared order (DType::kF4E2M1x2Prepared, written by
// moe_prepare_weights): the bytes of OCP MX e2m1x2 rows (two values a byte along K, the e8m0
// scales unchanged), with the 32 bits of every aligned 4-byte word -- values 8 w .. 8 w + 7 of a
// row -- permuted so that moe.apply.stream turns a word into its four bf16 pairs with 4 rotations
// and 5 masks instead of 8 shifts and 7 masks (apply_stream.cuh, e2m1x8_prepared_to_tiny_bf16x2).
// Shared verbatim by kiln's host code and the kernels; plain C, so OpenCL C includes it too.
//
// Standard bit b of a word is bit b % 4 of value b / 4 (low nibble first; bit 0 the mantissa, 1
// and 2 the exponent, 3 the sign). The permutation was found by a matching search over rotations
// and masks (bench/RESULTS.md, 2026-11-23, H100); the tests check the decode against the
// standard one.
#pragma once

#include "common/host_device.h"

// The prepared bit position (0-31) of standard bit b (0-31) of a word: byte b % 8 of the constant
// for bits 8 (b / 8) .. 8 (b / 8) + 7. Constants, not an array: a namespace-scope array would get
// a per-process symbol name in the kernels (see kMoeMaxTopK in moe_common.cuh).
KILN_HOST_DEVICE static inline unsigned kiln_mxfp4_prepared_slot(unsigned b) {
  const unsigned long long slots = b < 8    ? 0x110A09100F080706ull
                                   : b < 16 ? 0x1B141312150E0D0Cull
                                   : b < 24 ? 0x011A19001F181716ull
                                            : 0x0B040302051E1D1Cull;
  return (unsigned)(slots >> (8 * (b % 8))) & 31u;
}

// Value v (0-7) of a prepared word, as its standard 4-bit e2m1 code.
KILN_HOST_DEVICE static inline unsigned kiln_mxfp4_prepared_value(unsigned word, unsigned v) {
  unsigned code = 0;
  for (unsigned bit = 0; bit < 4; ++bit) code |= ((word >> kiln_mxfp4_prepared_slot(4 * v + bit)) & 1u) << bit;
  return code;
}
