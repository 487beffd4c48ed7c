#!/usr/bin/env bash
# The comparison's phases on the scale set's six long cases against triton, before and after a change, in one
# call on one GPU; then the float64 golden at (1, 1, 131072, 128) causal (its CUDA operators, and
# benchmarks/bench_golden.py's median of 3):
#   lab/device/device-compare-planner.sh [BEFORE_ROOT]
# BEFORE_ROOT (default .bench-before-31, `git archive 19302b4 fa2_verify`) holds the package the "before" lines
# run (first on PYTHONPATH); the probes are this tree's.  Logs go to $OUT (flat).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/gpu-out/triton-cache}"
before=${1:-.bench-before-31}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
echo "== after"
python3 lab/probes/probe_comparison_phases.py --device cuda --kernel triton --scale-set --cases "${long_cases[@]}" \
    2>&1 | tee "$OUT/compare-after.jsonl"
echo "== before ($before)"
PYTHONPATH="$PWD/$before:$PYTHONPATH" python3 lab/probes/probe_comparison_phases.py --device cuda --kernel triton \
    --scale-set --cases "${long_cases[@]}" 2>&1 | tee "$OUT/compare-before.jsonl"
python3 lab/probes/probe_golden_phases.py --device cuda --shapes 1x1x131072x128c --profile 2>&1 \
    | tee "$OUT/golden-131072-profile.txt" | tail -n 1
python3 benchmarks/bench_golden.py --device cuda --repeats 3 --mp-seqlen 0 --seqlen 131072 --causal 2>&1 \
    | tee "$OUT/golden-131072-causal.md"
