#!/usr/bin/env bash
# lab/probes/probe_golden_passes.py on one GPU: the fast golden's elementwise work in Triton passes (products in
# cuBLAS, no FMA contraction) checked against golden.fast on small problems, compiled, then both float64 passes
# timed, compared and certified on the scale set's six long cases (their own inputs), with the fused pass's CUDA
# operators -> $OUT/golden-passes.jsonl, $OUT/golden-passes-profile.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
probe=(python3 lab/probes/probe_golden_passes.py --device cuda)
"${probe[@]}" --check 2>&1 | tee "$OUT/golden-passes-check.txt" | tail -n 1
"${probe[@]}" --profile --cases "${long_cases[@]}" 2>&1 | tee "$OUT/golden-passes-profile.txt" | grep '^{' \
    | tee "$OUT/golden-passes.jsonl"
