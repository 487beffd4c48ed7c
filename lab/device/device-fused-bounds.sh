#!/usr/bin/env bash
# lab/probes/probe_fused_bounds.py on one GPU: the fused float64 bounds kernels (out, lse, dq, dk, dv) checked
# against the torch error model on its small cases (compiled, not interpreted), then the bounds and flush shares
# timed both ways on three of the scale set's long shapes, forward and backward, each tile of the probe a JSON
# line -> $OUT/fused-bounds.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
probe=(python3 lab/probes/probe_fused_bounds.py --device cuda)
"${probe[@]}" --check 2>&1 | tee "$OUT/fused-bounds-check.txt" | tail -n 1
for run in "1,1,1,131072,128 --causal --dtype bfloat16" "1,16,16,16384,128 --dtype float16" \
    "1,32,4,16384,256 --causal --dtype bfloat16"; do
    read -ra options <<<"$run"
    "${probe[@]}" --shape "${options[@]}" 2>&1 | tee -a "$OUT/fused-bounds.jsonl"
done
