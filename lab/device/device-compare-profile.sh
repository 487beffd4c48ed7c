#!/usr/bin/env bash
# Where the scale set's comparison and golden seconds go on one GPU (issue 30's second profile):
#   lab/device/device-compare-profile.sh
# 1. lab/probes/probe_comparison_phases.py on the six long scale cases against triton: the bounds, the naive
#    low-precision attention, the model kernel, metrics and verdicts, each synchronised, and end to end;
# 2. its cProfile and CUDA-operator tables for the sliding window and the 131,072 causal case;
# 3. lab/probes/probe_golden_phases.py at (1, 1, 131072, 128) causal with the float64 pass's block overhead swept.
# Logs go to $OUT (flat).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/gpu-out/triton-cache}"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
python3 lab/probes/probe_comparison_phases.py --device cuda --kernel triton --scale-set --cases "${long_cases[@]}" \
    2>&1 | tee "$OUT/compare-phases.jsonl"
python3 lab/probes/probe_comparison_phases.py --device cuda --kernel triton --scale-set \
    --cases s65537-window-bf16 s131072-causal-bf16 --profile --cuda-profile >"$OUT/compare-profile.txt" 2>&1
python3 lab/probes/probe_golden_phases.py --device cuda --shapes 1x1x131072x128c \
    --block-overhead 2097152 4194304 8388608 16777216 33554432 2>&1 | tee "$OUT/golden-overhead.jsonl"
