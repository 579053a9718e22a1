// Loads the real test plugin built by the suite (tests/plugin/test_plugin.c) into the global
// registry, and a copy built for a wrong ABI version.
#include <gtest/gtest.h>

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
  EXPECT_EQ(Registry::global().select(prefill_sig(64, true), h)->name, "attention.prefill.wgmma");
  const std::string why = Registry::global().explain(prefill_sig(64, true), h).to_text();
  EXPECT_NE(why.find("built-in kernels outrank plugins unless KILN_PLUGINS_OUTRANK=1"), std::string::npos) << why;
  // ... and once the operator opts in, the plugin takes what it accepts.
  Registry::global().set_plugins_outrank_builtins(true);
  EXPECT_EQ(Registry::global().select(prefill_sig(64, true), h)->name, "testplugin.attention.prefill.causal64");
  EXPECT_EQ(Registry::global().select(prefill_sig(128, true), h)->name, "attention.prefill.wgmma");
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
    EXPECT_NE(std::string(e.what()).find("built for plugin ABI version 999, this kiln speaks version 1"), std::string::npos) << e.what();
  }
}

TEST(Plugin, MissingFileOrEntryIsRefused) { EXPECT_THROW(load_plugin("/nonexistent.so"), Error); }

}  // namespace
}  // namespace kiln
