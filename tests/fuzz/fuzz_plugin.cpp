// Fuzzes plugin metadata: a kiln_plugin built from the input is registered into a fresh registry.
// It is refused with kiln::Error or registered whole; a registered kernel answers explain().
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/plugin.h"
#include "kiln/registry.hpp"
#include "registry/plugin_loader.hpp"

namespace {

// Reads the input front to back; strings end at NUL or at the end, and may be absent (NULL).
struct Reader {
  const uint8_t* p;
  size_t n;
  std::vector<std::string>* storage;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  int32_t i32() { return static_cast<int32_t>(byte() | (byte() << 8)) - 128; }
  const char* str() {
    if (byte() % 5 == 0) return nullptr;
    std::string s;
    while (n > 0 && *p != 0) s += static_cast<char>(byte());
    byte();
    storage->push_back(s);
    return storage->back().c_str();
  }
};

int accepts_all(const char*, char*, size_t) { return 1; }
int refuses(const char*, char* reason, size_t size) {
  std::snprintf(reason, size, "no");
  return 0;
}
int shape(const void*, const char*, uint32_t g[3], uint32_t b[3], uint32_t* smem) {
  g[0] = g[1] = g[2] = b[0] = b[1] = b[2] = 1;
  *smem = 0;
  return 0;
}
int launch(const void*, const char*, kiln_plugin_launch*) { return 0; }
int specialize(const char*, const char*, char* name, size_t name_size, char* options, size_t options_size) {
  std::snprintf(name, name_size, "k<1>");
  std::snprintf(options, options_size, "-DX=1\n\n");
  return 0;
}

}  // namespace

// The fields kernels of every ABI version share, read in the same order for both.
template <typename Kernel>
void read_common_fields(Reader& r, Kernel& k) {
  k.name = r.str();
  k.family = r.str();
  k.mode = r.str();
  k.vendor = r.str();
  k.min_arch = r.i32();
  k.max_arch = r.i32();
  k.features = r.str();
  k.priority = r.i32() % 8;
  k.specificity = r.i32();
  k.source = r.str();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> storage;
  storage.reserve(64);  // c_str() pointers must stay valid
  Reader r{data, size, &storage};
  kiln_plugin plugin{};
  const uint8_t version = r.byte();
  plugin.abi_version = version % 4 == 0 ? r.byte() : version % 4 == 1 ? 1u : KILN_PLUGIN_ABI_VERSION;
  plugin.name = r.str();
  std::vector<kiln_plugin_kernel> kernels(plugin.abi_version == 1 ? r.byte() % 4 : 0);
  std::vector<kiln_plugin_kernel_v2> kernels_v2(plugin.abi_version == 2 ? r.byte() % 4 : 0);
  for (auto& k : kernels_v2) {
    read_common_fields(r, k);
    k.signatures = r.str();
    k.name_expression = r.str();
    const uint8_t callbacks = r.byte();
    k.accepts = callbacks & 1 ? nullptr : (callbacks & 2 ? accepts_all : refuses);
    k.launch = callbacks & 4 ? nullptr : launch;
    k.specialize = callbacks & 8 ? nullptr : specialize;
  }
  for (auto& k : kernels) {
    read_common_fields(r, k);
    k.name_expression = r.str();
    const uint8_t callbacks = r.byte();
    k.accepts = callbacks & 1 ? nullptr : (callbacks & 2 ? accepts_all : refuses);
    k.launch_shape = callbacks & 4 ? nullptr : shape;
  }
  plugin.num_kernels = static_cast<uint32_t>(kernels.size() + kernels_v2.size());
  const bool null_kernels = r.byte() % 7 == 0;
  plugin.kernels = null_kernels || kernels.empty() ? nullptr : kernels.data();
  plugin.kernels_v2 = null_kernels || kernels_v2.empty() ? nullptr : kernels_v2.data();
  kiln::Registry registry;
  try {
    kiln::detail::register_plugin("fuzz.so", &plugin, registry);
  } catch (const kiln::Error&) {
    if (!registry.kernels().empty()) __builtin_trap();  // all or nothing
    return 0;
  }
  for (const auto& op : kiln::operator_names()) {
    kiln::Signature sig(kiln::operator_from_name(op));
    registry.explain(sig, kiln::platform_for_target("sm_90a"));
  }
  for (const auto& spec : registry.kernels()) {  // specializations of version 2 kernels, checked
    try {
      spec->specialize(kiln::Signature(kiln::operator_from_name("mha_prefill")), kiln::platform_for_target("sm_90a"));
    } catch (const kiln::Error&) {
    }
  }
  return 0;
}
