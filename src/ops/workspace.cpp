// kiln::workspace_bytes: each operator's call run under a WorkspaceQuery (jit/operator_call.hpp).
#include "jit/operator_call.hpp"
#include "kiln/ops.hpp"

namespace kiln {
namespace {

template <typename Args>
size_t query(const Args& args, Stream stream, void (*op)(const Args&, Stream)) {
  size_t bytes = 0;
  const detail::WorkspaceQuery scope(&bytes);
  op(args, stream);
  return bytes;
}

}  // namespace

size_t workspace_bytes(const MhaPrefillArgs& args, Stream stream) { return query(args, stream, &mha_prefill); }
size_t workspace_bytes(const MhaDecodeArgs& args, Stream stream) { return query(args, stream, &mha_decode_with_kvcache); }
size_t workspace_bytes(const MhaExtendArgs& args, Stream stream) { return query(args, stream, &mha_extend_with_kvcache); }
size_t workspace_bytes(const KvAppendArgs& args, Stream stream) { return query(args, stream, &kv_cache_append); }
size_t workspace_bytes(const MoeArgs& args, Stream stream) { return query(args, stream, &moe_apply); }

}  // namespace kiln
