#include <gtest/gtest.h>

#include "kiln/error.hpp"
#include "kiln/platform.hpp"
#include "kiln/tensor.hpp"

namespace kiln {
namespace {

TEST(Platform, KnownTargetsDescribeFeatures) {
  const Platform h = platform_for_target("sm_90a");
  EXPECT_EQ(h.vendor, Vendor::kNvidia);
  EXPECT_EQ(h.arch_version, 90);
  EXPECT_TRUE(h.has_feature("mma:wgmma"));
  EXPECT_TRUE(h.has_feature("memory:tma"));
  EXPECT_FALSE(h.detected);
  EXPECT_FALSE(platform_for_target("sm_90").has_feature("mma:wgmma"));  // no 'a': no wgmma
  EXPECT_TRUE(platform_for_target("sm_100a").has_feature("tensor_core:fp4"));
  const Platform mi = platform_for_target("gfx950");
  EXPECT_EQ(mi.vendor, Vendor::kAmd);
  EXPECT_EQ(mi.warp_size, 64);
  EXPECT_TRUE(mi.has_feature("mma:mfma_f8f6f4"));
}

TEST(Platform, AmdFeatureFlagsStayInTheTarget) {
  const Platform p = platform_for_target("gfx950:sramecc+:xnack-");
  EXPECT_EQ(p.arch, "gfx950:sramecc+:xnack-");
  EXPECT_EQ(p.arch_version, 950);
}

TEST(Platform, UnknownArchIsAnErrorListingKnownOnes) {
  for (const char* bad : {"sm_42", "gfx1100", "", "sm_90a:foo", "SM_90A"}) {
    try {
      platform_for_target(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("sm_90a, sm_100a"), std::string::npos) << e.what();
    }
  }
}

TEST(Platform, DetectionWithoutDriverExplains) {
  const DeviceReport r = detect_devices();
  if (!r.devices.empty()) GTEST_SKIP() << "a GPU is present";
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.front().find("libcuda"), std::string::npos) << r.notes.front();
}

TEST(Tensor, DTypeNamesRoundTrip) {
  for (DType d :
       {DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3, DType::kF8E5M2, DType::kF4E2M1x2, DType::kE8M0, DType::kI32, DType::kI64}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
    EXPECT_GT(dtype_size(d), 0u);
  }
  EXPECT_THROW(parse_dtype("fp8"), Error);
}

TEST(Tensor, ContiguousViews) {
  TensorView t = TensorView::contiguous(nullptr, DType::kBF16, {4, 8, 64});
  EXPECT_EQ(t.numel(), 4 * 8 * 64);
  EXPECT_EQ(t.stride(0), 512);
  EXPECT_TRUE(t.is_contiguous());
  t.strides[0] = 1024;
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.describe(), "bf16[4, 8, 64] on device 0");
}

}  // namespace
}  // namespace kiln
