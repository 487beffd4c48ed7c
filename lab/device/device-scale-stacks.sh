#!/usr/bin/env bash
# Where the `scale` profile's time goes, in one GPU call:
#   lab/device/device-scale-stacks.sh [PROFILE_SECONDS]
# lab/device/device-scale.sh for triton on the six long scale cases, then the `scale` profile for
# PROFILE_SECONDS (default 390) sampled by py-spy (its wheel carried in .whl-spy), and
# lab/probes/stack_summary.py's tables of those stacks (per property test, per function).
# FA2_SCALE_TARGETS= (empty) skips the six cases; FA2_SCALE_WARMUP=background (device-scale.sh) compiles beside the
# profile, and its warmup.log comes back too.
# The device tool brings back at most 8 files: the logs, the summaries and the stacks go to $OUT flat.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
seconds=${1:-390}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/spy .whl-spy/*.whl || exit 2
export PATH="/tmp/spy/bin:$PATH"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
work=/tmp/scale
FA2_SCALE_TARGETS="${FA2_SCALE_TARGETS-triton}" FA2_SCALE_PROFILE_SECONDS="$seconds" FA2_SCALE_STACKS="$OUT/stacks.txt" \
    FA2_SCALE_CASES="${long_cases[*]}" \
    bash lab/device/device-scale.sh "$work" 2>&1 | tail -n 40
cp "$work/properties-scale.log" "$OUT/"
cp "$work/run-triton.log" "$OUT/" 2>/dev/null
cp "$work/scale-profile.md" "$OUT/" 2>/dev/null
cp "$work/warmup.log" "$OUT/" 2>/dev/null
python3 lab/probes/stack_summary.py "$OUT/stacks.txt" --top 100 >"$OUT/stacks.md"
python3 lab/probes/stack_summary.py "$OUT/stacks.txt" --top 60 --match "" >"$OUT/stacks-all.md"
