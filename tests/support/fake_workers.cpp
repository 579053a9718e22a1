// Stand-ins for kiln-compile-worker that misbehave, to test compile isolation and the worker
// protocol. The executable's name picks the behaviour after reading the request:
//   kiln-fake-worker-crash        SIGSEGV
//   kiln-fake-worker-hang         never answers
//   kiln-fake-worker-malformed    an error reply of this protocol whose "code" is text
//   kiln-fake-worker-notamap      an error reply that is a CBOR integer, not a map
//   kiln-fake-worker-badtag       a reply of unknown kind (status byte 7)
//   kiln-fake-worker-oldprotocol  a success reply without a protocol version (an older worker)
//   kiln-fake-worker-oversized    a reply larger than kiln accepts
//   kiln-fake-worker-orphan       exits 1 at once, leaving a child that holds its output for 60 s
//   kiln-fake-worker-tmpdir       prints its TMPDIR, leaves a file there, then never answers
//   kiln-fake-worker-selfkill     killed by SIGKILL, as by the OOM killer
#include <unistd.h>

#include <sys/types.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void write_all(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const ssize_t w = write(1, p, size);
    if (w <= 0) return;
    p += w;
    size -= static_cast<size_t>(w);
  }
}

bool is(const char* name, const char* mode) { return std::strstr(name, mode) != nullptr; }

}  // namespace

int main(int, char** argv) {
  char buf[4096];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  const char* name = argv[0];
  if (is(name, "crash")) std::raise(SIGSEGV);
  if (is(name, "malformed")) {
    const unsigned char reply[] = {1,   0xA2, 0x68, 'p', 'r', 'o', 't', 'o',  'c', 'o',
                                   'l', 0x02, 0x64, 'c', 'o', 'd', 'e', 0x61, 'x'};  // {"protocol": 2, "code": "x"}
    write_all(reply, sizeof(reply));
    return 0;
  }
  if (is(name, "notamap")) {
    const unsigned char reply[] = {1, 0x01};  // the integer 1
    write_all(reply, sizeof(reply));
    return 0;
  }
  if (is(name, "badtag")) {
    const unsigned char reply[] = {7, 0xA0};
    write_all(reply, sizeof(reply));
    return 0;
  }
  if (is(name, "oldprotocol")) {
    const unsigned char reply[] = {0, 0xA0};  // an empty map: no "protocol"
    write_all(reply, sizeof(reply));
    return 0;
  }
  if (is(name, "orphan")) {
    if (fork() == 0) {
      sleep(60);  // holds stdout and stderr open
      _exit(0);
    }
    return 1;
  }
  if (is(name, "tmpdir")) {
    const char* dir = std::getenv("TMPDIR");
    std::fprintf(stderr, "TMPDIR=%s\n", dir ? dir : "(none)");
    std::fflush(stderr);
    if (dir) {
      const std::string file = std::string(dir) + "/left-behind";
      if (FILE* f = std::fopen(file.c_str(), "w")) std::fclose(f);
    }
    while (true) pause();
  }
  if (is(name, "selfkill")) std::raise(SIGKILL);
  if (is(name, "oversized")) {
    const std::vector<unsigned char> chunk(1 << 20, 0);
    for (int i = 0; i < 300; ++i) write_all(chunk.data(), chunk.size());  // 300 MiB
    return 0;
  }
  while (true) pause();
}
