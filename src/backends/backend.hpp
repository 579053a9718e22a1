// The seam between kiln and a GPU vendor. Everything above src/backends/ talks to a GPU through
// this table of operations and never names a vendor API; cuda/ and hip/ each fill it in and
// register themselves (KILN_REGISTER_BACKEND). The registry of backends only loops over them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/compile_request.hpp"
#include "kiln/jit.hpp"
#include "kiln/platform.hpp"
#include "kiln/registry.hpp"
#include "kiln/scratch.hpp"
#include "kiln/tensor.hpp"

namespace kiln::detail {

// A kernel loaded into a launch scope. `state` belongs to the backend (CUDA keeps the function's
// shared-memory opt-in there); it lives from load() to unload().
struct DeviceFunction {
  void* module = nullptr;
  void* function = nullptr;
  void* state = nullptr;
};

// A device made current for one call. `key` names the scope a loaded function belongs to (a CUDA
// context, an AMD device): functions are loaded once per key. The rest is the backend's.
struct LaunchScope {
  const void* key = nullptr;
  const Platform* platform = nullptr;
  int device = 0;
  void* context = nullptr;
  bool entered = false;
};

// Remembers a compiler identity across processes: called with a fingerprint of the compiler's
// files (nullopt: none can be taken) and the function that computes the identity; returns the
// identity, computing it only when nothing is remembered. The JIT layer backs it with the cache.
using IdentityMemo = std::function<std::string(const std::optional<std::string>& fingerprint, const std::function<std::string()>& compute)>;

class VendorBackend {
 public:
  virtual ~VendorBackend() = default;

  // ---- what it is
  virtual Backend kind() const = 0;      // the registry's tag for the kernels it runs
  virtual Vendor vendor() const = 0;     // the platforms it detects and compiles for
  virtual const char* name() const = 0;  // "cuda", "hip": cache rows and messages

  // ---- devices
  // Number of its GPUs; throws kiln::Error(kDriverError) saying why there are none usable.
  virtual int device_count() = 0;
  // Adds its GPUs to `report`, or notes why there are none. Never throws.
  virtual void detect(DeviceReport& report) = 0;
  // Platform of GPU `index` (detected once). Throws kiln::Error.
  virtual const Platform& device_platform(int index) = 0;
  // The driver's or runtime's version number (CUDA 13.0: 13000), for reports. Throws.
  virtual int runtime_version() = 0;
  // Free and total bytes of device `index`'s memory. Throws.
  virtual std::pair<size_t, size_t> memory_info(int index) = 0;

  // ---- compile
  // The compiler that builds a target of this vendor under `settings`. Throws kUnsupported
  // saying why none can.
  virtual CompilerKind compiler_for(const Platform& platform, const JitSettings& settings) = 0;
  virtual bool uses(CompilerKind compiler) const = 0;
  // Options every compile by `compiler` takes (they are part of the key like any other).
  virtual std::vector<std::string> base_options(CompilerKind compiler) const = 0;
  // The identity a key records for `compiler`: computed once per process, through `memo`.
  virtual std::string compiler_identity(CompilerKind compiler, const IdentityMemo& memo) = 0;
  // Whether kiln's compile worker process can run this backend's compiles (built-in backends);
  // a plugin's compiler runs in the calling process.
  virtual bool compiles_in_worker() const { return true; }
  // Runs the request's compiler in this process (an offline compiler as a child process under
  // `timeout_seconds`). Throws kiln::Error(kCompileFailed) with the log.
  virtual CompileResult compile(const CompileRequest& request, double timeout_seconds) = 0;
  // Why `binary` cannot be this vendor's binary for `target` (not an ELF of its machine, or built
  // for another target), or nullopt. Checked on every binary a compiler returns or a cache serves.
  virtual std::optional<std::string> binary_problem(const std::string& target, const std::vector<uint8_t>& binary) const = 0;
  // The lines of a successful compile's log that report code the compiler made slower than the
  // source asks for (ptxas's "Potential Performance Loss": serialized wgmmas and the like). kiln
  // logs each as a warning: such a kernel runs correctly, but not at the speed it was written for.
  virtual std::vector<std::string> compile_advisories(const std::string& /*log*/) const { return {}; }
  // Its compilers, what they build of `targets` here, or why not (`kiln devices`).
  virtual void report_compilers(const std::vector<std::string>& targets, const IdentityMemo& memo, std::vector<CompilerReport>& out) = 0;

  // ---- launch
  // Makes device `index` current for the caller until leave() (CUDA: the caller's context when
  // it belongs to that device, else the primary one). Throws kiln::Error.
  virtual LaunchScope enter(int device) = 0;
  virtual void leave(LaunchScope& scope) noexcept = 0;
  virtual DeviceFunction load(const LaunchScope& scope, const std::vector<uint8_t>& binary, const std::string& lowered_name,
                              const std::string& kernel_name) = 0;
  virtual void unload(const DeviceFunction& function) noexcept = 0;
  // Encodes a TMA descriptor into the 128 bytes at `slot`; kUnsupported where the vendor has none.
  virtual void encode_tensor_map(const TensorMapRequest& map, void* slot, const std::string& kernel_name) = 0;
  // Launches with one parameter block (`params_bytes` long) passed by value, with what `shape`
  // asks for (dynamic shared memory, clusters, cooperative, programmatic dependent launch);
  // kUnsupported for what the vendor lacks.
  virtual void launch(const LaunchScope& scope, const DeviceFunction& function, const LaunchShape& shape, const void* params,
                      size_t params_bytes, Stream stream, const std::string& kernel_name) = 0;

  // ---- memory and time
  // Device memory ordered on `stream` (from the device's default pool, freed on the stream):
  // capturable in a CUDA graph. kiln's scratch when the engine registers no ScratchAllocator.
  virtual void* stream_alloc(const LaunchScope& scope, size_t bytes, Stream stream) = 0;
  virtual void stream_free(void* pointer, Stream stream) noexcept = 0;
  virtual void fill_async(void* pointer, uint8_t value, size_t bytes, Stream stream) = 0;
  // Whether `stream` is capturing a graph: then nothing may compile, load or synchronize.
  virtual bool stream_capturing(Stream stream) = 0;
  // Plain device memory of the current device, for tools and tests.
  virtual void* device_alloc(size_t bytes) = 0;
  virtual void device_free(void* pointer) noexcept = 0;
  virtual void memset(void* device_pointer, uint8_t value, size_t bytes) = 0;
  // Copies ordered on `stream`; a copy to host memory is complete when synchronize() returns.
  virtual void copy_to_host(void* host, const void* device_pointer, size_t bytes, Stream stream) = 0;
  virtual void copy_to_device(void* device_pointer, const void* host, size_t bytes, Stream stream) = 0;
  virtual void synchronize(Stream stream) = 0;
  // Waits for all work on the current device.
  virtual void synchronize_device() = 0;
  // Timing events on `stream`.
  virtual void* event_create() = 0;
  virtual void event_destroy(void* event) noexcept = 0;
  virtual void event_record(void* event, Stream stream) = 0;
  virtual void event_synchronize(void* event) = 0;
  virtual float event_elapsed_ms(void* start, void* stop) = 0;
};

// Every registered backend, in the order kiln prefers them (CUDA first, backend plugins last),
// after the plugins on KILN_PLUGIN_PATH are loaded.
std::vector<VendorBackend*> backends();
// The backend for a vendor, a kernel's tag, or a compiler. Throws kiln::Error(kInternal) when
// none is registered (a build without it).
VendorBackend& backend_for(Vendor vendor);
VendorBackend& backend_for(Backend kind);
VendorBackend& backend_for(CompilerKind compiler);
// The backend whose GPUs this process launches on: the first that reports a GPU (decided once).
// Throws kiln::Error(kDriverError) with every backend's reason when none does.
VendorBackend& launch_backend();

// Static registration: KILN_REGISTER_BACKEND(CudaBackend, 0); lower `order` is preferred.
struct BackendRegistrar {
  BackendRegistrar(VendorBackend* backend, int order);
};
// A backend plugin's backend (backends/plugin_backend.cpp), after every built-in one; lives until
// the process exits.
void register_plugin_backend(VendorBackend* backend);
// The backend object has static storage: it lives until the process exits, nothing to free.
#define KILN_REGISTER_BACKEND(Type, order)  \
  static Type kiln_backend_instance_##Type; \
  static const ::kiln::detail::BackendRegistrar kiln_backend_registrar_##Type { &kiln_backend_instance_##Type, order }

// Enters a device on construction and leaves it on destruction.
class ScopedLaunch {
 public:
  ScopedLaunch(VendorBackend& backend, int device) : backend_(backend), scope_(backend.enter(device)) {}
  ~ScopedLaunch() { backend_.leave(scope_); }
  ScopedLaunch(const ScopedLaunch&) = delete;
  ScopedLaunch& operator=(const ScopedLaunch&) = delete;
  const LaunchScope& get() const { return scope_; }

 private:
  VendorBackend& backend_;
  LaunchScope scope_;
};

// Scratch for one launch, freed on its stream when the scope ends (after the launch is enqueued).
// A kernel's workspace for one launch: from the engine's ScratchAllocator when one is registered
// (kiln/scratch.hpp), else from the backend's stream-ordered pool; its first `zeroed_bytes` cleared
// on the stream (KILN_POISON_WORKSPACE=1 fills the rest with 0xFF); released on the stream when
// the scope ends, after the launch is enqueued.
class ScopedScratch {
 public:
  ScopedScratch(VendorBackend& backend, const LaunchScope& scope, size_t bytes, size_t zeroed_bytes, Stream stream);
  ~ScopedScratch();
  ScopedScratch(const ScopedScratch&) = delete;
  ScopedScratch& operator=(const ScopedScratch&) = delete;
  void* pointer() const { return pointer_; }

 private:
  void release() noexcept;
  VendorBackend& backend_;
  ScratchAllocator allocator_;
  int device_;
  size_t bytes_;
  Stream stream_;
  void* pointer_ = nullptr;
};

}  // namespace kiln::detail
