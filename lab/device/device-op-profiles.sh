#!/usr/bin/env bash
# Which CUDA operators the comparison and the golden spend the two largest long scale cases on, one GPU:
#   lab/device/device-op-profiles.sh
# 1. lab/probes/probe_fused_bounds.py --check, compiled (the fused float64 bounds against the torch ones);
# 2. lab/probes/probe_comparison_phases.py on s131072-causal-bf16 and s16384-hd256-gqa8-causal-bf16 against
#    triton, with its cProfile and CUDA-operator tables -> $OUT/compare-ops.txt;
# 3. lab/probes/probe_golden_phases.py at (1, 1, 131072, 128) causal and (1, 32/4, 16384, 256) causal with the
#    float64 pass's CUDA-operator table -> $OUT/golden-ops.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/gpu-out/triton-cache}"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
python3 lab/probes/probe_fused_bounds.py --device cuda --check 2>&1 | tee "$OUT/fused-bounds-check.txt" | tail -n 1
python3 lab/probes/probe_comparison_phases.py --device cuda --kernel triton --scale-set \
    --cases s131072-causal-bf16 s16384-hd256-gqa8-causal-bf16 --cuda-profile >"$OUT/compare-ops.txt" 2>&1
grep '^{' "$OUT/compare-ops.txt"
python3 lab/probes/probe_golden_phases.py --device cuda --shapes 1x1x131072x128c 1x32/4x16384x256c --dtype bfloat16 \
    --profile >"$OUT/golden-ops.txt" 2>&1
grep '^{' "$OUT/golden-ops.txt"
