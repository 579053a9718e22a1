// The one path every operator takes after validation: select a kernel for the signature on the
// device's platform, get it compiled and loaded, launch it on the caller's stream.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "kiln/registry.hpp"
#include "kiln/tensor.hpp"

namespace kiln::detail {

// The compile-relevant properties of a call packed into integers, in a fixed order per operator:
// equal CallKeys mean equal Signatures. The hit path looks kernels up by this key, so it never
// builds strings; the Signature is built only on a miss.
struct CallKey {
  const void* op = nullptr;  // which operator: the address of its signature table
  std::array<int64_t, 15> fields{};
  bool operator==(const CallKey&) const = default;
};

struct OperatorCall {
  CallKey key;
  Signature (*make_signature)(const void* args);  // called on a miss only
  const void* args;                               // the operator's validated argument struct
  int device;
  // Parameter block (kernel-sources/<family>/params.h), passed by value. kiln fills its
  // launch-time fields (the workspace, tensor maps) before the launch.
  void* params;
  size_t params_bytes;
  Stream stream;
  // The parameter block's `workspace` field, for kernels that ask for scratch (KernelSpec::
  // workspace_bytes); null for operators without one.
  void** workspace = nullptr;
};

void run_operator(const OperatorCall& call);

// While a WorkspaceQuery lives, operator calls on its thread select, compile and load their kernel
// as under PrepareOnly, store the bytes of workspace that kernel would take for the call in
// `*bytes` (0 when it takes none; untouched by a call that launches nothing), and launch nothing.
class WorkspaceQuery {
 public:
  explicit WorkspaceQuery(size_t* bytes);
  ~WorkspaceQuery();
  WorkspaceQuery(const WorkspaceQuery&) = delete;
  WorkspaceQuery& operator=(const WorkspaceQuery&) = delete;

 private:
  size_t* outer_;
};

// Called with the signature of every call that misses the loaded-kernel table (the warm-up
// layer's shape capture installs one). Must not throw.
using MissObserver = void (*)(const Signature& sig);
void set_miss_observer(MissObserver observer);

}  // namespace kiln::detail
