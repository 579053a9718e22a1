// A backend plugin's C table behind the backend interface.
#include "backends/plugin_backend.hpp"

#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include "backends/backend.hpp"
#include "kiln/backend_plugin.h"
#include "kiln/error.hpp"
#include "kiln/log.hpp"
#include "platform/vendors.hpp"

namespace kiln::detail {
namespace {

std::vector<std::string> split_features(const char* text) {
  std::vector<std::string> out;
  if (text == nullptr) return out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Platform platform_of(Vendor vendor, const kiln_backend_target& t) {
  Platform p;
  p.vendor = vendor;
  p.arch = t.arch != nullptr ? t.arch : "";
  p.arch_version = t.arch_version;
  p.features = split_features(t.features);
  p.multiprocessor_count = t.compute_units;
  p.shared_memory_per_block = t.shared_memory_per_block;
  p.l2_bytes = t.l2_bytes;
  p.warp_size = t.warp_size > 0 ? t.warp_size : 1;
  p.device_name = t.device_name != nullptr ? t.device_name : "(target " + p.arch + ")";
  return p;
}

void append_bytes(void* sink, const void* bytes, size_t size) {
  auto* out = static_cast<std::vector<uint8_t>*>(sink);
  const auto* b = static_cast<const uint8_t*>(bytes);
  out->insert(out->end(), b, b + size);
}

// A host-clock event: recording waits for the stream, so on an in-order queue the time between
// two records is the work enqueued between them.
struct HostEvent {
  std::chrono::steady_clock::time_point at;
};

class PluginBackend final : public VendorBackend {
 public:
  PluginBackend(std::string origin, const kiln_backend_plugin& table, Vendor vendor)
      : origin_(std::move(origin)), t_(table), vendor_(vendor), name_(table.name), compiler_(table.compiler_name) {}

  Backend kind() const override { return static_cast<Backend>(vendor_); }
  Vendor vendor() const override { return vendor_; }
  const char* name() const override { return name_.c_str(); }

  int device_count() override {
    int32_t count = 0;
    call(
        "device_count", [&](kiln_backend_error* e) { return t_.device_count(&count, e); }, ErrorCode::kDriverError);
    return count;
  }
  void detect(DeviceReport& report) override {
    try {
      const int count = device_count();
      if (count == 0) report.notes.push_back(fmt::format("{} devices: none", name_));
      for (int i = 0; i < count; ++i) report.devices.push_back(device_platform(i));
    } catch (const Error& e) {
      report.notes.push_back(fmt::format("{} devices: {}", name_, e.message()));
    }
  }
  const Platform& device_platform(int index) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& p : devices_) {
      if (p.device_index == index) return p;
    }
    kiln_backend_target target{};
    call(
        "describe_device", [&](kiln_backend_error* e) { return t_.describe_device(index, &target, e); }, ErrorCode::kDriverError);
    Platform p = platform_of(vendor_, target);
    p.detected = true;
    p.device_index = index;
    devices_.push_back(std::move(p));
    return devices_.back();
  }
  int runtime_version() override {
    int32_t version = 0;
    call(
        "runtime_version", [&](kiln_backend_error* e) { return t_.runtime_version(&version, e); }, ErrorCode::kDriverError);
    return version;
  }
  std::pair<size_t, size_t> memory_info(int index) override {
    uint64_t free_bytes = 0, total_bytes = 0;
    call(
        "memory_info", [&](kiln_backend_error* e) { return t_.memory_info(index, &free_bytes, &total_bytes, e); }, ErrorCode::kDriverError);
    return {static_cast<size_t>(free_bytes), static_cast<size_t>(total_bytes)};
  }

  CompilerKind compiler_for(const Platform&, const JitSettings&) override { return static_cast<CompilerKind>(vendor_); }
  bool uses(CompilerKind compiler) const override { return compiler == static_cast<CompilerKind>(vendor_); }
  std::vector<std::string> base_options(CompilerKind) const override { return {}; }
  bool compiles_in_worker() const override { return false; }
  // The identity of the compiler for every target the plugin has: one call per process. The memo
  // gets no fingerprint (the plugin's files are not kiln's to fingerprint), so it recomputes.
  std::string compiler_identity(CompilerKind, const IdentityMemo&) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (identity_.empty()) {
      std::vector<uint8_t> bytes;
      const char* first_target = t_.num_targets > 0 ? t_.targets[0].arch : "";
      call(
          "compiler_identity", [&](kiln_backend_error* e) { return t_.compiler_identity(first_target, append_bytes, &bytes, e); },
          ErrorCode::kCompileFailed);
      identity_ = compiler_ + " " + std::string(bytes.begin(), bytes.end());  // as "nvrtc 13.0 ..."
    }
    return identity_;
  }
  CompileResult compile(const CompileRequest& request, double) override {
    std::vector<const char*> options, header_names, header_texts;
    for (const auto& o : request.options) options.push_back(o.c_str());
    for (const auto& [name, text] : request.headers) {
      header_names.push_back(name.c_str());
      header_texts.push_back(text.c_str());
    }
    const kiln_backend_compile_request r{request.target.c_str(),
                                         request.kernel_name.c_str(),
                                         request.source.c_str(),
                                         request.name_expression.c_str(),
                                         options.data(),
                                         static_cast<uint32_t>(options.size()),
                                         header_names.data(),
                                         header_texts.data(),
                                         static_cast<uint32_t>(header_names.size())};
    CompileResult result;
    std::vector<uint8_t> log;
    kiln_backend_error err{};
    const auto start = std::chrono::steady_clock::now();
    const int status = t_.compile(&r, append_bytes, &result.binary, &log, &err);
    result.log.assign(log.begin(), log.end());
    if (status != 0) {
      err.message[sizeof(err.message) - 1] = '\0';
      throw Error::compile_failed(request.kernel_name, request.target, request.options,
                                  fmt::format("{}\n{}", err.message[0] ? err.message : "the plugin's compiler failed", result.log));
    }
    result.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    result.lowered_name = request.name_expression;
    return result;
  }
  std::optional<std::string> binary_problem(const std::string& target, const std::vector<uint8_t>& binary) const override {
    kiln_backend_error err{};
    if (t_.check_binary(target.c_str(), binary.data(), binary.size(), &err) == 0) return std::nullopt;
    err.message[sizeof(err.message) - 1] = '\0';
    return std::string(err.message[0] ? err.message : "refused by the backend plugin");
  }
  void report_compilers(const std::vector<std::string>& targets, const IdentityMemo& memo, std::vector<CompilerReport>& out) override {
    CompilerReport report{compiler_, "", {}, ""};
    try {
      report.identity = compiler_identity(static_cast<CompilerKind>(vendor_), memo);
      report.targets = targets;
    } catch (const Error& e) {
      report.note = e.message();
    }
    out.push_back(report);
  }

  LaunchScope enter(int index) override {
    LaunchScope scope;
    scope.platform = &device_platform(index);
    scope.key = scope.platform;  // functions are loaded once per device
    scope.device = index;
    return scope;
  }
  void leave(LaunchScope&) noexcept override {}
  DeviceFunction load(const LaunchScope& scope, const std::vector<uint8_t>& binary, const std::string& lowered_name,
                      const std::string& kernel_name) override {
    void* function = nullptr;
    call(
        "load",
        [&](kiln_backend_error* e) { return t_.load(scope.device, binary.data(), binary.size(), lowered_name.c_str(), &function, e); },
        ErrorCode::kDriverError, kernel_name);
    return {nullptr, function, nullptr};
  }
  void unload(const DeviceFunction& function) noexcept override {
    if (function.function != nullptr) t_.unload(function.function);
  }
  void encode_tensor_map(const TensorMapRequest&, void*, const std::string& kernel_name) override {
    throw Error(ErrorCode::kUnsupported, fmt::format("kernel '{}' asks for a TMA tensor map, which backend {} lacks", kernel_name, name_));
  }
  void launch(const LaunchScope& scope, const DeviceFunction& function, const LaunchShape& shape, const void* params, size_t params_bytes,
              Stream stream, const std::string& kernel_name) override {
    kiln_backend_launch_request r{};
    r.params = params;
    r.params_bytes = params_bytes;
    for (int i = 0; i < 3; ++i) {
      r.shape.grid[i] = shape.grid[i];
      r.shape.block[i] = shape.block[i];
      r.shape.cluster[i] = shape.cluster[i];
    }
    r.shape.dynamic_shared_bytes = shape.dynamic_shared_bytes;
    r.shape.cooperative = shape.cooperative ? 1 : 0;
    r.stream = stream;
    call(
        "launch", [&](kiln_backend_error* e) { return t_.launch(scope.device, function.function, &r, e); }, ErrorCode::kDriverError,
        kernel_name);
  }

  // The plugin's memory is not stream-ordered: scratch is allocated at once and freed after its
  // stream drains.
  void* stream_alloc(const LaunchScope& scope, size_t bytes, Stream) override { return alloc(scope.device, bytes); }
  void stream_free(void* pointer, Stream stream) noexcept override {
    kiln_backend_error err{};
    if (t_.synchronize(stream, &err) != 0) log(LogLevel::kError, fmt::format("backend {}: synchronize: {}", name_, err.message));
    t_.free(pointer);
  }
  void fill_async(void* pointer, uint8_t value, size_t bytes, Stream stream) override {
    call(
        "fill", [&](kiln_backend_error* e) { return t_.fill(pointer, value, bytes, stream, e); }, ErrorCode::kDriverError);
  }
  bool stream_capturing(Stream) override { return false; }
  void* device_alloc(size_t bytes) override { return alloc(0, bytes); }
  void device_free(void* pointer) noexcept override {
    if (pointer != nullptr) t_.free(pointer);
  }
  void memset(void* device_pointer, uint8_t value, size_t bytes) override {
    fill_async(device_pointer, value, bytes, nullptr);
    synchronize(nullptr);
  }
  void copy_to_host(void* host, const void* device_pointer, size_t bytes, Stream stream) override {
    call(
        "copy", [&](kiln_backend_error* e) { return t_.copy(host, device_pointer, bytes, KILN_BACKEND_COPY_TO_HOST, stream, e); },
        ErrorCode::kDriverError);
  }
  void copy_to_device(void* device_pointer, const void* host, size_t bytes, Stream stream) override {
    call(
        "copy", [&](kiln_backend_error* e) { return t_.copy(device_pointer, host, bytes, KILN_BACKEND_COPY_TO_DEVICE, stream, e); },
        ErrorCode::kDriverError);
  }
  void synchronize(Stream stream) override {
    call(
        "synchronize", [&](kiln_backend_error* e) { return t_.synchronize(stream, e); }, ErrorCode::kDriverError);
  }
  void synchronize_device() override { synchronize(nullptr); }
  void* event_create() override { return new HostEvent(); }
  void event_destroy(void* event) noexcept override { delete static_cast<HostEvent*>(event); }
  void event_record(void* event, Stream stream) override {
    synchronize(stream);
    static_cast<HostEvent*>(event)->at = std::chrono::steady_clock::now();
  }
  void event_synchronize(void*) override {}
  float event_elapsed_ms(void* start, void* stop) override {
    return std::chrono::duration<float, std::milli>(static_cast<HostEvent*>(stop)->at - static_cast<HostEvent*>(start)->at).count();
  }

 private:
  template <typename Fn>
  void call(const char* what, Fn&& fn, ErrorCode code, const std::string& kernel_name = "") {
    kiln_backend_error err{};
    if (fn(&err) == 0) return;
    err.message[sizeof(err.message) - 1] = '\0';
    const std::string about = kernel_name.empty() ? "" : fmt::format(" (kernel '{}')", kernel_name);
    throw Error(code, fmt::format("backend {}: {}{}: {}", name_, what, about, err.message[0] ? err.message : "failed, no reason given"));
  }
  void* alloc(int device, size_t bytes) {
    kiln_backend_error err{};
    void* pointer = t_.alloc(device, bytes, &err);
    if (pointer == nullptr) {
      err.message[sizeof(err.message) - 1] = '\0';
      throw Error(ErrorCode::kDriverError, fmt::format("backend {}: alloc of {} bytes: {}", name_, bytes, err.message));
    }
    return pointer;
  }

  std::string origin_;
  kiln_backend_plugin t_;
  Vendor vendor_;
  std::string name_, compiler_;
  std::mutex mutex_;
  std::deque<Platform> devices_;  // never moves its entries: scopes keep pointers to them
  std::string identity_;
};

Error refusal(const std::string& origin, const std::string& what) {
  return Error(ErrorCode::kPluginError, fmt::format("backend plugin {}: {}", origin, what));
}

// Why the table cannot be used, or nullopt.
std::optional<std::string> table_problem(const kiln_backend_plugin& t) {
  if (t.name == nullptr || *t.name == '\0') return std::string("name is missing");
  if (t.compiler_name == nullptr || *t.compiler_name == '\0') return std::string("compiler_name is missing");
  const std::pair<const char*, const void*> functions[] = {
      {"device_count", reinterpret_cast<const void*>(t.device_count)},
      {"describe_device", reinterpret_cast<const void*>(t.describe_device)},
      {"runtime_version", reinterpret_cast<const void*>(t.runtime_version)},
      {"memory_info", reinterpret_cast<const void*>(t.memory_info)},
      {"compiler_identity", reinterpret_cast<const void*>(t.compiler_identity)},
      {"compile", reinterpret_cast<const void*>(t.compile)},
      {"check_binary", reinterpret_cast<const void*>(t.check_binary)},
      {"load", reinterpret_cast<const void*>(t.load)},
      {"unload", reinterpret_cast<const void*>(t.unload)},
      {"launch", reinterpret_cast<const void*>(t.launch)},
      {"alloc", reinterpret_cast<const void*>(t.alloc)},
      {"free", reinterpret_cast<const void*>(t.free)},
      {"fill", reinterpret_cast<const void*>(t.fill)},
      {"copy", reinterpret_cast<const void*>(t.copy)},
      {"synchronize", reinterpret_cast<const void*>(t.synchronize)},
  };
  for (const auto& [name, fn] : functions) {
    if (fn == nullptr) return fmt::format("{} is missing", name);
  }
  if (t.num_targets > 0 && t.targets == nullptr) return std::string("num_targets > 0 but targets is NULL");
  for (uint32_t i = 0; i < t.num_targets; ++i) {
    if (t.targets[i].arch == nullptr || *t.targets[i].arch == '\0') return fmt::format("target #{} has no arch", i);
  }
  return std::nullopt;
}

// Backends live until the process exits, like the built-in ones.
std::deque<std::unique_ptr<PluginBackend>>& plugin_backends() {
  static auto* list = new std::deque<std::unique_ptr<PluginBackend>>();
  return *list;
}

}  // namespace

void register_backend_plugin(const std::string& origin, void* entry) {
  const auto* table = reinterpret_cast<kiln_backend_plugin_entry_fn>(entry)();
  if (table == nullptr) throw refusal(origin, "kiln_backend_plugin_entry returned NULL");
  if (table->abi_version < KILN_BACKEND_ABI_MIN_VERSION || table->abi_version > KILN_BACKEND_ABI_VERSION) {
    throw refusal(origin, fmt::format("built for backend ABI version {}, this kiln speaks versions {} to {}", table->abi_version,
                                      KILN_BACKEND_ABI_MIN_VERSION, KILN_BACKEND_ABI_VERSION));
  }
  if (auto why = table_problem(*table)) throw refusal(origin, *why);
  std::vector<std::string> known = known_targets();
  for (uint32_t i = 0; i < table->num_targets; ++i) {
    if (std::find(known.begin(), known.end(), table->targets[i].arch) != known.end()) {
      throw refusal(origin, fmt::format("target '{}' is already taken", table->targets[i].arch));
    }
  }
  Vendor vendor{};
  try {
    vendor = add_vendor(table->name, table->compute_unit_name != nullptr ? table->compute_unit_name : "", table->compiler_name);
  } catch (const Error& e) {
    throw refusal(origin, e.message());
  }
  for (uint32_t i = 0; i < table->num_targets; ++i) add_target(platform_of(vendor, table->targets[i]));
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  plugin_backends().push_back(std::make_unique<PluginBackend>(origin, *table, vendor));
  register_plugin_backend(plugin_backends().back().get());
  log(LogLevel::kInfo, fmt::format("loaded backend '{}' from {} ({} targets)", table->name, origin, table->num_targets));
}

}  // namespace kiln::detail
