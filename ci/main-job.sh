#!/usr/bin/env bash
# The main job: the bundled triton kernel verified against the golden on the
# fixed case set, with a report. On a machine without a GPU the kernel runs on
# the CPU under Triton's interpreter (float16 and float32; bfloat16 is reported
# as unsupported there), every memory access of the triton kernel bounds-checked.
#   FA2_KERNEL  kernel target (default: triton)
#   FA2_OUT     report directory (default: report)
set -euo pipefail
cd "$(dirname "$0")/.."
FA2_OUT="${FA2_OUT:-report}" FA2_VENV="${FA2_VENV:-.venv}"
# shellcheck source=ci/common.sh
source ci/common.sh
checks=()
if [[ "$FA2_DEVICE" == cpu ]]; then
    export TRITON_INTERPRET=1
    [[ "$FA2_KERNEL" == triton ]] && checks=(--bounds-check)
fi
"$FA2_VERIFY" run --kernel "$FA2_KERNEL" --device "$FA2_DEVICE" \
    --report "$FA2_OUT" --markdown "$FA2_OUT/summary.md" --overwrite "${checks[@]}" "$@"
