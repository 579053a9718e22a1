#!/usr/bin/env bash
# Median wall time of a fresh `kiln compile` process per reference kernel for sm_90a, in process
# and through the compile worker: the cold first-call compile cost on this machine.
# Usage: scripts/compile-times.sh [path/to/kiln] [runs]
set -euo pipefail
kiln=${1:-build/bin/kiln}
runs=${2:-5}
declare -A sigs=(
  [mha_prefill]="dtype=bf16,head_dim=128,group=8,causal=1,window=0,sinks=0,softcap=0,lse=0"
  [mha_decode_with_kvcache]="dtype=bf16,kv_dtype=bf16,head_dim=128,group=8,page_size=16,q_len=1,window=0,sinks=0,softcap=0,lse=0"
  [moe_apply]="dtype=bf16,weights=mxfp4,hidden=2880,inter=2880,experts=128,top_k=4,routing=topk_softmax,logits=bf16,activation=swiglu_clamped,layout=interleaved,w13_bias=f32,w2_bias=f32"
)
printf "%-26s %-10s %10s\n" operator isolation median_ms
for op in mha_prefill mha_decode_with_kvcache moe_apply; do
  for mode in inprocess process; do
    times=()
    for _ in $(seq "$runs"); do
      start=$(date +%s%N)
      # A fresh cache directory each time: this measures the compile, not a cache hit.
      KILN_CACHE_DIR=$(mktemp -d)/cache KILN_COMPILE_ISOLATION=$mode "$kiln" compile "$op" --target sm_90a --sig "${sigs[$op]}" >/dev/null
      times+=($(( ($(date +%s%N) - start) / 1000000 )))
    done
    median=$(printf "%s\n" "${times[@]}" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
    printf "%-26s %-10s %10s\n" "$op" "$mode" "$median"
  done
done
