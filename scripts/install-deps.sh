#!/usr/bin/env bash
# Installs what kiln needs to build and test, from Debian packages only. The CUDA toolkit is not
# installed here: kiln uses the one already at /usr/local/cuda (cuda.h and nvrtc.h at build time,
# libnvrtc at run time) and never links it.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libsqlite3-dev libxxhash-dev libgtest-dev libbenchmark-dev
          nlohmann-json3-dev libcli11-dev libfmt-dev
          clang libclang-rt-14-dev  # libFuzzer targets (scripts/sanitizers.sh)
          clang-format-14           # the format_check test
          clang-22 lld-22 llvm-22   # the offline AMD compiler (gfx942, gfx950), its linker, llvm-objdump
          libamdhip64-dev libhiprtc-builtins5  # Debian's ROCm 5.2: hipRTC (gfx90a) and the HIP runtime
          util-linux                # setpriv: the read-only-cache test runs a process as another user
          libsodium23               # Ed25519 signatures of cache rows (loaded by libkiln at first use)
          libhiredis-dev            # the remote cache tier's Redis client (its header; the library is loaded)
          redis-server              # a real Redis for the remote tier's tests
          ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd)  # the OpenCL backend plugin and its CPU device
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
for f in /usr/local/cuda/include/cuda.h /usr/local/cuda/include/nvrtc.h; do
  [ -f "$f" ] || { echo "install-deps: $f is missing: kiln needs the CUDA toolkit at /usr/local/cuda" >&2; exit 1; }
done
echo "install-deps: all build dependencies present"
