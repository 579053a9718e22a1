#include <gtest/gtest.h>

#include <string>

#include "kiln/kiln.h"

namespace {

kiln_tensor contiguous(void* data, kiln_dtype dtype, std::initializer_list<int64_t> shape) {
  kiln_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

TEST(CApi, StatusAndThreadLocalMessage) {
  EXPECT_EQ(kiln_mha_prefill(nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("args: must not be NULL"), std::string::npos);
  kiln_mha_prefill_args args{};
  EXPECT_EQ(kiln_mha_prefill(&args, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("q: required tensor is missing"), std::string::npos);
}

TEST(CApi, BadDtypeCodeIsAnArgumentError) {
  kiln_tensor q = contiguous(reinterpret_cast<void*>(0x100000), KILN_BF16, {4, 8, 64});
  q.dtype = 42;
  kiln_mha_decode_args args{};
  args.q = &q;
  EXPECT_EQ(kiln_mha_decode_with_kvcache(&args, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("q: dtype code 42 is not a kiln_dtype"), std::string::npos);
}

TEST(CApi, WorkspaceQueryValidatesBeforeTouchingADevice) {
  size_t bytes = 7;
  kiln_mha_extend_args args{};
  EXPECT_EQ(kiln_workspace_bytes("mha_extend_with_kvcache", &args, nullptr, &bytes), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("q: required tensor is missing"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(kiln_workspace_bytes("mha_extend", &args, nullptr, &bytes), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("mha_extend_with_kvcache"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(kiln_workspace_bytes("kv_cache_append", nullptr, nullptr, &bytes), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("args: must not be NULL"), std::string::npos);
  EXPECT_EQ(kiln_workspace_bytes("moe_apply", &args, nullptr, nullptr), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("bytes: must not be NULL"), std::string::npos);
}

TEST(CApi, ExplainAndListReturnJson) {
  char* json = nullptr;
  ASSERT_EQ(kiln_list_kernels_json(&json), KILN_OK) << kiln_last_error();
  EXPECT_NE(std::string(json).find("attention.prefill.reference"), std::string::npos);
  kiln_free_string(json);
  const char* sig = "dtype=bf16,kv_dtype=bf16,head_dim=128,group=8,page_size=16,q_len=1,window=0,sinks=0,softcap=0,lse=0";
  ASSERT_EQ(kiln_explain_json("mha_decode_with_kvcache", sig, "sm_90a", &json), KILN_OK) << kiln_last_error();
  EXPECT_NE(std::string(json).find("\"selected\": \"attention.decode.mma_split\""), std::string::npos) << json;
  kiln_free_string(json);
  ASSERT_EQ(kiln_explain_json("mha_decode_with_kvcache", sig, "sm_80", &json), KILN_OK) << kiln_last_error();
  EXPECT_NE(std::string(json).find("\"selected\": \"attention.decode.mma_split\""), std::string::npos) << json;
  kiln_free_string(json);
  const char* fp8 = "dtype=bf16,kv_dtype=e4m3,head_dim=128,group=8,page_size=16,q_len=1,window=0,sinks=0,softcap=0,lse=0";
  ASSERT_EQ(kiln_explain_json("mha_decode_with_kvcache", fp8, "sm_80", &json), KILN_OK) << kiln_last_error();
  EXPECT_NE(std::string(json).find("\"selected\": \"attention.decode.reference\""), std::string::npos) << json;
  EXPECT_NE(std::string(json).find("platform: needs arch version >= 89; sm_80 is 80"), std::string::npos) << json;
  kiln_free_string(json);
  EXPECT_EQ(kiln_explain_json("mha_decode", "dtype=bf16", "sm_90a", &json), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_explain_json("mha_decode_with_kvcache", "dtype=bf16", "sm_90a", &json), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("missing key 'kv_dtype'"), std::string::npos) << kiln_last_error();
  const char* moe =
      "dtype=bf16,weights=bf16,hidden=64,inter=64,experts=4,top_k=2,routing=topk_softmax,activation=silu_glu,"
      "layout=concat,w13_bias=none,w2_bias=none";
  EXPECT_EQ(kiln_explain_json("moe_apply", moe, "sm_13", &json), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("unknown arch 'sm_13'"), std::string::npos);
  // One validator: a value no call can give is an argument error, not a signature no kernel takes.
  EXPECT_EQ(kiln_explain_json("moe_apply", (std::string(moe) + ",renormalize=2").c_str(), "sm_90a", &json), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("renormalize=2: a flag is 0 or 1"), std::string::npos) << kiln_last_error();
  EXPECT_EQ(kiln_explain_json("moe_apply", (std::string(moe) + ",colour=red").c_str(), "sm_90a", &json), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kiln_last_error()).find("unknown key 'colour' for moe_apply (its keys: dtype, weights"), std::string::npos)
      << kiln_last_error();
  // W4A8 is asked for by name and served by the streaming kernel; with bf16 weights no kernel takes it.
  const std::string w4a8 =
      "dtype=bf16,weights=mxfp4,hidden=64,inter=64,experts=4,top_k=2,routing=topk_softmax,activation=silu_glu,"
      "layout=concat,w13_bias=none,w2_bias=none,act_dtype=e4m3";
  ASSERT_EQ(kiln_explain_json("moe_apply", w4a8.c_str(), "sm_90a", &json), KILN_OK) << kiln_last_error();
  EXPECT_NE(std::string(json).find("\"selected\": \"moe.apply.stream\""), std::string::npos) << json;
  kiln_free_string(json);
  std::string bf16_weights = w4a8;
  bf16_weights.replace(bf16_weights.find("weights=mxfp4"), 13, "weights=bf16");
  ASSERT_EQ(kiln_explain_json("moe_apply", bf16_weights.c_str(), "sm_90a", &json), KILN_OK) << kiln_last_error();
  EXPECT_NE(std::string(json).find("act_dtype e4m3 needs MXFP4 weights"), std::string::npos) << json;
  kiln_free_string(json);
}

TEST(CApi, OverrideOfUnknownOperatorIsRefused) {
  EXPECT_EQ(kiln_set_override("nope", "x"), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(kiln_set_override("moe_apply", nullptr), KILN_OK);
  EXPECT_EQ(kiln_load_plugin("/nonexistent/plugin.so"), KILN_ERROR_PLUGIN);
  EXPECT_NE(std::string(kiln_last_error()).find("dlopen failed"), std::string::npos);
}

}  // namespace
