// Fuzzes kiln's environment settings: the input is split at NUL bytes into values for each
// variable; reading them either works or raises kiln::Error.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cache/cache_directory.hpp"
#include "cache/kernel_cache.hpp"
#include "core/env.hpp"
#include "jit/compiler.hpp"
#include "kiln/error.hpp"
#include "kiln/registry.hpp"

namespace {

const char* const kVariables[] = {
    "KILN_LOG",        "KILN_CACHE_MAX_BYTES", "KILN_COMPILE_ISOLATION",         "KILN_COMPILE_TIMEOUT_S", "KILN_COMPILE_WORKER",
    "KILN_CACHE_SEED", "KILN_CACHE_DIR",       "KILN_OVERRIDE_ATTENTION_PREFILL"};

kiln::KernelSpec kernel(const std::string& name) {
  kiln::KernelSpec k;
  k.name = name;
  k.family = kiln::kFamilyAttention;
  k.mode = kiln::kModePrefill;
  k.source = "attention/prefill_reference.cuh";
  k.accepts = [](const kiln::Signature&) -> std::optional<std::string> { return std::nullopt; };
  k.specialize = [](const kiln::Signature&, const kiln::Platform&) { return kiln::Specialization{"f", {}}; };
  k.launch_shape = [](const void*, const kiln::Platform&) { return kiln::LaunchShape{}; };
  return k;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> values(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      values.emplace_back();
    } else {
      values.back() += static_cast<char>(data[i]);
    }
  }
  for (size_t v = 0; v < sizeof(kVariables) / sizeof(kVariables[0]); ++v) {
    if (v < values.size() && !values[v].empty()) {
      ::setenv(kVariables[v], values[v].c_str(), 1);
    } else {
      ::unsetenv(kVariables[v]);
    }
  }
  kiln::detail::parse_log_level(values[0]);
  try {
    kiln::detail::default_cache_max_bytes();
  } catch (const kiln::Error&) {
  }
  try {
    kiln::detail::jit_settings_from_environment();
  } catch (const kiln::Error&) {
  }
  kiln::detail::default_seed_databases();
  kiln::detail::default_cache_directory();
  kiln::Registry registry;
  registry.add(kernel("a"));
  registry.add(kernel("b"));
  kiln::Signature sig({kiln::kFamilyAttention, kiln::kModePrefill});
  try {
    registry.select(sig, kiln::platform_for_target("sm_90a"));
  } catch (const kiln::Error&) {
  }
  return 0;
}
