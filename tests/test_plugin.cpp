// Loads the real test plugin built by the suite (tests/plugin/test_plugin.c) into the global
// registry, and a copy built for a wrong ABI version.
#include <gtest/gtest.h>

#include "attention/params.h"
#include "jit/pipeline.hpp"
#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/kiln.h"
#include "kiln/registry.hpp"
#include "support/signatures.hpp"

namespace kiln {
namespace {

Signature prefill_sig(int64_t head_dim, bool causal) { return test::prefill_signature("bf16", head_dim, 8, causal); }

TEST(Plugin, LoadsAndWinsWhereItApplies) {
  load_plugin(KILN_TEST_PLUGIN_GOOD);
  load_plugin(KILN_TEST_PLUGIN_GOOD);  // a second load is a no-op, not a duplicate
  auto spec = Registry::global().find("testplugin.attention.prefill.causal64");
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->priority, Priority::kPlugin);
  EXPECT_EQ(spec->origin, KILN_TEST_PLUGIN_GOOD);
  const Platform h = platform_for_target("sm_90a");
  // By default a built-in kernel that runs the call wins, whatever the plugin declares ...
  Registry::global().set_plugins_outrank_builtins(false);
  EXPECT_EQ(Registry::global().select(prefill_sig(64, true), h)->name, "attention.prefill.wgmma_ws");
  const std::string why = Registry::global().explain(prefill_sig(64, true), h).to_text();
  EXPECT_NE(why.find("built-in kernels outrank plugins unless KILN_PLUGINS_OUTRANK=1"), std::string::npos) << why;
  // ... and once the operator opts in, the plugin takes what it accepts.
  Registry::global().set_plugins_outrank_builtins(true);
  EXPECT_EQ(Registry::global().select(prefill_sig(64, true), h)->name, "testplugin.attention.prefill.causal64");
  EXPECT_EQ(Registry::global().select(prefill_sig(128, true), h)->name, "attention.prefill.wgmma_ws");
  const Explanation ex = Registry::global().explain(prefill_sig(64, false), h);
  EXPECT_NE(ex.to_text().find("signature: testplugin handles causal attention only"), std::string::npos) << ex.to_text();
  Registry::global().set_plugins_outrank_builtins(false);
}

TEST(Plugin, ItsSourceCompilesThroughTheJit) {
  load_plugin(KILN_TEST_PLUGIN_GOOD);
  Registry::global().set_plugins_outrank_builtins(true);
  const CompiledKernel k = compile_for_target(prefill_sig(64, true), "sm_90a");
  Registry::global().set_plugins_outrank_builtins(false);
  EXPECT_EQ(k.kernel, "testplugin.attention.prefill.causal64");
  EXPECT_EQ(k.lowered_name, "testplugin_prefill");
  EXPECT_GT(k.binary.size(), 0u);
}

TEST(Plugin, EmptyPathIsRefused) {
  // dlopen("") would hand back the main program.
  EXPECT_THROW(load_plugin(""), Error);
  EXPECT_EQ(kiln_load_plugin(""), KILN_ERROR_PLUGIN);
  EXPECT_NE(std::string(kiln_last_error()).find("the path is empty"), std::string::npos) << kiln_last_error();
}

TEST(Plugin, AbiMismatchIsRefusedWithBothVersions) {
  try {
    load_plugin(KILN_TEST_PLUGIN_BAD_ABI);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPluginError);
    EXPECT_NE(std::string(e.what()).find("built for plugin ABI version 999, this kiln speaks versions 1 to 2"), std::string::npos)
        << e.what();
  }
}

// Version 2 (tests/plugin/test_plugin_v2.c): signatures as data, a specialization per signature,
// a workspace and launch attributes, all through the registry and the JIT.
TEST(PluginV2, SignaturesAsDataSpecializationWorkspaceAndLaunch) {
  load_plugin(KILN_TEST_PLUGIN_V2);
  auto spec = Registry::global().find("testplugin2.attention.decode.tiled");
  ASSERT_NE(spec, nullptr);
  const Platform h = platform_for_target("sm_90a");
  Registry::global().set_plugins_outrank_builtins(true);
  const Signature f16 = test::decode_signature("f16", "f16", 128, 8);
  EXPECT_EQ(Registry::global().select(f16, h)->name, "testplugin2.attention.decode.tiled");
  // The data says why a signature is not taken.
  const std::string why = Registry::global().explain(test::decode_signature("bf16", "bf16", 128, 8), h).to_text();
  EXPECT_NE(why.find("dtype=bf16 is not one of the plugin's dtype=f16"), std::string::npos) << why;
  const std::string why_q = Registry::global().explain(test::decode_signature("f16", "f16", 128, 8, 16, 4), h).to_text();
  EXPECT_NE(why_q.find("q_len=4 is not one of the plugin's q_len=1"), std::string::npos) << why_q;

  // Each specialization is its own program: template arguments and defines reach NVRTC (the
  // source refuses to compile otherwise), and each has its own key.
  const CompiledKernel d128 = compile_for_target(f16, "sm_90a");
  const CompiledKernel d64 = compile_for_target(test::decode_signature("f16", "f16", 64, 4), "sm_90a");
  EXPECT_EQ(d128.kernel, "testplugin2.attention.decode.tiled");
  EXPECT_EQ(d128.name_expression, "testplugin2_decode<128, 8>");
  EXPECT_NE(d128.lowered_name.find("testplugin2_decode"), std::string::npos) << d128.lowered_name;
  EXPECT_EQ(d64.name_expression, "testplugin2_decode<64, 4>");
  EXPECT_NE(d128.key, d64.key);
  EXPECT_GT(d64.binary.size(), 0u);
  // A specialization the plugin refuses is unsupported, with its reason.
  try {
    compile_for_target(test::decode_signature("f16", "f16", 128, 16), "sm_90a");
    ADD_FAILURE() << "group 16 compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("built for groups up to 8, not 16"), std::string::npos) << e.what();
  }
  Registry::global().set_plugins_outrank_builtins(false);

  // Workspace and launch attributes, from the operator's parameter block.
  KilnDecodeParams params{};
  params.batch = 3;
  ASSERT_TRUE(spec->workspace_bytes);
  EXPECT_EQ(spec->workspace_bytes(&params, h), 3u * 4096u);
  const LaunchShape shape = spec->launch_shape(&params, h);
  EXPECT_EQ(shape.grid[0], 3u);
  EXPECT_EQ(shape.grid[1], 2u);
  EXPECT_EQ(shape.block[0], 128u);
  EXPECT_EQ(shape.dynamic_shared_bytes, 64u * 1024u);
  EXPECT_EQ(shape.cluster[0], 0u);
  EXPECT_EQ(shape.cluster[1], 2u);
  EXPECT_FALSE(shape.cooperative);
  EXPECT_THROW(spec->launch_shape(&params, platform_for_target("sm_100a")), Error) << "the plugin declines other targets";
}

TEST(Plugin, MissingFileOrEntryIsRefused) { EXPECT_THROW(load_plugin("/nonexistent.so"), Error); }

}  // namespace
}  // namespace kiln
