#!/usr/bin/env bash
# Builds kiln here (Release) and gathers what the GPU machine needs into .carry/: the device has
# nvcc, CMake and PyTorch but no apt, so the Debian libraries kiln links travel with the build.
# On the device, scripts/device-run.sh uses it. Paths baked into the build are /work/main/...;
# device-run.sh links /work/main to the copy of the tree there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-device"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON >/dev/null
ninja -C "$build" -j2 kiln kiln-compile-worker kiln_gpu_tests kiln_bench_host kiln_first_call kiln_test_plugin kiln_test_plugin_v2 kiln_test_plugin_acme kiln-fake-worker-crash kiln-fake-worker-hang >/dev/null
rm -rf "$root/.carry" && mkdir -p "$root/.carry/build-device/lib" "$root/.carry/deps"
cp -a "$build/bin" "$build/libexec" "$build/test-plugins" "$root/.carry/build-device/"
cp -a "$build"/lib/libkiln.so* "$root/.carry/build-device/lib/"
for lib in libfmt.so.9 libxxhash.so.0 libbenchmark.so.1debian libsqlite3.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$root/.carry/deps/" 2>/dev/null || cp -L "/usr/lib/x86_64-linux-gnu/$lib" "$root/.carry/deps/"
done
# The Python wheel, installed on the device beside its own torch (scripts/device-python.sh).
python3 -m pip wheel -q --no-deps -w "$root/.carry/wheel" "$root"
python3 -m pip download -q pytest -d "$root/.carry/pydeps"  # pure-Python wheels, for a device without pytest
# The newest Transformers, to run the Transformers plug-in's tests with it beside the device's own.
python3 -m pip download -q --no-deps transformers -d "$root/.carry/pydeps"
du -sh "$root/.carry"
