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

// Status byte kWorkerError, then the error map the parent validates (jit/compiler.cpp).
std::vector<uint8_t> error_reply(int code, const std::string& message, const std::string& log, const std::vector<std::string>& options) {
  nlohmann::json j = {
      {"protocol", kiln::detail::kWorkerProtocolVersion}, {"code", code}, {"message", message}, {"log", log}, {"options", options}};
  std::vector<uint8_t> reply = nlohmann::json::to_cbor(j);
  reply.insert(reply.begin(), kiln::detail::kWorkerError);
  return reply;
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
    reply = error_reply(static_cast<int>(e.code()), e.what(), e.compile_log(), e.compile_options());
  } catch (const std::bad_alloc&) {
    reply = error_reply(static_cast<int>(kiln::ErrorCode::kInternal), "the compile worker ran out of memory", "", {});
  } catch (const std::exception& e) {
    reply = error_reply(static_cast<int>(kiln::ErrorCode::kInternal), e.what(), "", {});
  } catch (...) {
    reply = error_reply(static_cast<int>(kiln::ErrorCode::kInternal), "the compile worker failed with an unknown exception", "", {});
  }
  write_all(reply);
  return 0;
}
