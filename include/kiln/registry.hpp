// For kernel authors: kernels as data (KernelSpec), the registry that holds them and the selector
// that picks one. Engine users need none of it: they include kiln/kiln.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/platform.hpp"
#include "kiln/signature.hpp"

namespace kiln {

enum class Priority : int {
  kReference = 0,    // obviously correct; the oracle
  kPortable = 1,     // runs on every GPU of its vendor
  kPerformant = 2,   // fast on a class of GPUs
  kSpecialized = 3,  // fastest on a narrow set of shapes
  kPlugin = 4,       // out-of-tree kernels win ties with everything in-tree
};
const char* priority_name(Priority p);

enum class Backend { kCuda, kHip };
const char* backend_name(Backend b);

struct Requirements {
  Vendor vendor = Vendor::kNvidia;
  int min_arch = 0;        // inclusive, compared with Platform::arch_version
  int max_arch = 1 << 30;  // inclusive
  std::vector<std::string> features;
};

// How one signature is compiled: the template instantiation and the options that go into the
// key. Launch geometry depends on run-time sizes and is computed by the operator layer.
struct Specialization {
  std::string name_expression;       // "kiln::prefill_reference<__nv_bfloat16, 128>"
  std::vector<std::string> options;  // extra compiler options, e.g. "-DKILN_FOO=1"
};

// Launch geometry of one call, computed from the operator's parameter block at call time.
struct LaunchShape {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t dynamic_shared_bytes = 0;
  uint32_t cluster[3] = {0, 0, 0};  // {0,0,0}: no cluster; else a 0 dimension counts as 1
  bool has_cluster() const { return cluster[0] != 0 || cluster[1] != 0 || cluster[2] != 0; }
  uint32_t cluster_dim(int i) const { return cluster[i] != 0 ? cluster[i] : 1; }
  bool programmatic_dependent_launch = false;
  // Every CTA resident at once (cuLaunchKernelEx with the cooperative attribute; the launch fails
  // rather than deadlock when they do not fit), for kernels with grid-wide barriers.
  bool cooperative = false;
};

// A TMA tensor map (NVIDIA, sm_90+) that kiln encodes into the parameter block just before the
// launch, once the workspace is set, for kernels whose copies go through the tensor memory
// accelerator. The tensor holds 16-bit elements; copies land in shared memory in the 128-byte
// swizzle, and box elements past the tensor's extent arrive as zeros.
struct TensorMapRequest {
  size_t params_offset = 0;      // of the map's 128-byte slot, 64-byte aligned, in the parameter block
  const void* base = nullptr;    // 16-byte aligned
  uint32_t rank = 2;             // 2 or 3
  uint64_t dims[3] = {1, 1, 1};  // elements, innermost first
  uint64_t strides[2] = {0, 0};  // bytes from one index of dims 1 and 2 to the next (multiples of 16)
  uint32_t box[3] = {1, 1, 1};   // elements per copy, innermost first: box[0] = 64 (128 bytes)
  bool swizzle_128b = true;      // the copies land in 128-byte swizzle, else as they are (16-bit elements either way)

  // A map of dims.size() dimensions (2 or 3): dims and box innermost first, strides for dims 1 on.
  static TensorMapRequest of(size_t params_offset, const void* base, std::initializer_list<uint64_t> dims,
                             std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box) {
    TensorMapRequest m;
    m.params_offset = params_offset;
    m.base = base;
    m.rank = static_cast<uint32_t>(std::min<size_t>(dims.size(), 3));
    std::copy_n(dims.begin(), m.rank, m.dims);
    std::copy_n(strides.begin(), std::min<size_t>(strides.size(), 2), m.strides);
    std::copy_n(box.begin(), std::min<size_t>(box.size(), 3), m.box);
    return m;
  }
};

struct KernelSpec {
  std::string name;  // unique: "attention.prefill.reference"
  std::string family;
  std::string mode;
  Backend backend = Backend::kCuda;
  Priority priority = Priority::kReference;
  Requirements requirements;
  // Kernel source: a path under kernel-sources/ ("attention/prefill_reference.cuh"), or, for
  // plugins, the source text itself with source_is_text set.
  std::string source;
  bool source_is_text = false;
  // Number of signature properties this kernel constrains; breaks ties within a priority band
  // in favour of the narrower kernel.
  int specificity = 0;
  // nullopt when the kernel runs the signature, else the reason it does not.
  std::function<std::optional<std::string>(const Signature&)> accepts;
  std::function<Specialization(const Signature&, const Platform&)> specialize;
  // `params` points at the operator's parameter block (kernel-sources/<family>/params.h).
  // Throws kiln::Error(kUnsupported) when the call does not fit the platform (shared memory).
  std::function<LaunchShape(const void* params, const Platform&)> launch_shape;
  // Optional: bytes of device scratch the kernel needs for this call, zero-filled (but see
  // workspace_zeroed_bytes). kiln allocates it on the call's stream before the launch
  // (stream-ordered, from the device's memory pool: cuMemAllocAsync or hipMallocAsync), hands it
  // to the kernel in the parameter block's `workspace` field and frees it on the same stream after
  // the launch. Operators whose parameter block has no such field never select a kernel that sets
  // this.
  std::function<size_t(const void* params, const Platform&)> workspace_bytes;
  // Optional, with workspace_bytes: how many leading bytes of the workspace must be zero when the
  // kernel starts (the rest is left as the pool hands it over); all of them when unset. A kernel
  // that writes its scratch before reading it clears only its counters this way, not the whole
  // allocation (755 MB for the MoE kernel at 8192 tokens).
  std::function<size_t(const void* params, const Platform&)> workspace_zeroed_bytes;
  // Optional, NVIDIA only: the tensor maps to encode into this call's parameter block (after the
  // workspace is set, so maps may point into it); none when the call takes a path without them.
  std::function<std::vector<TensorMapRequest>(const void* params, const Platform&)> tensor_maps;
  std::string origin = "builtin";  // "builtin" or the plugin file it came from
};

// Why a candidate was or was not chosen.
struct CandidateVerdict {
  std::string kernel;
  Priority priority;
  bool eligible = false;  // passed platform and signature checks
  bool selected = false;
  std::string reason;  // why it was rejected, or why it lost / won
};

struct Explanation {
  std::string signature;
  std::string target;
  std::optional<std::string> selected;
  std::vector<CandidateVerdict> candidates;
  std::vector<std::string> warnings;  // e.g. equal-priority conflicts
  std::string to_text() const;
  std::string to_json() const;
};

// The process-wide registry. Thread-safe: registration and selection may run concurrently.
class Registry {
 public:
  static Registry& global();

  // Throws kiln::Error(kInvalidArgument) if a kernel of the same name exists or the spec is
  // incomplete.
  void add(KernelSpec spec);
  std::vector<std::shared_ptr<const KernelSpec>> kernels() const;
  std::shared_ptr<const KernelSpec> find(const std::string& name) const;

  // Chooses the kernel for a signature on a platform. Decisions are cached per
  // (platform, signature) until the registry or the overrides change.
  // Throws kiln::Error(kNoKernel) with the full explanation when nothing qualifies, or when an
  // override names a kernel that cannot run the call.
  std::shared_ptr<const KernelSpec> select(const Signature& sig, const Platform& platform);
  Explanation explain(const Signature& sig, const Platform& platform) const;

  // Force a kernel by name for one operator (empty name clears). Checked at select time.
  // KILN_OVERRIDE_<FAMILY>_<MODE> (e.g. KILN_OVERRIDE_ATTENTION_PREFILL) does the same.
  void set_override(const OperatorId& op, const std::string& kernel_name);

  // Plugin kernels outrank built-in ones only when this is on (KILN_PLUGINS_OUTRANK=1 sets it for
  // the process; this call takes precedence): otherwise a built-in kernel that can run a call
  // wins over any plugin kernel, whatever priority the plugin declares.
  void set_plugins_outrank_builtins(bool outrank);
  bool plugins_outrank_builtins() const;

  // Bumped by every add() and set_override(); holders of a decision compare it to know theirs is
  // still current.
  uint64_t generation() const;

  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Static in-tree registration: KILN_REGISTER_KERNEL(unique_id) { return KernelSpec{...}; }
namespace detail {
struct KernelRegistrar {
  explicit KernelRegistrar(KernelSpec (*make)());
};
}  // namespace detail
#define KILN_REGISTER_KERNEL(id)                                                            \
  static ::kiln::KernelSpec kiln_make_kernel_##id();                                        \
  static const ::kiln::detail::KernelRegistrar kiln_registrar_##id{&kiln_make_kernel_##id}; \
  static ::kiln::KernelSpec kiln_make_kernel_##id()

// Loads every plugin on KILN_PLUGIN_PATH (colon-separated directories or files); called once,
// lazily, by Registry::global(). Returns the messages of plugins that were refused.
std::vector<std::string> load_plugins_from_env();
// Loads one plugin shared library; throws kiln::Error(kPluginError) with the reason.
void load_plugin(const std::string& path);

}  // namespace kiln
