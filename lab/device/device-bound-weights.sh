#!/usr/bin/env bash
# lab/probes/probe_bound_weights.py on one GPU: the error model's bounds and flush shares with
# verify.bound_weights' Triton passes beside the torch evaluation, timed and compared, on the scale set's six long
# cases (float64 exp of Triton and libdevice checked first) -> $OUT/bound-weights.jsonl.
#   lab/device/device-bound-weights.sh [ROWS,KEYS,WARPS ...]   (tiles of the fused passes to time; default: TILE)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
python3 lab/probes/probe_bound_weights.py --device cuda --cases "${long_cases[@]}" --tiles "$@" 2>&1 \
    | tee "$OUT/bound-weights.jsonl"
