#include "jit/pipeline.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include <xxhash.h>

#include "backends/backend.hpp"
#include "cache/kernel_cache.hpp"
#include "cache/key_lock.hpp"
#include "cache/remote_tier.hpp"
#include "jit/compiler.hpp"
#include "jit/operator_call.hpp"
#include "jit/sources.hpp"
#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/log.hpp"

namespace kiln::detail {
namespace {

struct CompileTable {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const CompiledBinary>>> entries;
};
CompileTable& compile_table() {
  static CompileTable t;
  return t;
}

std::atomic<MissObserver> miss_observer{nullptr};

// The in-process hit path: one loaded kernel per (launch scope, call key), valid while the
// registry generation it was selected under is current. The scope is what the backend says a
// function is loaded into (a CUDA context, an AMD device).
struct LoadedKey {
  const void* scope;
  CallKey call;
  bool operator==(const LoadedKey&) const = default;
};
struct LoadedKeyHash {
  size_t operator()(const LoadedKey& k) const {
    return static_cast<size_t>(XXH3_64bits_withSeed(k.call.fields.data(), sizeof(k.call.fields),
                                                    reinterpret_cast<uintptr_t>(k.scope) ^ reinterpret_cast<uintptr_t>(k.call.op)));
  }
};
struct LoadedKernel {
  std::shared_ptr<const KernelSpec> spec;
  VendorBackend* backend = nullptr;
  DeviceFunction function;
  uint64_t registry_generation = 0;

  bool loaded() const { return function.function != nullptr; }
};
struct LoadedTable {
  std::shared_mutex mutex;
  std::unordered_map<LoadedKey, std::shared_ptr<const LoadedKernel>, LoadedKeyHash> entries;
  // Kernels a registry change replaced: never unloaded, since a launch of theirs may still run.
  std::vector<std::shared_ptr<const LoadedKernel>> retired;
};
// Loaded kernels live as long as the process: never destroyed, so no exit handler unloads a
// module from a driver that may be gone already.
LoadedTable& loaded_table() {
  static auto* t = new LoadedTable();
  return *t;
}

// The miss path: select, specialize, compile (or reuse the binary), load into the scope.
std::shared_ptr<const LoadedKernel> load_kernel(const OperatorCall& call, VendorBackend& backend, const LaunchScope& scope) {
  const Signature sig = call.make_signature(call.args);
  if (const MissObserver observe = miss_observer.load(std::memory_order_acquire)) observe(sig);
  const Platform& platform = *scope.platform;
  auto loaded = std::make_shared<LoadedKernel>();
  loaded->registry_generation = Registry::global().generation();
  loaded->spec = Registry::global().select(sig, platform);
  loaded->backend = &backend;
  auto load = [&](const CompiledBinary& b) {
    loaded->function = backend.load(scope, b.result.binary, b.result.lowered_name, loaded->spec->name);
  };
  // The first load doubles as the check that decides whether a binary is published (or, from
  // the cache, kept).
  const auto binary = get_or_compile(build_request(*loaded->spec, sig, platform), load);
  if (!loaded->loaded()) load(*binary);
  LoadedTable& table = loaded_table();
  std::unique_lock lock(table.mutex);
  auto& slot = table.entries[LoadedKey{scope.key, call.key}];
  if (slot && slot->registry_generation == loaded->registry_generation) {
    backend.unload(loaded->function);  // a racing thread loaded it first
    return slot;
  }
  if (slot) table.retired.push_back(std::move(slot));
  slot = loaded;
  return loaded;
}

std::shared_ptr<const LoadedKernel> find_loaded(const OperatorCall& call, VendorBackend& backend, const LaunchScope& scope) {
  LoadedTable& table = loaded_table();
  std::shared_ptr<const LoadedKernel> kernel;
  {
    std::shared_lock lock(table.mutex);
    auto it = table.entries.find(LoadedKey{scope.key, call.key});
    if (it != table.entries.end()) kernel = it->second;
  }
  if (!kernel || kernel->registry_generation != Registry::global().generation()) {
    if (backend.stream_capturing(call.stream)) {
      const Signature sig = call.make_signature(call.args);
      throw Error(ErrorCode::kGraphCapture,
                  fmt::format("{}: the stream is capturing a graph, and no kernel is loaded in this process for signature '{}' on "
                              "device {}; selecting, compiling and loading one cannot be captured. Run this call once before "
                              "capture (eagerly, or under kiln::PrepareOnly / kiln.prepare_only())",
                              operator_name(sig.op()), sig.canonical(), scope.device));
    }
    kernel = load_kernel(call, backend, scope);
  }
  return kernel;
}

thread_local int prepare_only_depth = 0;
thread_local size_t* workspace_query = nullptr;  // WorkspaceQuery

}  // namespace

void set_miss_observer(MissObserver observer) { miss_observer.store(observer, std::memory_order_release); }

CompileRequest build_request(const KernelSpec& spec, const Signature& sig, const Platform& platform) {
  VendorBackend& backend = backend_for(platform.vendor);
  if (spec.backend != backend.kind()) {
    throw Error(ErrorCode::kUnsupported, fmt::format("kernel '{}' is a {} kernel; target {} needs a {} one", spec.name,
                                                     backend_name(spec.backend), platform.arch, backend_name(backend.kind())));
  }
  const Specialization s = spec.specialize(sig, platform);
  CompileRequest r;
  r.compiler = backend.compiler_for(platform, jit_settings());
  r.kernel_name = spec.name;
  r.target = platform.arch;
  r.name_expression = s.name_expression;
  r.options = backend.base_options(r.compiler);
  r.options.insert(r.options.end(), s.options.begin(), s.options.end());
  // Built-in kernels are headers of templates: the program includes the header and NVRTC
  // instantiates the name expression. Plugin kernels bring their whole program as text.
  r.source_name = spec.name + ".cu";  // never a header's name: NVRTC would see a self-include
  SourceSet sources = spec.source_is_text ? resolve_includes(r.source_name, spec.source)
                                          : resolve_includes(r.source_name, fmt::format("#include \"{}\"\n", spec.source));
  r.source = std::move(sources.main_text);
  r.headers = std::move(sources.headers);
  r.op = operator_name(sig.op());
  r.signature = sig.canonical();
  return r;
}

namespace {

// A binary from a cache row, loaded once by `check` when one is given. Null, with `refuse` told
// why, when the row holds no binary for the target or the binary does not load.
std::shared_ptr<CompiledBinary> binary_from_row(CacheRow&& row, const CompileRequest& request, const std::string& identity,
                                                const char* origin, const BinaryCheck& check,
                                                const std::function<void(const std::string&)>& refuse) {
  // A row with a good checksum can still hold something that is no binary for this target (a
  // bundle written by another program): refused before anything loads it.
  if (auto why = backend_for(request.compiler).binary_problem(request.target, row.binary)) {
    refuse("it is no binary for " + request.target + ": " + *why);
    return nullptr;
  }
  auto binary = std::make_shared<CompiledBinary>();
  binary->key = row.key;
  binary->compiler = identity;
  binary->result.binary = std::move(row.binary);
  binary->result.lowered_name = std::move(row.entry);
  binary->result.compile_ms = row.compile_ms;
  binary->origin = origin;
  binary->stored = true;
  if (check) {
    try {
      check(*binary);
    } catch (const Error& e) {
      refuse(std::string("it does not load: ") + e.message());
      return nullptr;
    }
  }
  return binary;
}

std::shared_ptr<const CompiledBinary> from_cache(KernelCache& cache, const CompileRequest& request, const KernelKey& key,
                                                 const std::string& identity, const BinaryCheck& check) {
  auto found = cache.lookup(key, request.target, identity);
  if (!found) return nullptr;
  const bool disk = found->tier == KernelCache::Tier::kDisk;
  auto binary = binary_from_row(std::move(found->row), request, identity, disk ? "disk" : "seed", check, [&](const std::string& why) {
    if (disk) cache.drop(key, why);
  });
  if (binary) (disk ? cache.counters().disk_hits : cache.counters().seed_hits)++;
  return binary;
}

// The fleet tier: a verified entry that loads is also written to the local database, so this
// host serves it from disk next time.
std::shared_ptr<const CompiledBinary> from_remote(RemoteTier& remote, KernelCache& cache, const CompileRequest& request,
                                                  const KernelKey& key, const std::string& identity, const BinaryCheck& check) {
  auto row = remote.fetch(key, request.target, identity);
  if (!row) return nullptr;
  const CacheRow local = *row;
  auto binary =
      binary_from_row(std::move(*row), request, identity, "remote", check, [&](const std::string& why) { remote.refuse(key, why); });
  if (!binary) return nullptr;
  remote.counters().hits++;
  binary->stored = cache.publish(local);
  return binary;
}

// Fleet-wide single flight: the node that takes the key's lease compiles it; the others wait for
// its entry. A holder that dies stops renewing its lease, which lapses, and a waiter takes over;
// a wait longer than the bound, or a remote that fails, ends in a compile here. Returns another
// node's binary, or null when this process compiles (holding the lease when it took one).
std::shared_ptr<const CompiledBinary> fetch_or_lease(RemoteTier& remote, KernelCache& cache, const CompileRequest& request,
                                                     const KernelKey& key, const std::string& identity, const BinaryCheck& check,
                                                     bool* leased) {
  if (auto hit = from_remote(remote, cache, request, key, identity, check)) return hit;
  remote.counters().misses++;
  const auto deadline = std::chrono::steady_clock::now() + remote.settings().wait;
  bool waited = false;
  while (true) {
    const RemoteTier::Lease lease = remote.take_lease(key);
    if (lease == RemoteTier::Lease::kUnavailable) return nullptr;
    if (lease == RemoteTier::Lease::kTaken) {
      *leased = true;
      // The last holder may have published just before it released: look once more.
      if (auto hit = from_remote(remote, cache, request, key, identity, check)) return hit;
      if (waited) remote.counters().lease_takeovers++;
      return nullptr;
    }
    if (!waited) {
      remote.counters().lease_waits++;
      log(LogLevel::kInfo, fmt::format("kiln cache: another node is compiling {} for {} (key {}); waiting for its entry",
                                       request.kernel_name, request.target, key.hex()));
      waited = true;
    }
    while (remote.lease_held(key)) {
      if (std::chrono::steady_clock::now() > deadline) {
        log(LogLevel::kWarn, fmt::format("kiln cache: waited {} s for another node to compile {} for {}; compiling here",
                                         std::chrono::duration_cast<std::chrono::seconds>(remote.settings().wait).count(),
                                         request.kernel_name, request.target));
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (auto hit = from_remote(remote, cache, request, key, identity, check)) return hit;
    }
    if (auto hit = from_remote(remote, cache, request, key, identity, check)) return hit;
  }
}

// Gives a compile lease back if the compile fails before its row is queued for publication.
class LeaseRelease {
 public:
  LeaseRelease(RemoteTier* remote, const KernelKey& key) : remote_(remote), key_(key) {}
  ~LeaseRelease() {
    if (remote_ != nullptr && held) remote_->release_lease(key_);
  }
  LeaseRelease(const LeaseRelease&) = delete;
  LeaseRelease& operator=(const LeaseRelease&) = delete;
  bool held = false;

 private:
  RemoteTier* remote_;
  KernelKey key_;
};

std::shared_ptr<const CompiledBinary> fetch_or_compile(const CompileRequest& request, const KernelKey& key, const std::string& identity,
                                                       const BinaryCheck& check) {
  KernelCache& cache = KernelCache::process();
  if (auto hit = from_cache(cache, request, key, identity, check)) return hit;
  // One compile per key across the host's processes: whoever holds the key's lock compiles;
  // the others wait for it, then find its row.
  const JitSettings settings = jit_settings();
  KeyLock lock(cache.persistent() ? cache.directory() : "", key, settings.timeout_seconds + 30);
  if (lock.waited()) cache.counters().lock_waits++;
  // Whoever held the lock before us may have published between our miss and our lock, whether or
  // not we had to wait for it: look again before compiling.
  if (lock.acquired() || lock.waited()) {
    if (auto hit = from_cache(cache, request, key, identity, check)) return hit;
  }
  RemoteTier* remote = RemoteTier::process();
  LeaseRelease lease(remote, key);
  if (remote != nullptr) {
    if (auto hit = fetch_or_lease(*remote, cache, request, key, identity, check, &lease.held)) return hit;
    remote->counters().compiles++;
  }
  cache.counters().misses++;
  auto binary = std::make_shared<CompiledBinary>();
  binary->key = key;
  binary->compiler = identity;
  binary->result = compile(request, settings);
  cache.counters().compiles++;
  cache.counters().compile_us += static_cast<uint64_t>(binary->result.compile_ms * 1000);
  const VendorBackend& backend = backend_for(request.compiler);
  log(LogLevel::kInfo, fmt::format("compiled {} for {} in {:.0f} ms ({} bytes, key {})", request.kernel_name, request.target,
                                   binary->result.compile_ms, binary->result.binary.size(), key.hex()));
  if (auto why = backend.binary_problem(request.target, binary->result.binary)) {
    throw Error::compile_failed(request.kernel_name, request.target, request.options, "the compiler returned no usable binary: " + *why);
  }
  for (const std::string& advisory : backend.compile_advisories(binary->result.log)) {
    log(LogLevel::kWarn, fmt::format("{} for {} runs slower than written: {}", request.kernel_name, request.target, advisory));
  }
  if (check) check(*binary);  // a binary that does not load is never published
  CacheRow row;
  row.key = key;
  row.kernel = request.kernel_name;
  row.op = request.op;
  row.signature = request.signature;
  row.target = request.target;
  row.backend = backend.name();
  row.compiler = identity;
  row.options = fmt::format("{}", fmt::join(request.options, " "));
  row.entry = binary->result.lowered_name;
  row.binary = binary->result.binary;
  row.compile_ms = binary->result.compile_ms;
  binary->stored = cache.publish(row);
  if (remote != nullptr) {
    remote->publish_later(row);  // gives the lease back once the entry is written
    lease.held = false;
  }
  return binary;
}

}  // namespace

namespace {

// Compiler-free serving (JitSettings::compile false): the binary built for this request by any
// compiler whose rows for this target the cache holds, newest first; never a compile, never a
// compiler library. A miss names the command that would have stored it.
std::shared_ptr<const CompiledBinary> from_cache_without_compiler(const CompileRequest& request, const BinaryCheck& check) {
  KernelCache& cache = KernelCache::process();
  RemoteTier* remote = RemoteTier::process();
  std::vector<std::string> identities = cache.compiler_identities(request.target);
  if (remote != nullptr) {
    for (const std::string& identity : remote->compiler_identities(request.target)) {
      if (std::find(identities.begin(), identities.end(), identity) == identities.end()) identities.push_back(identity);
    }
  }
  for (const std::string& identity : identities) {
    const KernelKey key = compute_key(request, identity);
    {
      CompileTable& table = compile_table();
      std::lock_guard<std::mutex> lock(table.mutex);
      auto it = table.entries.find(key.hex());
      if (it != table.entries.end()) {
        cache.counters().memory_hits++;
        return it->second.get();
      }
    }
    auto hit = from_cache(cache, request, key, identity, check);
    if (!hit && remote != nullptr) hit = from_remote(*remote, cache, request, key, identity, check);
    if (hit) {
      std::promise<std::shared_ptr<const CompiledBinary>> promise;
      promise.set_value(hit);
      CompileTable& table = compile_table();
      std::lock_guard<std::mutex> lock(table.mutex);
      table.entries.emplace(key.hex(), promise.get_future().share());
      return hit;
    }
  }
  cache.counters().misses++;
  if (remote != nullptr) remote->counters().misses++;
  const std::string sig = request.signature.substr(request.signature.find(':') + 1);
  throw Error(ErrorCode::kNoKernel,
              fmt::format("{}: no cached kernel for signature '{}' on {} ({}), and compiling is off (KILN_JIT=off). On a machine "
                          "with the compiler, store it with: kiln{} warmup --op {} --sig '{}' --target {}{}",
                          request.op, request.signature, request.target, request.kernel_name,
                          cache.persistent() ? " --cache '" + cache.directory() + "'" : "", request.op, sig, request.target,
                          cache.persistent() ? "" : " (this process has no persistent cache: " + cache.degraded_reason() + ")"));
}

}  // namespace

std::shared_ptr<const CompiledBinary> get_or_compile(const CompileRequest& request, const BinaryCheck& check, bool* shared) {
  if (!jit_settings().compile) {
    if (shared != nullptr) *shared = false;
    return from_cache_without_compiler(request, check);
  }
  const std::string identity = compiler_identity(request.compiler);
  const KernelKey key = compute_key(request, identity);
  CompileTable& table = compile_table();
  std::promise<std::shared_ptr<const CompiledBinary>> promise;
  std::shared_future<std::shared_ptr<const CompiledBinary>> future;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    auto it = table.entries.find(key.hex());
    if (it != table.entries.end()) {
      future = it->second;
    } else {
      future = promise.get_future().share();
      table.entries.emplace(key.hex(), future);
      owner = true;
    }
  }
  if (shared != nullptr) *shared = !owner;
  if (!owner) {
    KernelCache::process().counters().memory_hits++;
    return future.get();
  }
  try {
    promise.set_value(fetch_or_compile(request, key, identity, check));
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(table.mutex);
    table.entries.erase(key.hex());  // a later call may try again (e.g. after a fix in KILN_KERNEL_SOURCES)
  }
  return future.get();
}

namespace {

// The kernel's workspace for this call, when it asks for one, pointed to by the parameter block's
// field; freed on the stream after the launch.
void attach_workspace(const LoadedKernel& kernel, const OperatorCall& call, const LaunchScope& scope,
                      std::optional<ScopedScratch>& scratch) {
  if (!kernel.spec->workspace_bytes) return;
  if (call.workspace == nullptr) {
    throw Error(ErrorCode::kInternal,
                fmt::format("kernel '{}' needs a workspace; its operator's parameter block has none", kernel.spec->name));
  }
  const Platform& platform = *scope.platform;
  const size_t bytes = kernel.spec->workspace_bytes(call.params, platform);
  if (bytes == 0) return;  // this call needs none (an unsplit decode), and the field stays null
  const size_t zeroed = kernel.spec->workspace_zeroed_bytes ? kernel.spec->workspace_zeroed_bytes(call.params, platform) : bytes;
  scratch.emplace(*kernel.backend, scope, bytes, zeroed, call.stream);
  *call.workspace = scratch->pointer();
}

}  // namespace

void run_operator(const OperatorCall& call) {
  VendorBackend& backend = launch_backend();
  const ScopedLaunch launch(backend, call.device);
  const LaunchScope& scope = launch.get();
  const auto kernel = find_loaded(call, backend, scope);
  const Platform& platform = *scope.platform;
  if (workspace_query != nullptr) {
    *workspace_query = kernel->spec->workspace_bytes ? kernel->spec->workspace_bytes(call.params, platform) : 0;
    return;
  }
  if (prepare_only_depth > 0) return;
  const LaunchShape shape = kernel->spec->launch_shape(call.params, platform);
  std::optional<ScopedScratch> scratch;  // freed on the stream after the launch
  attach_workspace(*kernel, call, scope, scratch);
  if (kernel->spec->tensor_maps) {
    for (const TensorMapRequest& map : kernel->spec->tensor_maps(call.params, platform)) {
      backend.encode_tensor_map(map, static_cast<unsigned char*>(call.params) + map.params_offset, kernel->spec->name);
    }
  }
  backend.launch(scope, kernel->function, shape, call.params, call.params_bytes, call.stream, kernel->spec->name);
}

}  // namespace kiln::detail

namespace kiln {

namespace detail {

WorkspaceQuery::WorkspaceQuery(size_t* bytes) : outer_(workspace_query) {
  *bytes = 0;
  workspace_query = bytes;
}
WorkspaceQuery::~WorkspaceQuery() { workspace_query = outer_; }

}  // namespace detail

PrepareOnly::PrepareOnly() { ++detail::prepare_only_depth; }
PrepareOnly::~PrepareOnly() { --detail::prepare_only_depth; }

CompiledKernel compile_for_target(const Signature& sig, const std::string& target) {
  const Platform platform = platform_for_target(target);
  const auto spec = Registry::global().select(sig, platform);
  const detail::CompileRequest request = detail::build_request(*spec, sig, platform);
  bool shared = false;
  const auto binary = detail::get_or_compile(request, nullptr, &shared);
  CompiledKernel out;
  out.kernel = spec->name;
  out.signature = sig.canonical();
  out.target = target;
  out.key = binary->key.hex();
  out.name_expression = request.name_expression;
  out.lowered_name = binary->result.lowered_name;
  out.compiler = binary->compiler;
  out.binary = binary->result.binary;
  out.compile_ms = binary->result.compile_ms;
  out.origin = shared ? "memory" : binary->origin;
  out.stored = binary->stored;
  return out;
}

}  // namespace kiln
