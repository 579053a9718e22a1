#!/usr/bin/env bash
# On the GPU machine (after scripts/device-bundle.sh here): kiln check for each operator, kiln
# bench on a decode shape, then bench/side_by_side.py against PyTorch's kernels. Files in $OUT:
# check_bench.txt, side_by_side.log, side_by_side.json and one PNG per operator.
set -uo pipefail
source "$(dirname "$0")/../scripts/device-env.sh"
{
  $bin/kiln check mha_prefill --shape batch=2,seqlen=200,heads_q=16,heads_kv=4,head_dim=64,window=32,sinks=1
  $bin/kiln check mha_decode_with_kvcache --shape batch=4,context=777,heads_q=32,heads_kv=8,head_dim=128,page_size=16,kv_dtype=e4m3,q_len=2
  $bin/kiln check moe_apply --shape tokens=6,hidden=256,inter=128,experts=16,top_k=4,weights=mxfp4
  $bin/kiln check mha_decode_with_kvcache --shape batch=64,context=4096,heads_q=64,heads_kv=8,head_dim=64
  $bin/kiln bench mha_decode_with_kvcache --shape batch=64,context=4096,heads_q=64,heads_kv=8,head_dim=64 --json
  $bin/kiln check --manifest gpt-oss-120b
  $bin/kiln check --manifest qwen3-30b-a3b
} 2>&1 | tee "$out/check_bench.txt"
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/side_by_side.py" --lib /work/main/build-device/lib/libkiln.so --out "$out" ${QUICK:+--quick} ${ONLY:+--only $ONLY} 2>&1 | tee "$out/side_by_side.log" | grep -v '^{'
