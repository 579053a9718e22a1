#!/usr/bin/env bash
# Runs on the GPU machine over a copy of the tree with .carry/ (scripts/device-bundle.sh): times
# kernel-source variants side by side in one call, through KILN_KERNEL_SOURCES, alternating the
# variants within each round so drift in clocks or temperature spreads over all of them.
#   scripts/device-ab.sh [-r ROUNDS] NAME=DIR[@LIBDIR]... -- OPERATOR SHAPE [OPERATOR SHAPE...]
# DIR is a kernel-sources/ tree (stage an older one here with
#   mkdir -p .carry/ks-REV && git archive REV kernel-sources | tar -x --strip-components=1 -C .carry/ks-REV).
# LIBDIR, where a variant changes what the library itself compiles (a launch shape, a header the
# registrations share), holds that variant's libkiln.so, found first on LD_LIBRARY_PATH (the tools'
# RUNPATH yields to it).
# Prints one line per shape: each variant's median ms per round. The first call of a variant
# compiles it (kept in $KILN_CACHE_DIR for the rest of the call).
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
rounds=2
[ "${1:-}" = -r ] && { rounds=$2; shift 2; }
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do variants+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
[ ${#variants[@]} -gt 0 ] && [ $# -ge 2 ] || { echo "usage: $0 [-r ROUNDS] NAME=DIR[@LIBDIR]... -- OPERATOR SHAPE..." >&2; exit 2; }
median() { python3 -c "import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.find('{'):])['median_ms'], 4))" 2>/dev/null || echo "-"; }
while [ $# -ge 2 ]; do
  op=$1 shape=$2
  shift 2
  line="$op $shape:"
  for round in $(seq "$rounds"); do
    for v in "${variants[@]}"; do
      spec=${v#*=} lib=
      [ "${spec#*@}" != "$spec" ] && lib=$(realpath "${spec#*@}"):
      ms=$(LD_LIBRARY_PATH=$lib$LD_LIBRARY_PATH KILN_KERNEL_SOURCES=$(realpath "${spec%@*}") timeout 120 $bin/kiln bench "$op" --json --time-ms 150 \
        --shape "$shape" | median)
      line="$line ${v%%=*} $ms"
    done
  done
  echo "$line" | tee -a "$out/ab.txt"
done
