#!/usr/bin/env bash
# Runs on the GPU machine over a copy of the tree with .carry/ (scripts/device-bundle.sh): one
# launch of a kiln kernel under Nsight Compute with warp-state sampling by instruction, then the
# stall reasons of the whole launch and the SASS lines that hold the most samples.
#   scripts/device-ncu.sh LABEL KERNEL_REGEX kiln-bench-arguments...
# Writes $OUT/LABEL.ncu-rep (open with ncu-ui) and $OUT/LABEL-source.csv. NCU_ARGS adds options
# (e.g. --cache-control none, to keep the code and data a warm launch finds in L2).
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
label=$1 kernel=$2
shift 2
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
# The first launches compile and warm up; the sixth is profiled.
timeout 240 "$ncu" --clock-control none ${NCU_ARGS:-} --kernel-name "regex:$kernel" --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SourceCounters \
  --section MemoryWorkloadAnalysis -f -o "$out/$label" $bin/kiln bench "$@" --time-ms 50 > "$out/$label-run.log" 2>&1 ||
  { tail -20 "$out/$label-run.log"; exit 1; }
"$ncu" -i "$out/$label.ncu-rep" --page raw --csv > "$out/$label-raw.csv" 2>/dev/null
"$ncu" -i "$out/$label.ncu-rep" --page source --csv --print-source sass > "$out/$label-source.csv" 2>/dev/null
python3 "$(dirname "$0")/ncu_stalls.py" "$out/$label-raw.csv" "$out/$label-source.csv" "$label"
rm -f "$out/$label-raw.csv"
