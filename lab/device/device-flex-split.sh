#!/usr/bin/env bash
# FlexAttention's property runs split over one GPU's memory, meant to run detached
# (setsid) and be collected by lab/device/device-collect.sh DIR: the `flex` step of
# lab/device/device-steps.sh once per job of $FA2_FLEX_JOBS, all side by side, each job
# "NAME/RUNS/WORKERS/SELECT-FILE" (RUNS as FA2_FLEX_RUNS with commas for spaces,
# e.g. "dev:1,dev:2"; SELECT-FILE a -k expression in a file, or "-" for every
# property).  Each worker that has run FlexAttention's head_dim 128 kernels holds
# 11 to 12.5 GB of GPU memory (docs/targets.md), so the workers of all jobs together
# are sized to the GPU: at most 6 on an H100, 10 on an H200 (11 and 12 filled one).  $FA2_FLEX_TIMEOUT stops each
# run (default 1380 s); $FA2_SPLIT_TARGETS (default none) are run with `run` only,
# before the jobs start.  Writes DIR/<job>/..., DIR/steps.txt and DIR/done.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out="${1:?usage: lab/device/device-flex-split.sh DIR}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >"$out/steps.txt"
for kernel in ${FA2_SPLIT_TARGETS:-}; do
    FA2_TARGETS="$kernel" FA2_TARGET_RUNS=" " bash lab/device/device-targets.sh "$out/run-$kernel" \
        >"$out/run-$kernel.txt" 2>&1
    echo "== run $kernel: exit $?" >>"$out/steps.txt"
done
pids=()
for job in ${FA2_FLEX_JOBS:?FA2_FLEX_JOBS names the jobs}; do
    IFS=/ read -r name runs workers select <<<"$job"
    [[ -n "$select" && "$workers" =~ ^[0-9]+$ ]] || { echo "bad job $job" >>"$out/steps.txt"; continue; }
    selection=""
    [[ "$select" != - ]] && selection="$(cat "$select")"
    FA2_STEPS=flex FA2_TARGET_FIXED=0 FA2_FLEX_RUNS="${runs//,/ }" FA2_FLEX_WORKERS="$workers" \
        FA2_FLEX_TIMEOUT="${FA2_FLEX_TIMEOUT:-1380}" FA2_TARGET_SELECT="$selection" \
        bash lab/device/device-steps.sh "$out/$name" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
cat "$out"/*/steps.txt >>"$out/steps.txt"
date >"$out/done"
