#!/usr/bin/env bash
# Runs on the GPU machine over a copy of the tree with .carry/ (scripts/device-bundle.sh): the MoE
# GPU tests (W4A8 included), kiln check against the reference kernel and float64 with and without
# W4A8, kiln bench of the GPT-OSS-120B layer, the Python MoE tests; with --sanitizer also
# compute-sanitizer's racecheck and synccheck on the grouped GEMMs, and with --side-by-side the
# MoE rows of bench/side_by_side.py. Logs under $OUT, a short table last.
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
sanitizer=0 side_by_side=0
for arg in "$@"; do
  case $arg in
    --sanitizer) sanitizer=1 ;;
    --side-by-side) side_by_side=1 ;;
    *) echo "usage: $0 [--sanitizer] [--side-by-side]" >&2; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
timeout 300 $bin/kiln_gpu_tests --gtest_color=no --gtest_filter='Gpu.Moe*' 2>&1 | tee "$out/gpu_moe.log" |
  grep -E "^\[ +(OK|FAILED) |Failure|Expected|Which|error|against" | head -60
median() { python3 -c "import json,sys; t=sys.stdin.read(); print(json.loads(t[t.find('{'):])['median_ms'])"; }
for act in bf16 e4m3; do
  for T in 1 17 300; do
    timeout 60 $bin/kiln check moe_apply --shape tokens=$T,hidden=512,inter=256,experts=8,top_k=4,weights=mxfp4_prepared,bias=bf16,act=$act \
      --json > "$out/check_${act}_$T.json" 2>&1
    python3 -c "import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.find('{'):]); print('check', sys.argv[2], 'T', sys.argv[3], j['kernel'], 'pass', j['pass'], 'f64', j['error_vs_float64'])" \
      "$out/check_${act}_$T.json" $act $T || tail -3 "$out/check_${act}_$T.json"
  done
done
# compute-sanitizer on the MXFP4 grouped GEMMs (4096 routed pairs) with bf16 activations and W4A8:
# rc 9 means it found errors; racecheck and synccheck word their summaries differently.
for tool in $([ $sanitizer = 1 ] && echo racecheck synccheck); do
  for act in bf16 e4m3; do
    timeout 180 compute-sanitizer --tool $tool --error-exitcode 9 $bin/kiln check moe_apply \
      --shape tokens=1024,hidden=256,inter=256,experts=8,top_k=4,weights=mxfp4_prepared,bias=bf16,act=$act > "$out/sanitizer_${tool}_$act.log" 2>&1
    echo "sanitizer $tool $act rc=$? $(grep -hE 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/sanitizer_${tool}_$act.log" | head -1)"
  done
done
# MXFP4 (prepared, and standard from T = 512) with bf16 activations and W4A8, beside bf16
# weights: the streaming phases, and from 2048 routed pairs the grouped GEMMs.
for T in 1 8 64 512 2048 4096 8192; do
  line="bench T=$T"
  for w in bf16:bf16 mxfp4_prepared:bf16 mxfp4:bf16 mxfp4_prepared:e4m3; do
    [ $w = mxfp4:bf16 ] && [ $T -lt 512 ] && { line="$line $w -"; continue; }
    ms=$(timeout 90 $bin/kiln bench moe_apply --json --time-ms 150 \
      --shape tokens=$T,hidden=2880,inter=2880,experts=128,top_k=4,weights=${w%:*},bias=bf16,act=${w#*:} 2>/dev/null | median)
    line="$line $w $ms"
  done
  echo "$line" | tee -a "$out/bench.txt"
done
site=/tmp/kiln-site
rm -rf "$site"
python3 -m pip install -q --no-deps --no-index --target "$site" "$root"/.carry/wheel/kiln-*.whl
python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q --no-index --find-links "$root/.carry/pydeps" --target "$site" pytest
(cd "$root/python/tests" && PYTHONPATH=$site timeout 200 python3 -W ignore::UserWarning -m pytest -q -ra -p no:cacheprovider -k moe \
  test_gpu.py test_package.py 2>&1 | tail -15 | tee "$out/pytest_moe.log")
if [ $side_by_side = 1 ]; then
  PYTHONPATH=$site timeout 420 python3 "$root/bench/side_by_side.py" --lib "$root/build-device/lib/libkiln.so" --out "$out/side_by_side" \
    --quick --cuda-graphs --only moe 2>&1 | tail -60
fi
