#!/usr/bin/env bash
# The sanitizer and fuzzing half of the test suite (the README's second command runs it after the
# plain suite):
#   1. the CPU suite built with AddressSanitizer + UndefinedBehaviorSanitizer (gcc);
#   2. the concurrency tests built with ThreadSanitizer (gcc);
#   3. the libFuzzer targets (clang): each replays its corpus, then fuzzes for KILN_FUZZ_SECONDS.
# Each build lives in its own directory; any finding fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
root=$(pwd)

# libnvrtc is not instrumented and keeps allocations for the life of the process.
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# GCC 12's runtime takes a malloc'd dynamic-TLS block that happens to sit 16 bytes past a page
# boundary for a pre-2.25 glibc header and reads its bounds from the two words before it; when
# that happens in a thread of a dlopen'ed library with TLS (PoCL's workers), LeakSanitizer's
# tracer segfaults at exit ("Tracer caught signal 11") and the test fails with no leak found.
# Without the interceptor nothing reads those words; leak checking stays on.
export ASAN_OPTIONS="intercept_tls_get_addr=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer: CPU suite =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON -DKILN_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j"$jobs"
# The installed-consumer test builds a plain program against the instrumented library; it runs in
# the plain suite.
ctest --test-dir build-asan -j"$jobs" -L cpu -E consumer_find_package --output-on-failure

echo "== ThreadSanitizer: concurrency tests =="
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON -DKILN_SANITIZE=thread >/dev/null
cmake --build build-tsan -j"$jobs"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" ctest --test-dir build-tsan -j"$jobs" --output-on-failure \
  -R 'Concurrent|SameKeyCompilesOnce|EveryKernelForEveryClaimedTarget|SixteenProcesses|EveryBuiltinManifest|CaptureFromSeveral|Log\.|RemoteCacheTest'

echo "== libFuzzer targets =="
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_BUILD_FUZZERS=ON \
  -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_FUZZ_SECONDS="${KILN_FUZZ_SECONDS:-15}" >/dev/null
cmake --build build-fuzz -j"$jobs"
ctest --test-dir build-fuzz -j"$jobs" -L fuzz --output-on-failure
