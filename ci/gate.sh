#!/usr/bin/env bash
# Gate $FA2_KERNEL against its committed baseline on the gate corpus.
#   FA2_BASELINE  baseline file (default: fa2_verify/golden/baselines/$FA2_KERNEL-<gpu>.json,
#                 e.g. triton-h100.json, or $FA2_KERNEL-cpu.json on the CPU)
# Exit status: 0 no regression, 1 a regression, 2 a missing or mismatched baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/common.sh
source ci/common.sh

if [[ "$FA2_DEVICE" == cuda* ]]; then tag="$(gpu_tag)"; else tag=cpu; fi
baseline="${FA2_BASELINE:-fa2_verify/golden/baselines/$FA2_KERNEL-$tag.json}"
"$FA2_VERIFY" gate --kernel "$FA2_KERNEL" --device "$FA2_DEVICE" --baseline "$baseline" \
    --out "$FA2_OUT/gate-run.json" --markdown "$FA2_OUT/gate.md" --overwrite "$@"
