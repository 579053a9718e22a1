// kiln-compile-worker: runs one compile for a parent kiln process (jit/compiler.hpp has the
// protocol), so that a compiler crash or hang costs this process, not the caller's.
#include <unistd.h>

#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/compile_request.hpp"
#include "jit/compiler.hpp"
#include "kiln/error.hpp"

namespace {

void write_all(const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = write(1, bytes.data() + done, bytes.size() - done);
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}

}  // namespace

int main() {
  std::vector<uint8_t> input;
  char buf[65536];
  ssize_t r;
  while ((r = read(0, buf, sizeof(buf))) > 0) input.insert(input.end(), buf, buf + r);
  std::vector<uint8_t> reply;
  try {
    const kiln::detail::CompileRequest request = kiln::detail::decode_request(input);
    // The parent enforces the time limit on this whole process; clang's own limit is only a
    // backstop.
    kiln::detail::CompileResult result = kiln::detail::compile_in_this_process(request, 24 * 3600.0);
    reply = kiln::detail::encode_result(result);
    reply.insert(reply.begin(), kiln::detail::kWorkerOk);
  } catch (const kiln::Error& e) {
    nlohmann::json j = {{"code", static_cast<int>(e.code())},
                        {"message", e.what()},
                        {"log", e.compile_log()},
                        {"options", e.compile_options()},
                        {"target", e.compile_target()}};
    reply = nlohmann::json::to_cbor(j);
    reply.insert(reply.begin(), kiln::detail::kWorkerError);
  } catch (const std::exception& e) {
    nlohmann::json j = {{"code", static_cast<int>(kiln::ErrorCode::kInternal)}, {"message", e.what()}};
    reply = nlohmann::json::to_cbor(j);
    reply.insert(reply.begin(), kiln::detail::kWorkerError);
  }
  write_all(reply);
  return 0;
}
