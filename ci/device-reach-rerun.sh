#!/usr/bin/env bash
# Issue 11's re-runs and issue 10's scale re-run in one sequence on one H100,
# meant to run detached (setsid) across several device calls, each call
# collecting what is done so far:
#   1. flex-attention alone, `ci` seed 0 (its determinism properties);
#   2. flash-attn-4 alone, `ci` seed 0, after `ci/install-fa4.sh` has installed it
#      into $FA2_FA4_SITE (default /root/site);
#   3. the scale set against triton (`ci/device-scale.sh`, no profile run).
# Each step writes into $1/<step> (default gpu-out/rerun) and its console into
# $1/<step>.txt; $1/done is written at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out="${1:-gpu-out/rerun}"
site="${FA2_FA4_SITE:-/root/site}"
workers="${FA2_TARGET_WORKERS:-16}"
cap="${FA2_TARGET_TIMEOUT:-400}"
mkdir -p "$out"
FA2_TARGETS=flex-attention FA2_TARGET_RUNS=ci:0 FA2_TARGET_WORKERS="$workers" FA2_TARGET_TIMEOUT="$cap" \
    OMP_NUM_THREADS=1 bash ci/device-targets.sh "$out/flex" >"$out/flex.txt" 2>&1
PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages" FA2_TARGETS=flash-attn-4 FA2_TARGET_RUNS=ci:0 \
    FA2_TARGET_WORKERS="$workers" FA2_TARGET_TIMEOUT="$cap" OMP_NUM_THREADS=1 \
    bash ci/device-targets.sh "$out/fa4" >"$out/fa4.txt" 2>&1
FA2_SCALE_TARGETS=triton FA2_SCALE_PROFILE_SECONDS=0 bash ci/device-scale.sh "$out/scale" >"$out/scale.txt" 2>&1
date >"$out/done"
