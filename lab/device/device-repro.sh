#!/usr/bin/env bash
# `fa2-verify repro` of cases on one GPU, one after the other, each with its verdict table and the description
# of any failing verdict (statistical, local, bias):
#   lab/device/device-repro.sh KERNEL CASE_JSON [CASE_JSON ...]
# Logs go to $OUT (flat): repro-N.log.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/gpu-out/triton-cache}"
kernel=$1
shift
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
index=0
for case in "$@"; do
    index=$((index + 1))
    python3 -m fa2_verify repro --kernel "$kernel" --device cuda --case "$case" >"$OUT/repro-$index.log" 2>&1
    echo "== case $index: exit $?"
    grep -E "^(case|none|causal|window)|verdict|local|statistical" "$OUT/repro-$index.log" | head -n 12
done
