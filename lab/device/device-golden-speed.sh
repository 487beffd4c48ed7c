#!/usr/bin/env bash
# Issue 30's golden and comparison timings on one GPU, before and after in the same call:
#   lab/device/device-golden-speed.sh [BEFORE_ROOT]
# BEFORE_ROOT (default .bench-before-30) holds an older fa2_verify package; the golden's phases
# (lab/probes/probe_golden_phases.py) run against it and against this tree, then `fa2-verify run`
# times the scale set's six long cases against `triton` with this tree.  Logs go to $OUT.
set -uo pipefail
source lab/device/device-common.sh
before=${1:-.bench-before-30}
shapes=(1x16x16384x128 1x1x131072x128c)
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
for side in before after; do
    root=$PWD; [ "$side" = before ] && root=$PWD/$before
    PYTHONPATH=$root python3 lab/probes/probe_golden_phases.py --device cuda --shapes "${shapes[@]}" 2>&1 | tee "$OUT/golden-$side.jsonl"
    PYTHONPATH=$root python3 lab/probes/probe_golden_phases.py --device cuda --dtype bfloat16 --shapes 1x32/4x16384x256c 2>&1 | tee -a "$OUT/golden-$side.jsonl"
done
cases=(s16384-none-fp16 s16384-hd256-gqa8-causal-bf16 sk65537-none-fp16 s65537-window-bf16 s131072-causal-bf16 sk131072-none-fp16)
python3 -m fa2_verify run --kernel triton --device cuda --cases scale "${cases[@]/#/--case=}" 2>&1 | tail -12 | tee "$OUT/run-scale.txt"
