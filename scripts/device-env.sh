# Sourced by the scripts that run on the GPU machine: makes the build carried in .carry/
# (scripts/device-bundle.sh) usable there. Paths baked into that build are /work/main/...
root=$(pwd)
mkdir -p /work && { [ -e /work/main ] || ln -s "$root" /work/main; }
[ -e "$root/build-device" ] || ln -s "$root/.carry/build-device" "$root/build-device"
export LD_LIBRARY_PATH="$root/.carry/deps:${LD_LIBRARY_PATH:-}"
export KILN_CACHE_DIR=/tmp/kiln-cache
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
bin=/work/main/build-device/bin
