#!/usr/bin/env bash
# Compiles one kernel instance from kernel-sources/ on this machine (no GPU) with the CUDA toolkit's
# nvcc, and reports what decides much of its speed before a GPU sees it: ptxas's registers and
# spills, and where the local-memory loads and stores sit among the MMA instructions (a spill in
# an MMA loop costs far more than its bytes suggest; one outside the loops costs nothing). The
# second part needs cuobjdump and the nvdisasm it runs, which the toolkit here lacks: `pip install
# nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` puts both under the `nvidia` Python package (found
# below), or set CUOBJDUMP (with nvdisasm beside it or on PATH).
#   scripts/kernel-sass.sh HEADER 'kiln::template<args>' [ARCH]     (ARCH: sm_90a unless given)
# e.g. scripts/kernel-sass.sh moe/apply_stream.cuh 'kiln::moe_apply_stream<2, 1, 1, 0, false, 2, 2, false>'
# (the template instance is the one the kernel's registration names in its specialize(); the
# argument order is in src/kernels/*_signature.hpp). Prints the summary; the whole SASS is left in
# $KILN_SASS_OUT (default /tmp/kiln-sass/) as instance.sass.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
header=$1 instance=$2 arch=${3:-sm_90a}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${KILN_SASS_OUT:-/tmp/kiln-sass}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out"
rm -f "$out/instance.cubin"
# Taking the kernel's address instantiates it without naming its parameter type.
printf '#include "%s"\nvoid* kiln_sass_instance = reinterpret_cast<void*>(&%s);\n' "$header" "$instance" > "$out/instance.cu"
"$nvcc" -std=c++17 -arch="$arch" -cubin -DKILN_NVRTC -I"$root/kernel-sources" -Xptxas -v "$out/instance.cu" -o "$out/instance.cubin" \
  2>&1 | grep -E "error|Used|spill" || true
[ -s "$out/instance.cubin" ] || { echo "kernel-sass: the compile failed" >&2; exit 1; }
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || python3 -c 'import nvidia, pathlib, sys; \
  sys.stdout.write(next((str(p) for d in nvidia.__path__ for p in pathlib.Path(d).glob("*/bin/cuobjdump")), ""))' 2>/dev/null || true)}
if [ -z "$cuobjdump" ]; then
  echo "kernel-sass: no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or set CUOBJDUMP): registers and spills only"
  exit 0
fi
PATH="$(dirname "$cuobjdump"):$PATH" "$cuobjdump" -sass "$out/instance.cubin" > "$out/instance.sass"
# The SASS as runs of one kind of instruction in program order: MMAs (HMMA, HGMMA, MFMA-like),
# local loads and stores, CTA barriers, exits. Local-memory lines between two MMA runs of the
# same loop are the spills that matter.
python3 - "$out/instance.sass" <<'EOF'
import re, sys
kinds = [("HGMMA", "wgmma"), ("HMMA", "mma.sync"), ("LDL", "local load"), ("STL", "local store"),
         ("BAR.SYNC", "CTA barrier"), ("EXIT", "exit")]
runs = []
for line in open(sys.argv[1]):
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
    if not m:
        continue
    kind = next((name for op, name in kinds if m.group(2).startswith(op)), None)
    if kind is None:
        continue
    if runs and runs[-1][1] == kind:
        runs[-1][2] += 1
    else:
        runs.append([m.group(1), kind, 1])
local = sum(n for _, k, n in runs if k.startswith("local"))
print(f"{local} local-memory instructions; the instruction runs in program order (address, kind, count):")
for address, kind, n in runs:
    print(f"  {address:>6}  {kind:12} {n}")
EOF
