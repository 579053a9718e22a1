#include "jit/pipeline.hpp"

#include <future>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include <fmt/format.h>

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

// One loaded kernel per (context, kernel, signature): the in-process hit path.
struct LoadedKernel {
  std::shared_ptr<const KernelSpec> spec;
  cuda::LoadedFunction function;
};
struct LoadedTable {
  std::shared_mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const LoadedKernel>> entries;
};
LoadedTable& loaded_table() {
  static LoadedTable t;
  return t;
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

void run_operator(const Signature& sig, int device_index, const void* params, size_t, Stream stream) {
  cuda::Device& dev = cuda::device(device_index);
  cuda::ScopedContext context(dev);
  const auto spec = Registry::global().select(sig, dev.platform);

  std::string table_key = fmt::format("{}|{}|", static_cast<const void*>(context.get()), spec->name);
  table_key += sig.canonical();
  LoadedTable& table = loaded_table();
  std::shared_ptr<const LoadedKernel> kernel;
  {
    std::shared_lock lock(table.mutex);
    auto it = table.entries.find(table_key);
    if (it != table.entries.end()) kernel = it->second;
  }
  if (!kernel) {
    const CompileRequest request = build_request(*spec, sig, dev.platform);
    const auto binary = get_or_compile(request);
    auto loaded = std::make_shared<LoadedKernel>();
    loaded->spec = spec;
    loaded->function = cuda::load_function(binary->result.binary, binary->result.lowered_name, spec->name);
    std::unique_lock lock(table.mutex);
    auto [it, inserted] = table.entries.emplace(table_key, loaded);
    kernel = it->second;
    if (!inserted) cuda::unload(loaded->function);  // a racing thread loaded it first
  }
  cuda::launch(kernel->function.function, kernel->spec->launch_shape(params, dev.platform), params, stream,
               kernel->spec->name);
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
