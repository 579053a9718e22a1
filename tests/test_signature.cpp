#include <gtest/gtest.h>

#include "kiln/error.hpp"
#include "kiln/registry.hpp"

namespace kiln {
namespace {

const OperatorId kPrefill{kFamilyAttention, kModePrefill};

TEST(Signature, CanonicalFormSortsKeys) {
  Signature a(kPrefill), b(kPrefill);
  a.set("head_dim", int64_t{128}).set("dtype", "bf16").set_flag("causal", true);
  b.set_flag("causal", true).set("dtype", "bf16").set("head_dim", int64_t{128});
  EXPECT_EQ(a.canonical(), "attention.prefill:causal=1,dtype=bf16,head_dim=128");
  EXPECT_EQ(a.canonical(), b.canonical());
  EXPECT_EQ(a, b);
}

TEST(Signature, ParseRoundTrips) {
  Signature s = Signature::parse(kPrefill, "dtype=bf16,head_dim=64,causal=1");
  EXPECT_EQ(s.get("dtype"), "bf16");
  EXPECT_EQ(s.get_int("head_dim"), 64);
  EXPECT_TRUE(s.get_flag("causal"));
  EXPECT_EQ(Signature::parse(kPrefill, s.canonical().substr(s.canonical().find(':') + 1)), s);
  EXPECT_EQ(Signature::parse(kPrefill, "").fields().size(), 0u);
}

TEST(Signature, ParseErrorsNameThePair) {
  try {
    Signature::parse(kPrefill, "dtype=bf16,head_dim");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'head_dim' is not key=value"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Signature::parse(kPrefill, "dtype=bf16,dtype=f16"), Error);
  EXPECT_THROW(Signature::parse(kPrefill, "Dtype=bf16"), Error);
  EXPECT_THROW(Signature::parse(kPrefill, "dtype="), Error);
  EXPECT_THROW(Signature::parse(kPrefill, "dtype=a,b"), Error);
  EXPECT_THROW(Signature::parse(kPrefill, "dtype=x:y"), Error);
}

TEST(Signature, TypedReadsReject) {
  Signature s = Signature::parse(kPrefill, "head_dim=12x,causal=yes");
  EXPECT_THROW(s.get_int("head_dim"), Error);
  EXPECT_THROW(s.get_flag("causal"), Error);
  EXPECT_THROW(s.get("missing"), Error);
}

TEST(Operators, NamesMapBothWays) {
  for (const auto& name : operator_names()) EXPECT_EQ(operator_name(operator_from_name(name)), name);
  try {
    operator_from_name("mha_prefil");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mha_decode_with_kvcache"), std::string::npos);
  }
}

}  // namespace
}  // namespace kiln
