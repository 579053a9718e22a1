#!/usr/bin/env bash
# Runs on the GPU machine over a copy of the tree with .carry/ (scripts/device-bundle.sh): the
# per-phase timeline of the MoE streaming kernel (scripts/moe_timeline.py) for each shape given
# (default: the GPT-OSS-120B layer at T = 1 with prepared MXFP4 and with bf16 weights, biases on),
# beside the same shape's uninstrumented median. Token counts the streaming phases serve only (the
# grouped GEMMs are not stamped); a shape slow enough that kiln bench makes fewer than 400 launches
# needs TIMELINE_LAUNCH set lower.
#   scripts/device-moe-timeline.sh [MOE_SHAPE...]
# Writes $OUT/timeline-N.log (kiln bench's output with the TL lines) per shape.
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
sources=/tmp/kiln-moe-timeline-sources
python3 "$root/scripts/moe_timeline.py" instrument "${KILN_KERNEL_SOURCES:-$root/kernel-sources}" "$sources" \
  --launch "${TIMELINE_LAUNCH:-400}" || exit 1
[ $# -gt 0 ] || set -- tokens=1,hidden=2880,inter=2880,experts=128,top_k=4,weights=mxfp4_prepared,bias=bf16 \
  tokens=1,hidden=2880,inter=2880,experts=128,top_k=4,weights=bf16,bias=bf16
n=0
for shape in "$@"; do
  n=$((n + 1))
  plain=$(timeout 90 $bin/kiln bench moe_apply --time-ms 150 --shape "$shape" | grep '^time')
  KILN_KERNEL_SOURCES=$sources timeout 90 $bin/kiln bench moe_apply --time-ms 150 --shape "$shape" > "$out/timeline-$n.log" 2>&1
  echo "== $shape"
  echo "uninstrumented: $plain"
  echo "instrumented:   $(grep '^time' "$out/timeline-$n.log")"
  python3 "$root/scripts/moe_timeline.py" summarize "$out/timeline-$n.log"
done
