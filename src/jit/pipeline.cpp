#include "jit/pipeline.hpp"

#include <future>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include <fmt/format.h>

#include <xxhash.h>

#include "backends/cuda/device.hpp"
#include "jit/compiler.hpp"
#include "jit/sources.hpp"
#include "kiln/error.hpp"
#include "kiln/jit.hpp"
#include "kiln/log.hpp"
#include "ops/dispatch.hpp"

namespace kiln::detail {
namespace {

// Options every kiln compile uses; they are part of the key like any other option.
const std::vector<std::string>& base_options() {
  static const std::vector<std::string> options = {"-std=c++17", "-DKILN_NVRTC=1"};
  return options;
}

struct CompileTable {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const CompiledBinary>>> entries;
};
CompileTable& compile_table() {
  static CompileTable t;
  return t;
}

// The in-process hit path: one loaded kernel per (context, call key), valid while the registry
// generation it was selected under is current.
struct LoadedKey {
  CUcontext context;
  CallKey call;
  bool operator==(const LoadedKey&) const = default;
};
struct LoadedKeyHash {
  size_t operator()(const LoadedKey& k) const {
    return static_cast<size_t>(XXH3_64bits_withSeed(k.call.fields.data(), sizeof(k.call.fields),
                                                     reinterpret_cast<uintptr_t>(k.context) ^ static_cast<uint64_t>(k.call.op)));
  }
};
struct LoadedKernel {
  std::shared_ptr<const KernelSpec> spec;
  const Platform* platform;
  cuda::LoadedFunction function;
  uint64_t registry_generation;
};
struct LoadedTable {
  std::shared_mutex mutex;
  std::unordered_map<LoadedKey, std::shared_ptr<const LoadedKernel>, LoadedKeyHash> entries;
};
LoadedTable& loaded_table() {
  static LoadedTable t;
  return t;
}

// The miss path: select, specialize, compile (or reuse the binary), load into the context.
std::shared_ptr<const LoadedKernel> load_kernel(const OperatorCall& call, cuda::Device& dev, CUcontext context) {
  const Signature sig = call.make_signature(call.args);
  auto loaded = std::make_shared<LoadedKernel>();
  loaded->registry_generation = Registry::global().generation();
  loaded->spec = Registry::global().select(sig, dev.platform);
  loaded->platform = &dev.platform;
  const auto binary = get_or_compile(build_request(*loaded->spec, sig, dev.platform));
  loaded->function = cuda::load_function(binary->result.binary, binary->result.lowered_name, loaded->spec->name);
  LoadedTable& table = loaded_table();
  std::unique_lock lock(table.mutex);
  auto& slot = table.entries[LoadedKey{context, call.key}];
  if (slot && slot->registry_generation == loaded->registry_generation) {
    cuda::unload(loaded->function);  // a racing thread loaded it first
    return slot;
  }
  slot = loaded;
  return loaded;
}

}  // namespace

CompileRequest build_request(const KernelSpec& spec, const Signature& sig, const Platform& platform) {
  if (spec.backend != Backend::kCuda) {
    throw Error(ErrorCode::kUnsupported, fmt::format("kernel '{}': the {} backend is not built in this kiln",
                                                     spec.name, backend_name(spec.backend)));
  }
  const Specialization s = spec.specialize(sig, platform);
  CompileRequest r;
  r.compiler = CompilerKind::kNvrtc;
  r.kernel_name = spec.name;
  r.target = platform.arch;
  r.name_expression = s.name_expression;
  r.options = base_options();
  r.options.insert(r.options.end(), s.options.begin(), s.options.end());
  // Built-in kernels are headers of templates: the program includes the header and NVRTC
  // instantiates the name expression. Plugin kernels bring their whole program as text.
  r.source_name = spec.name + ".cu";  // never a header's name: NVRTC would see a self-include
  SourceSet sources = spec.source_is_text
                          ? resolve_includes(r.source_name, spec.source)
                          : resolve_includes(r.source_name, fmt::format("#include \"{}\"\n", spec.source));
  r.source = std::move(sources.main_text);
  r.headers = std::move(sources.headers);
  return r;
}

std::shared_ptr<const CompiledBinary> get_or_compile(const CompileRequest& request) {
  const KernelKey key = compute_key(request, compiler_identity(request.compiler));
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
  if (owner) {
    try {
      auto compiled = std::make_shared<CompiledBinary>();
      compiled->key = key;
      compiled->result = compile(request, jit_settings());
      log(LogLevel::kInfo, fmt::format("compiled {} for {} in {:.0f} ms ({} bytes, key {})", request.kernel_name,
                                       request.target, compiled->result.compile_ms, compiled->result.binary.size(), key.hex()));
      promise.set_value(std::move(compiled));
    } catch (...) {
      promise.set_exception(std::current_exception());
      std::lock_guard<std::mutex> lock(table.mutex);
      table.entries.erase(key.hex());  // a later call may try again (e.g. after a fix in KILN_KERNEL_SOURCES)
    }
  }
  return future.get();
}

void run_operator(const OperatorCall& call) {
  cuda::Device& dev = cuda::device(call.device);
  cuda::ScopedContext context(dev);
  LoadedTable& table = loaded_table();
  std::shared_ptr<const LoadedKernel> kernel;
  {
    std::shared_lock lock(table.mutex);
    auto it = table.entries.find(LoadedKey{context.get(), call.key});
    if (it != table.entries.end()) kernel = it->second;
  }
  if (!kernel || kernel->registry_generation != Registry::global().generation()) {
    kernel = load_kernel(call, dev, context.get());
  }
  cuda::launch(kernel->function.function, kernel->spec->launch_shape(call.params, *kernel->platform), call.params,
               call.stream, kernel->spec->name);
}

}  // namespace kiln::detail

namespace kiln {

CompiledKernel compile_for_target(const Signature& sig, const std::string& target) {
  const Platform platform = platform_for_target(target);
  const auto spec = Registry::global().select(sig, platform);
  const detail::CompileRequest request = detail::build_request(*spec, sig, platform);
  const auto binary = detail::get_or_compile(request);
  CompiledKernel out;
  out.kernel = spec->name;
  out.signature = sig.canonical();
  out.target = target;
  out.key = binary->key.hex();
  out.name_expression = request.name_expression;
  out.lowered_name = binary->result.lowered_name;
  out.compiler = detail::compiler_identity(request.compiler);
  out.binary = binary->result.binary;
  out.compile_ms = binary->result.compile_ms;
  return out;
}

}  // namespace kiln
