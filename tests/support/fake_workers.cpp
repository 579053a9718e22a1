// Stand-ins for kiln-compile-worker that misbehave, to test compile isolation:
// built as kiln-fake-worker-crash (SIGSEGV after reading the request) and kiln-fake-worker-hang.
#include <unistd.h>

#include <csignal>
#include <cstring>

int main(int argc, char** argv) {
  char buf[4096];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  const char* name = argv[0];
  (void)argc;
  if (std::strstr(name, "crash") != nullptr) std::raise(SIGSEGV);
  while (true) pause();
}
