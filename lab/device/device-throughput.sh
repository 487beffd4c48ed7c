#!/usr/bin/env bash
# Issue 30's tables on one GPU, every before/after pair in the same call:
#   lab/device/device-throughput.sh [PROFILE_SECONDS] [BEFORE_ROOT]
# 1. benchmarks/bench_golden.py on the three golden shapes of the issue, this tree (median of 3) beside the
#    golden in BEFORE_ROOT (default .bench-before-30, `git archive 5315665 fa2_verify`) on the same GPU;
# 2. lab/device/device-scale.sh for triton: the scale set's six long cases (kernel, golden and comparison
#    seconds per case), then the `scale` property profile for PROFILE_SECONDS (default 300) with
#    examples per second and the largest shapes drawn (benchmarks/observed_summary.py).
# Logs go to $OUT (flat: the device tool brings back two folder levels).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
seconds=${1:-300}
before=${2:-.bench-before-30}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
common=(--device cuda --repeats 3 --old-repeats 1 --mp-seqlen 0 --old-root "$before" --old-device cuda)
python3 benchmarks/bench_golden.py "${common[@]}" --heads 16 --seqlen 16384 2>&1 | tee "$OUT/golden-16x16384.md"
python3 benchmarks/bench_golden.py "${common[@]}" --seqlen 131072 --causal 2>&1 | tee "$OUT/golden-131072-causal.md"
python3 benchmarks/bench_golden.py "${common[@]}" --heads 32 --heads-kv 4 --seqlen 16384 --head-dim 256 --causal \
    --dtype bfloat16 2>&1 | tee "$OUT/golden-gqa-hd256.md"
FA2_SCALE_TARGETS=triton FA2_SCALE_PROFILE_SECONDS="$seconds" \
    FA2_SCALE_CASES="${long_cases[*]}" \
    lab/device/device-scale.sh "$OUT/scale" 2>&1 | tail -n 30
