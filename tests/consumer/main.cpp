// An embedding project: finds kiln with find_package, lists kernels, selects, compiles and validates.
#include <cstddef>
#include <cstdio>

#include <kiln/kiln.h>
#include <kiln/author.hpp>
#include <kiln/kiln.hpp>

#include "attention/params.h"  // installed in include/kiln/kernel-params
#include "moe/params.h"

extern "C" size_t consumer_c_layout(int which);

int main() {
  // The parameter blocks as C compiles them (params_c.c) and as C++ does.
  const size_t cpp[] = {sizeof(KilnPrefillParams), offsetof(KilnPrefillParams, tensor_maps),
                        sizeof(KilnDecodeParams),  sizeof(KilnKvAppendParams),
                        sizeof(KilnMoeParams),     offsetof(KilnMoeParams, tensor_maps)};
  for (int i = 0; i < 6; ++i) {
    if (consumer_c_layout(i) != cpp[i]) {
      std::fprintf(stderr, "parameter block layout %d: C says %zu bytes, C++ %zu\n", i, consumer_c_layout(i), cpp[i]);
      return 1;
    }
  }
  const auto kernels = kiln::Registry::global().kernels();
  if (kernels.empty()) {
    std::fprintf(stderr, "no kernels registered\n");
    return 1;
  }
  kiln::Signature sig({kiln::kFamilyAttention, kiln::kModePrefill});
  sig.set("dtype", "bf16").set("head_dim", int64_t{128}).set("group", int64_t{8});
  for (const char* flag : {"causal", "window", "sinks", "softcap", "lse"}) sig.set_flag(flag, false);
  const auto chosen = kiln::Registry::global().select(sig, kiln::platform_for_target("sm_90a"));
  // A real compile through the run-time compiler (no GPU needed): through the compile worker, or
  // in this process when none is where kiln looks (the static library, uninstalled).
  const kiln::CompiledKernel compiled = kiln::compile_for_target(sig, "sm_90a");
  std::printf("compiled %s for %s: %zu bytes (%s)\n", compiled.kernel.c_str(), compiled.target.c_str(), compiled.binary.size(),
              compiled.origin.c_str());
  if (compiled.binary.empty()) return 1;
  // The C ABI reports a bad call with a status and a message.
  kiln_mha_prefill_args args{};
  const kiln_status status = kiln_mha_prefill(&args, nullptr);
  std::printf("kiln %s: %zu kernels; selected %s; empty call -> status %d (%s)\n", kiln_version(), kernels.size(), chosen->name.c_str(),
              static_cast<int>(status), kiln_last_error());
  return status == KILN_ERROR_INVALID_ARGUMENT ? 0 : 1;
}
