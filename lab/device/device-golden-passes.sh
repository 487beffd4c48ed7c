#!/usr/bin/env bash
# lab/probes/probe_golden_passes.py on one GPU: the fast golden's float64 pass with golden.passes' Triton passes
# beside the torch evaluation, timed, compared and certified on the scale set's six long cases (their own
# inputs), with the fused pass's CUDA operators -> $OUT/golden-passes.jsonl, $OUT/golden-passes-profile.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
python3 lab/probes/probe_golden_passes.py --device cuda --profile --cases "${long_cases[@]}" 2>&1 \
    | tee "$OUT/golden-passes-profile.txt" | grep '^{' | tee "$OUT/golden-passes.jsonl"
