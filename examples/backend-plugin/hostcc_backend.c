/* A complete kiln backend plugin, small enough to copy: "hostcc" runs kernels written in C on the
 * host's CPU, compiled at run time by the system C compiler (cc, or $HOSTCC) into shared objects
 * that kiln caches like any other binary. One device ("host"), memory from malloc, launches that
 * call the kernel once per block. It brings one kernel: mha_prefill for bf16, in plain C.
 *
 * The backend half (kiln_backend_plugin_entry) is what a new device family writes; the kernel
 * half (kiln_plugin_entry) is an ordinary version 2 kernel plugin whose vendor is "hostcc". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attention/params.h"
#include "kiln/backend_plugin.h"
#include "kiln/plugin.h"

#define EXPORT __attribute__((visibility("default")))

static int fail(kiln_backend_error* err, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(err->message, sizeof(err->message), format, args);
  va_end(args);
  return 1;
}

/* ---- devices: the host, as one device and one target */

static const kiln_backend_target host_target = {"hostcc-cpu", 1, "hostcc:c11", 1, 1u << 20, 0, 1, NULL};

static int device_count(int32_t* count, kiln_backend_error* err) {
  (void)err;
  *count = 1;
  return 0;
}

static int describe_device(int32_t index, kiln_backend_target* out, kiln_backend_error* err) {
  if (index != 0) return fail(err, "hostcc has one device, not %d", index);
  *out = host_target;
  out->device_name = "the host CPU";
  return 0;
}

static int runtime_version(int32_t* version, kiln_backend_error* err) {
  (void)err;
  *version = 1;
  return 0;
}

static int memory_info(int32_t device, uint64_t* free_bytes, uint64_t* total_bytes, kiln_backend_error* err) {
  (void)device;
  (void)err;
  *total_bytes = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  *free_bytes = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  return 0;
}

/* ---- compile: source and headers into a scratch folder, cc -shared, the .so read back */

static const char* compiler(void) {
  const char* cc = getenv("HOSTCC");
  return cc != NULL && *cc ? cc : "cc";
}

/* Runs a shell command; its combined output goes to `log`. */
static int run(const char* command, kiln_backend_write_fn write, void* log) {
  FILE* pipe = popen(command, "r");
  if (pipe == NULL) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) write(log, buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "wb");
  if (f == NULL) return 1;
  const size_t length = strlen(text);
  const int ok = fwrite(text, 1, length, f) == length;
  return fclose(f) == 0 && ok ? 0 : 1;
}

/* The identity: the compiler's own version line, which a different cc changes. */
static int compiler_identity(const char* target, kiln_backend_write_fn write, void* sink, kiln_backend_error* err) {
  (void)target;
  char command[512];
  snprintf(command, sizeof(command), "%s --version 2>&1 | head -n 1", compiler());
  if (run(command, write, sink) != 0) return fail(err, "'%s --version' failed", compiler());
  return 0;
}

static int compile(const kiln_backend_compile_request* r, kiln_backend_write_fn write, void* binary, void* log, kiln_backend_error* err) {
  char folder[] = "/tmp/kiln-hostcc-XXXXXX";
  if (mkdtemp(folder) == NULL) return fail(err, "mkdtemp failed");
  char path[4096], command[16384];
  int status = 0;
  for (uint32_t i = 0; i < r->num_headers && status == 0; ++i) {
    snprintf(path, sizeof(path), "%s/%s", folder, r->header_names[i]);
    char* slash = strrchr(path, '/');
    *slash = '\0';
    snprintf(command, sizeof(command), "mkdir -p '%s'", path);
    status = system(command);
    *slash = '/';
    if (status == 0) status = write_file(path, r->header_texts[i]);
  }
  snprintf(path, sizeof(path), "%s/kernel.c", folder);
  if (status == 0) status = write_file(path, r->source);
  int length =
      snprintf(command, sizeof(command), "cd '%s' && %s -std=c11 -O2 -fPIC -shared -I. -o kernel.so kernel.c -lm", folder, compiler());
  for (uint32_t i = 0; i < r->num_options && length < (int)sizeof(command); ++i) {
    length += snprintf(command + length, sizeof(command) - (size_t)length, " '%s'", r->options[i]);
  }
  snprintf(command + length, sizeof(command) - (size_t)length, " 2>&1");
  if (status == 0) status = run(command, write, log);
  if (status == 0) {
    /* The binary: the target's name, a NUL, then the shared object. */
    snprintf(path, sizeof(path), "%s/kernel.so", folder);
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
      status = 1;
    } else {
      write(binary, host_target.arch, strlen(host_target.arch) + 1);
      char buffer[65536];
      size_t n;
      while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) write(binary, buffer, n);
      fclose(f);
    }
  }
  snprintf(command, sizeof(command), "rm -rf '%s'", folder);
  if (system(command) != 0) status = status ? status : 1;
  return status == 0 ? 0 : fail(err, "%s failed to compile '%s' (see the log)", compiler(), r->kernel_name);
}

static int check_binary(const char* target, const void* binary, size_t size, kiln_backend_error* err) {
  const size_t name = strlen(host_target.arch) + 1;
  if (strcmp(target, host_target.arch) != 0) return fail(err, "hostcc builds %s only, not %s", host_target.arch, target);
  if (size < name + 4 || memcmp(binary, host_target.arch, name) != 0) return fail(err, "not a hostcc binary");
  if (memcmp((const char*)binary + name,
             "\x7f"
             "ELF",
             4) != 0)
    return fail(err, "not a shared object after the hostcc header");
  return 0;
}

/* ---- launch: the shared object through a temporary file and dlopen; one call per block */

typedef void (*block_fn)(const void* params, uint32_t x, uint32_t y, uint32_t z);
typedef struct {
  void* library;
  block_fn block;
} loaded;

static int load(int32_t device, const void* binary, size_t size, const char* entry, void** function, kiln_backend_error* err) {
  (void)device;
  if (check_binary(host_target.arch, binary, size, err) != 0) return 1;
  const size_t name = strlen(host_target.arch) + 1;
  char path[] = "/tmp/kiln-hostcc-XXXXXX.so";
  const int fd = mkstemps(path, 3);
  if (fd < 0) return fail(err, "mkstemps failed");
  const int written = write(fd, (const char*)binary + name, size - name) == (ssize_t)(size - name);
  close(fd);
  void* library = written ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  unlink(path); /* mapped already; nothing left behind */
  if (library == NULL) return fail(err, "dlopen: %s", written ? dlerror() : "short write");
  void* symbol = dlsym(library, entry);
  if (symbol == NULL) {
    dlclose(library);
    return fail(err, "the binary has no function '%s'", entry);
  }
  loaded* f = malloc(sizeof(loaded));
  f->library = library;
  f->block = (block_fn)symbol;
  *function = f;
  return 0;
}

static void unload(void* function) {
  loaded* f = function;
  dlclose(f->library);
  free(f);
}

static int launch(int32_t device, void* function, const kiln_backend_launch_request* r, kiln_backend_error* err) {
  (void)device;
  const kiln_plugin_launch* s = &r->shape;
  if (s->block[0] * s->block[1] * s->block[2] != 1) return fail(err, "hostcc kernels run one work item per block");
  const loaded* f = function;
  for (uint32_t z = 0; z < s->grid[2]; ++z)
    for (uint32_t y = 0; y < s->grid[1]; ++y)
      for (uint32_t x = 0; x < s->grid[0]; ++x) f->block(r->params, x, y, z);
  return 0;
}

/* ---- memory: the host's; every call completes before it returns */

static void* alloc(int32_t device, uint64_t bytes, kiln_backend_error* err) {
  (void)device;
  void* p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == NULL) fail(err, "out of memory (%llu bytes)", (unsigned long long)bytes);
  return p;
}
static void release(void* pointer) { free(pointer); }
static int fill(void* pointer, uint8_t value, uint64_t bytes, void* stream, kiln_backend_error* err) {
  (void)stream;
  (void)err;
  memset(pointer, value, bytes);
  return 0;
}
static int copy(void* destination, const void* source, uint64_t bytes, int32_t direction, void* stream, kiln_backend_error* err) {
  (void)direction;
  (void)stream;
  (void)err;
  memcpy(destination, source, bytes);
  return 0;
}
static int synchronize(void* stream, kiln_backend_error* err) {
  (void)stream;
  (void)err;
  return 0;
}

EXPORT const kiln_backend_plugin* kiln_backend_plugin_entry(void) {
  static const kiln_backend_plugin table = {KILN_BACKEND_ABI_VERSION,
                                            "hostcc",
                                            "hostcc-cc",
                                            "cores",
                                            1,
                                            &host_target,
                                            device_count,
                                            describe_device,
                                            runtime_version,
                                            memory_info,
                                            compiler_identity,
                                            compile,
                                            check_binary,
                                            load,
                                            unload,
                                            launch,
                                            alloc,
                                            release,
                                            fill,
                                            copy,
                                            synchronize};
  return &table;
}

/* ---- the kernel: bf16 prefill attention in C, one (query row, head, sequence) per block.
 * Headers come from kiln by name (attention/params.h); system headers are not allowed in kernel
 * sources, so it uses the compiler's built-ins. */

static const char* prefill_source =
    "#include \"attention/params.h\"\n"
    "static float bf16_to_float(unsigned short b) { union { unsigned u; float f; } v = {(unsigned)b << 16}; return v.f; }\n"
    "static unsigned short float_to_bf16(float f) {\n"
    "  union { float f; unsigned u; } v = {f};\n"
    "  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((v.u >> 16) | 0x40u);\n"
    "  return (unsigned short)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "void hostcc_prefill(const KilnPrefillParams* p, unsigned row, unsigned head, unsigned b) {\n"
    "  const int q_begin = p->cu_seqlens_q[b], len_q = p->cu_seqlens_q[b + 1] - q_begin;\n"
    "  const int k_begin = p->cu_seqlens_k[b], len_k = p->cu_seqlens_k[b + 1] - k_begin;\n"
    "  if ((int)row >= len_q) return;\n"
    "  const int kv_head = (int)head / (p->num_heads_q / p->num_heads_kv), position = (int)row + len_k - len_q;\n"
    "  int lo = 0, hi = len_k;\n"
    "  if (p->causal && position + 1 < hi) hi = position + 1;\n"
    "  if (p->window_left >= 0 && position - p->window_left > lo) lo = position - p->window_left;\n"
    "  const unsigned short* q = (const unsigned short*)p->q + (q_begin + row) * p->q_row_stride + head * p->q_head_stride;\n"
    "  float acc[HEAD_DIM] = {0}, m = -__builtin_inff(), l = 0.0f;\n"
    "  for (int j = lo; j < hi; ++j) {\n"
    "    const unsigned short* k = (const unsigned short*)p->k + (k_begin + j) * p->k_row_stride + kv_head * p->k_head_stride;\n"
    "    const unsigned short* v = (const unsigned short*)p->v + (k_begin + j) * p->v_row_stride + kv_head * p->v_head_stride;\n"
    "    float s = 0.0f;\n"
    "    for (int d = 0; d < HEAD_DIM; ++d) s += bf16_to_float(q[d]) * bf16_to_float(k[d]);\n"
    "    s *= p->softmax_scale;\n"
    "    if (p->softcap > 0.0f) s = p->softcap * __builtin_tanhf(s / p->softcap);\n"
    "    const float m_new = s > m ? s : m, rescale = m == -__builtin_inff() ? 0.0f : __builtin_expf(m - m_new), e = __builtin_expf(s - "
    "m_new);\n"
    "    for (int d = 0; d < HEAD_DIM; ++d) acc[d] = acc[d] * rescale + e * bf16_to_float(v[d]);\n"
    "    l = l * rescale + e;\n"
    "    m = m_new;\n"
    "  }\n"
    "  if (p->sinks) {\n"
    "    const float sink = p->sinks[head], m_new = sink > m ? sink : m;\n"
    "    const float rescale = m == -__builtin_inff() ? 0.0f : __builtin_expf(m - m_new);\n"
    "    for (int d = 0; d < HEAD_DIM; ++d) acc[d] *= rescale;\n"
    "    l = l * rescale + __builtin_expf(sink - m_new);\n"
    "    m = m_new;\n"
    "  }\n"
    "  unsigned short* out = (unsigned short*)p->out + (q_begin + row) * p->out_row_stride + head * p->out_head_stride;\n"
    "  for (int d = 0; d < HEAD_DIM; ++d) out[d] = float_to_bf16(l > 0.0f ? acc[d] / l : 0.0f);\n"
    "  if (p->lse) p->lse[(q_begin + row) * p->lse_row_stride + head] = l > 0.0f ? m + __builtin_logf(l) : -__builtin_inff();\n"
    "}\n";

/* head_dim becomes a compile-time constant, so each head_dim is its own binary in kiln's cache. */
static int specialize(const char* signature, const char* target, char* name, size_t name_size, char* options, size_t options_size) {
  (void)target;
  const char* d = strstr(signature, "head_dim=");
  if (d == NULL) return snprintf(name, name_size, "no head_dim in %s", signature), 1;
  snprintf(name, name_size, "hostcc_prefill");
  snprintf(options, options_size, "-DHEAD_DIM=%d", atoi(d + 9));
  return 0;
}

static int launch_shape(const void* params, const char* target, kiln_plugin_launch* l) {
  (void)target;
  const KilnPrefillParams* p = params;
  l->grid[0] = (uint32_t)p->max_seqlen_q;
  l->grid[1] = (uint32_t)p->num_heads_q;
  l->grid[2] = (uint32_t)p->batch;
  return 0;
}

EXPORT const kiln_plugin* kiln_plugin_entry(void) {
  static const kiln_plugin_kernel_v2 kernels[] = {{
      .name = "hostcc.attention.prefill",
      .family = "attention",
      .mode = "prefill",
      .vendor = "hostcc",
      .features = "hostcc:c11",
      .priority = 0,  /* REFERENCE: the oracle `kiln check` compares against on this backend */
      .source = NULL, /* set below: designated initializers need constants */
      .signatures = "dtype=bf16;head_dim=32|64|128;window=0|1;sinks=0|1;softcap=0|1;lse=0|1",
      .specialize = specialize,
      .launch = launch_shape,
  }};
  static kiln_plugin_kernel_v2 filled[1];
  filled[0] = kernels[0];
  filled[0].source = prefill_source;
  static const kiln_plugin plugin = {KILN_PLUGIN_ABI_VERSION, "hostcc", 1, NULL, filled};
  return &plugin;
}
