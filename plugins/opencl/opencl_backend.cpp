// The OpenCL backend: devices through the ICD loader (PoCL on a machine without a GPU), OpenCL C
// compiled at run time by the platform's compiler, binaries from clGetProgramInfo wrapped with
// their target so kiln's cache can check them, and memory as fine-grained shared virtual memory,
// whose pointers kernels read from the parameter block as they are.
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kiln/backend_plugin.h"
#include "opencl_plugin.hpp"

namespace kiln_opencl {
namespace {

int fail(kiln_backend_error* err, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(err->message, sizeof(err->message), format, args);
  va_end(args);
  return 1;
}

std::string device_text(cl_device_id device, cl_device_info what) {
  size_t size = 0;
  if (clGetDeviceInfo(device, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string text(size, '\0');
  clGetDeviceInfo(device, what, size, text.data(), nullptr);
  text.resize(std::strlen(text.c_str()));
  return text;
}

std::string platform_text(cl_platform_id platform, cl_platform_info what) {
  size_t size = 0;
  if (clGetPlatformInfo(platform, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string text(size, '\0');
  clGetPlatformInfo(platform, what, size, text.data(), nullptr);
  text.resize(std::strlen(text.c_str()));
  return text;
}

template <typename T>
T device_value(cl_device_id device, cl_device_info what) {
  T value{};
  clGetDeviceInfo(device, what, sizeof(T), &value, nullptr);
  return value;
}

// The compile target of a device: the host string PoCL reports (which names the CPU its code is
// built for), else the device's name; lower case, letters, digits and '-' only.
std::string target_of(cl_device_id device) {
  std::string id = device_text(device, CL_DEVICE_NAME);
  const std::string version = device_text(device, CL_DEVICE_VERSION);
  const size_t hstr = version.find("HSTR: ");
  if (hstr != std::string::npos) id = version.substr(hstr + 6);
  std::string out = "opencl-";
  for (char c : id) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out += std::isalnum(static_cast<unsigned char>(l)) || l == '-' ? l : '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

struct Device {
  cl_platform_id platform = nullptr;
  cl_device_id id = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;  // the default stream: in order
  std::string arch, features, name, identity;
  kiln_backend_target target{};
};

struct State {
  std::deque<Device> devices;
  std::vector<kiln_backend_target> targets;  // one per distinct arch
  std::string why_none;
  std::mutex mutex;             // guards allocations
  std::set<void*> allocations;  // live SVM blocks, declared to every launch
  std::vector<void*> allocation_list;
};

State& state() {
  static State* s = [] {
    auto* st = new State();
    cl_uint platform_count = 0;
    if (clGetPlatformIDs(0, nullptr, &platform_count) != CL_SUCCESS || platform_count == 0) {
      st->why_none = "no OpenCL platform (Debian: pocl-opencl-icd)";
      return st;
    }
    std::vector<cl_platform_id> platforms(platform_count);
    clGetPlatformIDs(platform_count, platforms.data(), nullptr);
    for (cl_platform_id platform : platforms) {
      cl_uint count = 0;
      if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, nullptr, &count) != CL_SUCCESS || count == 0) continue;
      std::vector<cl_device_id> ids(count);
      clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, count, ids.data(), nullptr);
      for (cl_device_id id : ids) {
        const auto svm = device_value<cl_device_svm_capabilities>(id, CL_DEVICE_SVM_CAPABILITIES);
        if ((svm & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) == 0) {
          st->why_none += "device '" + device_text(id, CL_DEVICE_NAME) + "' lacks fine-grained buffer SVM; ";
          continue;
        }
        cl_int status = CL_SUCCESS;
        cl_context context = clCreateContext(nullptr, 1, &id, nullptr, nullptr, &status);
        if (status != CL_SUCCESS) continue;
        cl_command_queue queue = clCreateCommandQueueWithProperties(context, id, nullptr, &status);
        if (status != CL_SUCCESS) {
          clReleaseContext(context);
          continue;
        }
        Device d;
        d.platform = platform;
        d.id = id;
        d.context = context;
        d.queue = queue;
        d.arch = target_of(id);
        d.name = device_text(id, CL_DEVICE_NAME);
        d.features = "opencl:svm_fine_grain_buffer";
        if (device_text(id, CL_DEVICE_EXTENSIONS).find("cl_khr_fp16") != std::string::npos) d.features += ",opencl:fp16";
        d.identity = platform_text(platform, CL_PLATFORM_VERSION) + " | " + device_text(id, CL_DEVICE_VERSION) + " | driver " +
                     device_text(id, CL_DRIVER_VERSION) + " | " + d.name;
        d.target.arch_version = 300;
        d.target.compute_units = static_cast<int32_t>(device_value<cl_uint>(id, CL_DEVICE_MAX_COMPUTE_UNITS));
        d.target.shared_memory_per_block = device_value<cl_ulong>(id, CL_DEVICE_LOCAL_MEM_SIZE);
        d.target.l2_bytes = device_value<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_CACHE_SIZE);
        d.target.warp_size = 1;
        st->devices.push_back(std::move(d));
        Device& kept = st->devices.back();
        kept.target.arch = kept.arch.c_str();
        kept.target.features = kept.features.c_str();
        kept.target.device_name = kept.name.c_str();
      }
    }
    for (const Device& d : st->devices) {
      const bool seen = std::any_of(st->targets.begin(), st->targets.end(), [&](const kiln_backend_target& t) { return d.arch == t.arch; });
      if (!seen) {
        kiln_backend_target t = d.target;
        t.device_name = nullptr;
        st->targets.push_back(t);
      }
    }
    if (st->devices.empty() && st->why_none.empty()) st->why_none = "the OpenCL platforms report no device";
    return st;
  }();
  return *s;
}

Device* device_at(int32_t index, kiln_backend_error* err) {
  State& s = state();
  if (index < 0 || static_cast<size_t>(index) >= s.devices.size()) {
    fail(err, "device %d does not exist (%zu OpenCL devices)", index, s.devices.size());
    return nullptr;
  }
  return &s.devices[static_cast<size_t>(index)];
}

Device* device_for_target(const char* target, kiln_backend_error* err) {
  for (Device& d : state().devices) {
    if (d.arch == target) return &d;
  }
  fail(err, "no OpenCL device here compiles for target '%s'", target);
  return nullptr;
}

// A binary: magic, the target's length and text, then the program binary.
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'O', 'C', 'L', '1'};

struct Function {
  cl_program program = nullptr;
  cl_kernel kernel = nullptr;
  Device* device = nullptr;
  std::mutex mutex;  // arguments and enqueue are one step
};

cl_command_queue queue_of(void* stream, Device* device) {
  return stream != nullptr ? static_cast<cl_command_queue>(stream) : device->queue;
}

// ---- the table's functions

int device_count(int32_t* count, kiln_backend_error* err) {
  *count = static_cast<int32_t>(state().devices.size());
  if (*count == 0) fail(err, "%s", state().why_none.c_str());
  return 0;
}

int describe_device(int32_t index, kiln_backend_target* out, kiln_backend_error* err) {
  Device* d = device_at(index, err);
  if (d == nullptr) return 1;
  *out = d->target;
  return 0;
}

int runtime_version(int32_t* version, kiln_backend_error* err) {
  if (state().devices.empty()) return fail(err, "%s", state().why_none.c_str());
  // "OpenCL 3.0 ..." -> 3000
  int major = 0, minor = 0;
  std::sscanf(platform_text(state().devices[0].platform, CL_PLATFORM_VERSION).c_str(), "OpenCL %d.%d", &major, &minor);
  *version = major * 1000 + minor * 10;
  return 0;
}

int memory_info(int32_t index, uint64_t* free_bytes, uint64_t* total_bytes, kiln_backend_error* err) {
  Device* d = device_at(index, err);
  if (d == nullptr) return 1;
  // OpenCL reports no free figure: the largest single allocation stands for it.
  *total_bytes = device_value<cl_ulong>(d->id, CL_DEVICE_GLOBAL_MEM_SIZE);
  *free_bytes = device_value<cl_ulong>(d->id, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  return 0;
}

int compiler_identity(const char* target, kiln_backend_write_fn write, void* sink, kiln_backend_error* err) {
  if (state().devices.empty()) return fail(err, "%s", state().why_none.c_str());
  Device* d = target != nullptr && *target ? device_for_target(target, err) : &state().devices[0];
  if (d == nullptr) return 1;
  write(sink, d->identity.data(), d->identity.size());
  return 0;
}

// A private folder holding a compile's headers, removed with it.
struct HeaderFolder {
  std::string path;
  ~HeaderFolder() {
    if (!path.empty()) std::filesystem::remove_all(path);
  }
  bool write(const kiln_backend_compile_request* r, kiln_backend_error* err) {
    char pattern[] = "/tmp/kiln-opencl-XXXXXX";
    if (mkdtemp(pattern) == nullptr) return fail(err, "mkdtemp: %s", std::strerror(errno)) == 0;
    path = pattern;
    for (uint32_t i = 0; i < r->num_headers; ++i) {
      const std::filesystem::path file = std::filesystem::path(path) / r->header_names[i];
      if (file.lexically_normal().string().rfind(path + "/", 0) != 0)
        return fail(err, "header name '%s' leaves its folder", r->header_names[i]) == 0;
      std::error_code ec;
      std::filesystem::create_directories(file.parent_path(), ec);
      std::ofstream out(file, std::ios::binary);
      out << r->header_texts[i];
      if (!out) return fail(err, "cannot write header %s", file.c_str()) == 0;
    }
    return true;
  }
};

std::string build_log(cl_program program, cl_device_id device) {
  size_t size = 0;
  clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
  std::string text(size, '\0');
  if (size > 0) clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, size, text.data(), nullptr);
  text.resize(std::strlen(text.c_str()));
  return text;
}

int compile(const kiln_backend_compile_request* r, kiln_backend_write_fn write, void* binary, void* log, kiln_backend_error* err) {
  Device* d = device_for_target(r->target, err);
  if (d == nullptr) return 1;
  // Headers the program includes by name (kiln resolves them from its tree) go to a scratch
  // folder on the include path.
  std::string options = "-cl-std=CL3.0";
  HeaderFolder headers;
  if (r->num_headers > 0) {
    if (!headers.write(r, err)) return 1;
    options += " -I" + headers.path;
  }
  for (uint32_t i = 0; i < r->num_options; ++i) options += std::string(" ") + r->options[i];
  cl_int status = CL_SUCCESS;
  const char* text = r->source;
  cl_program program = clCreateProgramWithSource(d->context, 1, &text, nullptr, &status);
  if (status != CL_SUCCESS) return fail(err, "clCreateProgramWithSource: error %d", status);
  status = clBuildProgram(program, 1, &d->id, options.c_str(), nullptr, nullptr);
  const std::string messages = build_log(program, d->id);
  write(log, messages.data(), messages.size());
  if (status != CL_SUCCESS) {
    clReleaseProgram(program);
    return fail(err, "clBuildProgram of '%s' for %s: error %d", r->kernel_name, r->target, status);
  }
  // The entry must exist: a missing kernel is a compile error, not a load error later.
  cl_kernel kernel = clCreateKernel(program, r->entry, &status);
  if (status != CL_SUCCESS) {
    clReleaseProgram(program);
    return fail(err, "the program has no kernel '%s' (error %d)", r->entry, status);
  }
  clReleaseKernel(kernel);
  size_t size = 0;
  clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr);
  std::vector<unsigned char> bytes(size);
  unsigned char* pointer = bytes.data();
  status = clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof(pointer), &pointer, nullptr);
  clReleaseProgram(program);
  if (status != CL_SUCCESS || size == 0) return fail(err, "clGetProgramInfo(CL_PROGRAM_BINARIES): error %d", status);
  const uint32_t target_length = static_cast<uint32_t>(std::strlen(r->target));
  write(binary, kMagic, sizeof(kMagic));
  write(binary, &target_length, sizeof(target_length));
  write(binary, r->target, target_length);
  write(binary, bytes.data(), bytes.size());
  return 0;
}

// The program binary inside a kiln binary for `target`, or null with err set.
const unsigned char* unwrap(const char* target, const void* binary, size_t size, size_t* program_size, kiln_backend_error* err) {
  const auto* b = static_cast<const unsigned char*>(binary);
  if (size < sizeof(kMagic) + 4 || std::memcmp(b, kMagic, sizeof(kMagic)) != 0) {
    fail(err, "not a kiln OpenCL binary (no KILNOCL1 header)");
    return nullptr;
  }
  uint32_t length = 0;
  std::memcpy(&length, b + sizeof(kMagic), 4);
  const size_t header = sizeof(kMagic) + 4 + length;
  if (length > 4096 || size <= header) {
    fail(err, "a truncated kiln OpenCL binary (%zu bytes)", size);
    return nullptr;
  }
  const std::string built_for(reinterpret_cast<const char*>(b + sizeof(kMagic) + 4), length);
  if (built_for != target) {
    fail(err, "an OpenCL binary for %s, not for %s", built_for.c_str(), target);
    return nullptr;
  }
  *program_size = size - header;
  return b + header;
}

int check_binary(const char* target, const void* binary, size_t size, kiln_backend_error* err) {
  size_t program_size = 0;
  return unwrap(target, binary, size, &program_size, err) != nullptr ? 0 : 1;
}

int load(int32_t index, const void* binary, size_t size, const char* entry, void** function, kiln_backend_error* err) {
  Device* d = device_at(index, err);
  if (d == nullptr) return 1;
  size_t program_size = 0;
  const unsigned char* program_bytes = unwrap(d->arch.c_str(), binary, size, &program_size, err);
  if (program_bytes == nullptr) return 1;
  cl_int status = CL_SUCCESS, binary_status = CL_SUCCESS;
  cl_program program = clCreateProgramWithBinary(d->context, 1, &d->id, &program_size, &program_bytes, &binary_status, &status);
  if (status != CL_SUCCESS || binary_status != CL_SUCCESS) {
    if (program != nullptr) clReleaseProgram(program);
    return fail(err, "clCreateProgramWithBinary: error %d (binary status %d)", status, binary_status);
  }
  status = clBuildProgram(program, 1, &d->id, nullptr, nullptr, nullptr);
  if (status != CL_SUCCESS) {
    const std::string messages = build_log(program, d->id);
    clReleaseProgram(program);
    return fail(err, "clBuildProgram of a binary: error %d: %s", status, messages.c_str());
  }
  cl_kernel kernel = clCreateKernel(program, entry, &status);
  if (status != CL_SUCCESS) {
    clReleaseProgram(program);
    return fail(err, "clCreateKernel('%s'): error %d", entry, status);
  }
  auto* f = new Function();
  f->program = program;
  f->kernel = kernel;
  f->device = d;
  *function = f;
  return 0;
}

void unload(void* function) {
  auto* f = static_cast<Function*>(function);
  clReleaseKernel(f->kernel);
  clReleaseProgram(f->program);
  delete f;
}

int launch(int32_t, void* function, const kiln_backend_launch_request* r, kiln_backend_error* err) {
  auto* f = static_cast<Function*>(function);
  const kiln_plugin_launch& s = r->shape;
  if (s.cluster[0] + s.cluster[1] + s.cluster[2] != 0 || s.cooperative != 0) {
    return fail(err, "OpenCL launches have no clusters and no cooperative groups");
  }
  size_t global[3], local[3];
  for (int i = 0; i < 3; ++i) {
    local[i] = s.block[i];
    global[i] = static_cast<size_t>(s.grid[i]) * s.block[i];
  }
  if (global[0] * global[1] * global[2] == 0) return 0;
  const auto local_limit = device_value<cl_ulong>(f->device->id, CL_DEVICE_LOCAL_MEM_SIZE);
  if (s.dynamic_shared_bytes > local_limit) {
    return fail(err, "the kernel asks for %u bytes of local memory; the device has %llu", s.dynamic_shared_bytes,
                static_cast<unsigned long long>(local_limit));
  }
  cl_int status = CL_SUCCESS;
  cl_mem params =
      clCreateBuffer(f->device->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, r->params_bytes, const_cast<void*>(r->params), &status);
  if (status != CL_SUCCESS) return fail(err, "clCreateBuffer for the parameter block: error %d", status);
  std::lock_guard<std::mutex> lock(f->mutex);
  status = clSetKernelArg(f->kernel, 0, sizeof(cl_mem), &params);
  if (status == CL_SUCCESS) status = clSetKernelArg(f->kernel, 1, std::max<size_t>(s.dynamic_shared_bytes, 16), nullptr);
  if (status == CL_SUCCESS) {
    // The pointers inside the parameter block are SVM the kernel uses without taking it as an
    // argument: the runtime is told of every live block.
    State& st = state();
    std::lock_guard<std::mutex> memory(st.mutex);
    if (!st.allocation_list.empty()) {
      status = clSetKernelExecInfo(f->kernel, CL_KERNEL_EXEC_INFO_SVM_PTRS, st.allocation_list.size() * sizeof(void*),
                                   st.allocation_list.data());
    }
  }
  if (status == CL_SUCCESS) {
    status = clEnqueueNDRangeKernel(queue_of(r->stream, f->device), f->kernel, 3, nullptr, global, local, 0, nullptr, nullptr);
  }
  clReleaseMemObject(params);  // kept alive by the enqueued kernel
  if (status != CL_SUCCESS) {
    return fail(err, "enqueue of grid (%u, %u, %u) x block (%u, %u, %u): error %d", s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1],
                s.block[2], status);
  }
  return 0;
}

void* alloc(int32_t index, uint64_t bytes, kiln_backend_error* err) {
  Device* d = device_at(index, err);
  if (d == nullptr) return nullptr;
  void* pointer = clSVMAlloc(d->context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, std::max<uint64_t>(bytes, 16), 0);
  if (pointer == nullptr) {
    fail(err, "clSVMAlloc of %llu bytes failed", static_cast<unsigned long long>(bytes));
    return nullptr;
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.allocations.insert(pointer);
  s.allocation_list.assign(s.allocations.begin(), s.allocations.end());
  return pointer;
}

void release(void* pointer) {
  if (pointer == nullptr) return;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.allocations.erase(pointer);
    s.allocation_list.assign(s.allocations.begin(), s.allocations.end());
  }
  clSVMFree(s.devices[0].context, pointer);
}

int fill(void* pointer, uint8_t value, uint64_t bytes, void* stream, kiln_backend_error* err) {
  if (state().devices.empty()) return fail(err, "%s", state().why_none.c_str());
  const cl_int status = clEnqueueSVMMemFill(queue_of(stream, &state().devices[0]), pointer, &value, 1, bytes, 0, nullptr, nullptr);
  return status == CL_SUCCESS ? 0 : fail(err, "clEnqueueSVMMemFill: error %d", status);
}

int copy(void* destination, const void* source, uint64_t bytes, int32_t, void* stream, kiln_backend_error* err) {
  if (state().devices.empty()) return fail(err, "%s", state().why_none.c_str());
  const cl_int status =
      clEnqueueSVMMemcpy(queue_of(stream, &state().devices[0]), CL_FALSE, destination, source, bytes, 0, nullptr, nullptr);
  return status == CL_SUCCESS ? 0 : fail(err, "clEnqueueSVMMemcpy: error %d", status);
}

int synchronize(void* stream, kiln_backend_error* err) {
  if (stream != nullptr) {
    const cl_int status = clFinish(static_cast<cl_command_queue>(stream));
    return status == CL_SUCCESS ? 0 : fail(err, "clFinish: error %d", status);
  }
  for (Device& d : state().devices) {
    const cl_int status = clFinish(d.queue);
    if (status != CL_SUCCESS) return fail(err, "clFinish: error %d", status);
  }
  return 0;
}

}  // namespace

const kiln_backend_plugin* backend_table() {
  static const kiln_backend_plugin table = [] {
    kiln_backend_plugin t{};
    t.abi_version = KILN_BACKEND_ABI_VERSION;
    t.name = "opencl";
    t.compiler_name = "opencl-c";
    t.compute_unit_name = "compute units";
    t.num_targets = static_cast<uint32_t>(state().targets.size());
    t.targets = state().targets.data();
    t.device_count = device_count;
    t.describe_device = describe_device;
    t.runtime_version = runtime_version;
    t.memory_info = memory_info;
    t.compiler_identity = compiler_identity;
    t.compile = compile;
    t.check_binary = check_binary;
    t.load = load;
    t.unload = unload;
    t.launch = launch;
    t.alloc = alloc;
    t.free = release;
    t.fill = fill;
    t.copy = copy;
    t.synchronize = synchronize;
    return t;
  }();
  return &table;
}

}  // namespace kiln_opencl

extern "C" __attribute__((visibility("default"))) const kiln_backend_plugin* kiln_backend_plugin_entry(void) {
  return kiln_opencl::backend_table();
}
