#include "kiln/platform.hpp"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "kiln/error.hpp"
#include "platform/vendors.hpp"

namespace kiln {
namespace {

// Typical figures of the flagship part of each target; offline selection and compiles use them
// where no device is present. A detected device replaces them with its own.
struct KnownTarget {
  const char* arch;
  Vendor vendor;
  int arch_version;
  std::vector<std::string> features;
  int multiprocessors;
  size_t shared_memory_per_block;
  size_t l2_bytes;
  int warp_size;
};

// What differs between vendors in naming targets and devices, as data. Backend plugins add
// vendors of their own (detail::add_vendor), numbered from kFirstPluginVendor.
struct VendorTraits {
  Vendor vendor;
  std::string name;
  std::string multiprocessors;  // what its multiprocessors are called
  bool target_flags;            // whether a target may carry ":feature+" flags
  std::string compiler;         // a plugin vendor's compiler; built-in ones name theirs in src/backends
};

struct Vendors {
  std::mutex mutex;
  std::deque<VendorTraits> list{{Vendor::kNvidia, "nvidia", "SMs", false, ""}, {Vendor::kAmd, "amd", "CUs", true, ""}};
  std::vector<Platform> plugin_targets;
};
Vendors& vendors() {
  static Vendors v;
  return v;
}

std::atomic<void (*)()> plugin_loader{nullptr};

void load_plugins() {
  if (auto load = plugin_loader.load()) load();
}

// Entries are never removed and a deque never moves them: references stay valid.
const VendorTraits& traits(Vendor vendor) {
  Vendors& v = vendors();
  std::lock_guard<std::mutex> lock(v.mutex);
  for (const auto& t : v.list) {
    if (t.vendor == vendor) return t;
  }
  throw Error(ErrorCode::kInternal, fmt::format("unknown vendor {}", static_cast<int>(vendor)));
}

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

const std::vector<KnownTarget>& table() {
  static const std::vector<KnownTarget> targets = {
      {"sm_80", Vendor::kNvidia, 80, {"mma:mma_sync", "memory:cp_async", "tensor_core:bf16"}, 108, 163 * kKiB, 40 * kMiB, 32},
      {"sm_86", Vendor::kNvidia, 86, {"mma:mma_sync", "memory:cp_async", "tensor_core:bf16"}, 84, 99 * kKiB, 6 * kMiB, 32},
      {"sm_89",
       Vendor::kNvidia,
       89,
       {"mma:mma_sync", "memory:cp_async", "tensor_core:bf16", "tensor_core:fp8"},
       128,
       99 * kKiB,
       72 * kMiB,
       32},
      // sm_90 without the 'a' suffix: no wgmma / setmaxnreg.
      {"sm_90",
       Vendor::kNvidia,
       90,
       {"mma:mma_sync", "memory:cp_async", "memory:tma", "launch:cluster", "tensor_core:bf16", "tensor_core:fp8"},
       132,
       227 * kKiB,
       50 * kMiB,
       32},
      {"sm_90a",
       Vendor::kNvidia,
       90,
       {"mma:mma_sync", "mma:wgmma", "memory:cp_async", "memory:tma", "launch:cluster", "tensor_core:bf16", "tensor_core:fp8",
        "reg:setmaxnreg"},
       132,
       227 * kKiB,
       50 * kMiB,
       32},
      {"sm_100a",
       Vendor::kNvidia,
       100,
       {"mma:mma_sync", "mma:tcgen05", "memory:cp_async", "memory:tma", "launch:cluster", "tensor_core:bf16", "tensor_core:fp8",
        "tensor_core:fp4", "reg:setmaxnreg"},
       148,
       227 * kKiB,
       126 * kMiB,
       32},
      {"sm_120a",
       Vendor::kNvidia,
       120,
       {"mma:mma_sync", "memory:cp_async", "memory:tma", "launch:cluster", "tensor_core:bf16", "tensor_core:fp8", "tensor_core:fp4"},
       188,
       99 * kKiB,
       128 * kMiB,
       32},
      {"gfx90a", Vendor::kAmd, 910, {"mma:mfma", "tensor_core:bf16"}, 104, 64 * kKiB, 8 * kMiB, 64},
      {"gfx942", Vendor::kAmd, 942, {"mma:mfma", "tensor_core:bf16", "tensor_core:fp8"}, 304, 64 * kKiB, 4 * kMiB, 64},
      {"gfx950",
       Vendor::kAmd,
       950,
       {"mma:mfma", "mma:mfma_f8f6f4", "tensor_core:bf16", "tensor_core:fp8", "tensor_core:fp4"},
       256,
       160 * kKiB,
       4 * kMiB,
       64},
  };
  return targets;
}

}  // namespace

const char* vendor_name(Vendor vendor) { return traits(vendor).name.c_str(); }

namespace detail {

Vendor add_vendor(const std::string& name, const std::string& compute_unit_name, const std::string& compiler_name) {
  Vendors& v = vendors();
  std::lock_guard<std::mutex> lock(v.mutex);
  for (const auto& t : v.list) {
    if (t.name == name) throw Error(ErrorCode::kInvalidArgument, fmt::format("vendor name '{}' is already taken", name));
  }
  const auto id = static_cast<Vendor>(kFirstPluginVendor + static_cast<int>(v.list.size()) - 2);
  v.list.push_back({id, name, compute_unit_name.empty() ? "compute units" : compute_unit_name, false, compiler_name});
  return id;
}

std::optional<Vendor> vendor_named(const std::string& name) {
  Vendors& v = vendors();
  std::lock_guard<std::mutex> lock(v.mutex);
  for (const auto& t : v.list) {
    if (t.name == name) return t.vendor;
  }
  return std::nullopt;
}

void set_plugin_loader(void (*load)()) { plugin_loader.store(load); }

bool is_plugin_vendor(Vendor vendor) { return static_cast<int>(vendor) >= kFirstPluginVendor; }

const char* plugin_compiler_name(Vendor vendor) { return traits(vendor).compiler.c_str(); }

void add_target(const Platform& target) {
  for (const auto& t : table()) {
    if (t.arch == target.arch) throw Error(ErrorCode::kInvalidArgument, fmt::format("target '{}' is already kiln's", target.arch));
  }
  Vendors& v = vendors();
  std::lock_guard<std::mutex> lock(v.mutex);
  for (const auto& t : v.plugin_targets) {
    if (t.arch == target.arch) throw Error(ErrorCode::kInvalidArgument, fmt::format("target '{}' is already taken", target.arch));
  }
  v.plugin_targets.push_back(target);
}

}  // namespace detail

bool Platform::has_feature(const std::string& feature) const {
  return std::find(features.begin(), features.end(), feature) != features.end();
}

std::string Platform::describe() const {
  return fmt::format("{} {} ({}; {} {}, {} KiB shared memory per block, {} MiB L2, warp {})", vendor_name(vendor), arch,
                     detected ? device_name : "described, not detected", multiprocessor_count, traits(vendor).multiprocessors,
                     shared_memory_per_block / kKiB, l2_bytes / kMiB, warp_size);
}

std::vector<std::string> known_targets() {
  load_plugins();
  std::vector<std::string> names;
  for (const auto& t : table()) names.emplace_back(t.arch);
  Vendors& v = vendors();
  std::lock_guard<std::mutex> lock(v.mutex);
  for (const auto& t : v.plugin_targets) names.push_back(t.arch);
  return names;
}

Platform platform_for_target(const std::string& arch) {
  // AMD targets may carry feature flags: "gfx950:sramecc+:xnack-". The base name selects the
  // entry; the full string stays the compile target (and so part of the key).
  const std::string base = arch.substr(0, arch.find(':'));
  for (const auto& t : table()) {
    if (base != t.arch) continue;
    if (base != arch && !traits(t.vendor).target_flags) break;  // "sm_90a:foo" is not a target
    Platform p;
    p.vendor = t.vendor;
    p.arch = arch;
    p.arch_version = t.arch_version;
    p.features = t.features;
    p.multiprocessor_count = t.multiprocessors;
    p.shared_memory_per_block = t.shared_memory_per_block;
    p.l2_bytes = t.l2_bytes;
    p.warp_size = t.warp_size;
    p.device_name = "(target " + arch + ")";
    return p;
  }
  load_plugins();
  {
    Vendors& v = vendors();
    std::lock_guard<std::mutex> lock(v.mutex);
    for (const auto& t : v.plugin_targets) {
      if (t.arch == arch) return t;
    }
  }
  throw Error(ErrorCode::kInvalidArgument, fmt::format("target: unknown arch '{}' (known: {})", arch, fmt::join(known_targets(), ", ")));
}

}  // namespace kiln
