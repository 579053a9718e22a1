// Fuzzes what comes back from a compile worker (its stdout: a status byte, then CBOR) and what a
// worker reads (the request's CBOR): either is accepted or raises kiln::Error, nothing else. A
// worker is a separate process that may be replaced, crash mid-write or run out of memory, so
// every byte of its reply is untrusted.
#include <cstdint>
#include <vector>

#include "backends/compile_request.hpp"
#include "jit/compiler.hpp"
#include "kiln/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  kiln::detail::CompileRequest request;
  request.kernel_name = "fuzz.kernel";
  request.target = "sm_90a";
  try {
    const kiln::detail::CompileResult r = kiln::detail::read_worker_reply(request, bytes, {"-std=c++17"}, "stderr text");
    if (r.lowered_name.size() > size) __builtin_trap();  // nothing comes from nowhere
  } catch (const kiln::Error&) {
  }
  if (size > 0) {
    try {
      (void)kiln::detail::decode_request(std::vector<uint8_t>(bytes.begin() + 1, bytes.end()));
    } catch (const kiln::Error&) {
    }
  }
  return 0;
}
