// Warm-cache deployment: model manifests, parallel warm-up of a cache for a fleet's targets, and
// capture of the signatures a running process uses.
//
// A manifest (cache/manifests/*.json) is a JSON object:
//   {
//     "kiln_manifest": 1,                      // format version, required
//     "model": "gpt-oss-120b",                 // required
//     "description": "...",                    // optional
//     "operators": [                           // required, non-empty
//       {"op": "mha_decode_with_kvcache",      // an operator name
//        "signature": {"dtype": "bf16", "kv_dtype": ["bf16", "e4m3"], "page_size": [16, 64], ...}}
//     ],
//     "buckets": {"decode_batch": [1, 8, 64]}  // optional: run-time sizes, arrays of positive ints
//   }
// Each signature lists exactly the keys kiln::signature_keys() gives for its operator; a value is
// a string, a non-negative integer or a boolean, or a non-empty array of them, and arrays expand
// to every combination. Buckets are the run-time sizes that may change which kernel or
// specialization runs; no kernel of this kiln depends on them yet, so they are validated and kept,
// not expanded. Errors name the file, line and field: "gpt-oss-120b.json:14: operators[0]...".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/signature.hpp"

namespace kiln {

struct Manifest {
  std::string source;  // file path or "embedded:<name>"
  std::string model;
  std::string description;
  std::vector<Signature> signatures;  // expanded, each once, in file order
  std::map<std::string, std::vector<int64_t>> buckets;
};

inline constexpr int kManifestFormatVersion = 1;

// `name_or_path`: a file, or the model name of a manifest built into kiln ("gpt-oss-120b").
// Throws kiln::Error(kInvalidArgument) naming file, line and field.
Manifest load_manifest(const std::string& name_or_path);
Manifest parse_manifest(const std::string& text, const std::string& source);
std::vector<std::string> builtin_manifests();  // model names

struct WarmupItem {
  std::string signature;  // canonical
  std::string target;
  std::string kernel;      // selected kernel, when selection succeeded
  bool reference = false;  // that kernel is a REFERENCE one: correct, slow, a fallback to notice
  std::string origin;      // where the binary came from: "compiled", "disk", "seed", "remote" or "memory"
  // kShared: the same binary as another item of this run (the kernel does not specialize on the
  // properties in which the two signatures differ).
  enum class Status { kCompiled, kCached, kShared, kFailed, kCancelled } status = Status::kFailed;
  std::string reason;   // for kFailed
  bool stored = false;  // the binary is in the on-disk cache (or a seed) for the next process
  // A binary came of it (compiled, cached or shared), whether or not it was stored.
  bool produced() const { return status == Status::kCompiled || status == Status::kCached || status == Status::kShared; }
  uint64_t bytes = 0;
  double milliseconds = 0;
};

struct WarmupProgress {
  size_t done = 0, total = 0, compiled = 0, cached = 0, shared = 0, failed = 0;
  double elapsed_seconds = 0;
  // The item that just finished; null in the reports made when an item starts and about once a
  // second while items run, which only update `running`.
  const WarmupItem* last = nullptr;
  struct Running {
    std::string signature, target;
    double seconds = 0;  // since the item started
  };
  std::vector<Running> running;  // the items in flight, longest-running first
};

struct WarmupOptions {
  std::vector<std::string> targets;                        // e.g. {"sm_90a"}; each from known_targets()
  int jobs = 0;                                            // parallel compiles; 0: one per core
  std::function<void(const WarmupProgress&)> on_progress;  // called after each item, serialized
  const std::atomic<bool>* cancel = nullptr;               // set it to stop starting new compiles
};

struct WarmupReport {
  std::vector<WarmupItem> items;
  size_t compiled = 0, cached = 0, shared = 0, failed = 0, cancelled = 0;
  size_t not_stored = 0;  // compiled or shared items whose binary did not reach the on-disk cache
  size_t reference = 0;   // items that selected a REFERENCE kernel
  uint64_t bytes = 0;     // of compiled and cached binaries
  double seconds = 0;
};

// Selects and compiles (or finds in the cache) every signature of the manifest for every target.
// Needs no GPU. Every item is reported; nothing throws for one item's failure.
WarmupReport warmup(const Manifest& manifest, const WarmupOptions& options);

// Shape capture: every distinct signature this process selects a kernel for is added to the
// manifest at `path` (created when absent; safe with several processes writing one file).
// KILN_CAPTURE=FILE does the same from the environment. An empty path stops capturing.
void set_capture_file(const std::string& path);

}  // namespace kiln
