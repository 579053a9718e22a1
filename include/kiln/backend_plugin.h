/* The ABI an out-of-tree backend implements: a new vendor or device family, with its own devices,
 * targets, run-time compiler, loader and launcher. A backend plugin is a shared library on
 * KILN_PLUGIN_PATH that exports
 *
 *     const kiln_backend_plugin* kiln_backend_plugin_entry(void);
 *
 * and usually also kiln_plugin_entry (kiln/plugin.h) with version 2 kernels whose `vendor` is the
 * backend's name. kiln registers the backend before the library's kernels, so they can name it.
 * Its binaries take kiln's keys and cache like any other: the key holds the kernel's source, the
 * options, the target and the compiler identity the backend reports; every binary the compiler
 * returns or a cache serves passes check_binary before load.
 *
 * Conventions: every function returning int returns 0 on success, else nonzero with a
 * NUL-terminated message in err->message. "Device memory" is whatever alloc returns; operators
 * receive such pointers in their tensors and the kernels receive them in the parameter block
 * (include/kiln/kernel-params/<family>/params.h), copied byte for byte. A `stream` is the
 * backend's queue handle; NULL means the backend's default queue for the device. Compiles run in
 * the calling process (the plugin isolates its compiler if it must). Every pointer the plugin
 * returns stays valid while the library is loaded (kiln never unloads it).
 *
 * You MUST bump KILN_BACKEND_ABI_VERSION when any struct below changes layout or meaning. */
#ifndef KILN_BACKEND_PLUGIN_H
#define KILN_BACKEND_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_BACKEND_ABI_VERSION 1u
#define KILN_BACKEND_ABI_MIN_VERSION 1u

typedef struct kiln_backend_error {
  char message[1024];
} kiln_backend_error;

/* Receives bytes a function produces (a binary, a log, an identity); may be called many times. */
typedef void (*kiln_backend_write_fn)(void* sink, const void* bytes, size_t size);

/* A compile target, or a detected device described as one. */
typedef struct kiln_backend_target {
  const char* arch;     /* the exact compile target, unique across kiln, e.g. "opencl-pthread-x86_64" */
  int32_t arch_version; /* comparable among this backend's targets (kernels' min/max arch) */
  const char* features; /* comma-separated capabilities kernels may require */
  int32_t compute_units;
  uint64_t shared_memory_per_block; /* bytes of work-group local memory */
  uint64_t l2_bytes;
  int32_t warp_size;       /* threads that run in lockstep; 1 where there is no such thing */
  const char* device_name; /* for a device; NULL for a target */
} kiln_backend_target;

typedef struct kiln_backend_compile_request {
  const char* target;      /* one of the backend's targets */
  const char* kernel_name; /* for messages */
  const char* source;      /* the whole program */
  const char* entry;       /* the kernel's name expression */
  const char* const* options;
  uint32_t num_options;
  const char* const* header_names; /* headers the source includes, by name */
  const char* const* header_texts;
  uint32_t num_headers;
} kiln_backend_compile_request;

typedef struct kiln_backend_launch_request {
  const void* params; /* the operator's parameter block, passed to the kernel as its bytes */
  size_t params_bytes;
  kiln_plugin_launch shape; /* from the kernel's launch(): grid, block, local memory, ... */
  void* stream;
} kiln_backend_launch_request;

enum { KILN_BACKEND_COPY_TO_DEVICE = 1, KILN_BACKEND_COPY_TO_HOST = 2 };

typedef struct kiln_backend_plugin {
  uint32_t abi_version;          /* the KILN_BACKEND_ABI_VERSION it was built against */
  const char* name;              /* vendor and backend name, e.g. "opencl"; kernels name it as vendor */
  const char* compiler_name;     /* e.g. "opencl-c": cache rows and reports */
  const char* compute_unit_name; /* what `kiln devices` calls its multiprocessors, e.g. "CUs" */
  /* Targets it compiles for with or without their device (offline warm-up): num_targets of them. */
  uint32_t num_targets;
  const kiln_backend_target* targets;

  /* ---- devices */
  /* Number of usable devices (0: none; then err says why). */
  int (*device_count)(int32_t* count, kiln_backend_error* err);
  /* Device `index` as a target; strings stay valid while the library is loaded. */
  int (*describe_device)(int32_t index, kiln_backend_target* out, kiln_backend_error* err);
  int (*runtime_version)(int32_t* version, kiln_backend_error* err);
  int (*memory_info)(int32_t device, uint64_t* free_bytes, uint64_t* total_bytes, kiln_backend_error* err);

  /* ---- compile */
  /* Everything about the compiler that changes its output (versions of the compiler, driver and
   * device libraries), written to `sink`: part of every key. */
  int (*compiler_identity)(const char* target, kiln_backend_write_fn write, void* sink, kiln_backend_error* err);
  /* Writes the binary to `binary`, and the compiler's log (on success or failure) to `log`. */
  int (*compile)(const kiln_backend_compile_request* request, kiln_backend_write_fn write, void* binary, void* log,
                 kiln_backend_error* err);
  /* 0 when `binary` is this backend's binary for `target`; else why not in err. */
  int (*check_binary)(const char* target, const void* binary, size_t size, kiln_backend_error* err);

  /* ---- launch */
  int (*load)(int32_t device, const void* binary, size_t size, const char* entry, void** function, kiln_backend_error* err);
  void (*unload)(void* function);
  int (*launch)(int32_t device, void* function, const kiln_backend_launch_request* request, kiln_backend_error* err);

  /* ---- memory */
  /* Device memory of `device`; NULL with err set when it cannot. */
  void* (*alloc)(int32_t device, uint64_t bytes, kiln_backend_error* err);
  void (*free)(void* pointer);
  /* Ordered on `stream`. */
  int (*fill)(void* pointer, uint8_t value, uint64_t bytes, void* stream, kiln_backend_error* err);
  /* Ordered on `stream`; a copy to the host is complete when synchronize() returns. */
  int (*copy)(void* destination, const void* source, uint64_t bytes, int32_t direction, void* stream, kiln_backend_error* err);
  /* Waits for everything enqueued on `stream` (NULL: on every queue of the backend). */
  int (*synchronize)(void* stream, kiln_backend_error* err);
} kiln_backend_plugin;

typedef const kiln_backend_plugin* (*kiln_backend_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_BACKEND_PLUGIN_H */
