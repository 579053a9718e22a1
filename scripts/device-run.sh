#!/usr/bin/env bash
# Runs on the GPU machine over a copy of the tree with .carry/ (scripts/device-bundle.sh):
# the gpu test suite, then the host benchmarks; logs under $OUT, a short table last.
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
/work/main/build-device/bin/kiln devices | tee -a "$out/device.txt"
KILN_STRESS_SECONDS=${KILN_STRESS_SECONDS:-120} /work/main/build-device/bin/kiln_gpu_tests --gtest_color=no 2>&1 | tee "$out/gpu_tests.log" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|error|Expected|Which|rel|stress:" | head -80
/work/main/build-device/bin/kiln_bench_host --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/bench_host.json" --benchmark_out_format=json 2>&1 | tee "$out/bench_host.log" | grep -E "median|Benchmark|----"
echo "== fresh-process compile times (sm_90a) =="
bash "$root/scripts/compile-times.sh" /work/main/build-device/bin/kiln 5 | tee "$out/compile_times.txt"
if command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck / racecheck (prefill, moe, short decode) =="
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 /work/main/build-device/bin/kiln_gpu_tests \
      --gtest_filter='Gpu.PrefillKernels*:Gpu.MoeReference*:Gpu.SecondCall*' > /tmp/sanitizer_$tool.log 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/sanitizer_$tool.log | tail -1)"
    cat /tmp/sanitizer_$tool.log >> "$out/sanitizer.log"
  done
fi
echo "== first call in a fresh process: cold (compile), warm (disk cache), in-process hit =="
printf "%-26s %10s %10s %12s\n" operator cold_ms warm_ms in_process_ms | tee "$out/first_call.txt"
for op in mha_prefill mha_decode_with_kvcache moe_apply; do
  dir=$(mktemp -d)/cache
  cold=$(KILN_CACHE_DIR=$dir /work/main/build-device/bin/kiln_first_call $op)
  warm=$(KILN_CACHE_DIR=$dir /work/main/build-device/bin/kiln_first_call $op)
  python3 -c "import json,sys; c=json.loads(sys.argv[1]); w=json.loads(sys.argv[2]); print('%-26s %10.1f %10.1f %12.2f' % (sys.argv[3], c['first_call_ms'], w['first_call_ms'], w['second_call_ms']))" "$cold" "$warm" $op | tee -a "$out/first_call.txt"
done
echo "== warm-up of gpt-oss-120b for sm_90a on this machine ($(nproc) cores), then a fresh process per operator =="
wdir=$(mktemp -d)/cache
/usr/bin/time -f "warmup wall %e s" /work/main/build-device/bin/kiln --cache "$wdir" warmup --manifest gpt-oss-120b 2>&1 | grep -vE "^\[" | tee "$out/warmup.txt"
for op in mha_prefill mha_decode_with_kvcache moe_apply; do
  KILN_CACHE_DIR=$wdir /work/main/build-device/bin/kiln_first_call $op | tee -a "$out/warmup.txt"
done
