#!/usr/bin/env bash
# Several jobs at once on a machine of several GPUs, each on a GPU and a share
# of the cores of its own, from the source tree (no install step):
#   bash lab/device/device-gpus.sh OUT 'JOB' ['JOB' ...]
# Job i (a bash command line, run from the repository root) gets GPU i
# (CUDA_VISIBLE_DEVICES=i), the cores [i*C, (i+1)*C) with C = cores / jobs
# (taskset), OMP_NUM_THREADS=3, and OUT/job-i as $JOB_OUT; its output goes to
# OUT/job-i.log.  The dependencies are installed once, before any job starts
# (lab/device/device-deps.sh).  At the end each job's exit status, its wall
# seconds and the last lines of its log are printed.
# Exit status: 0 when every job exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
out="${1:?usage: device-gpus.sh OUT JOB [JOB ...]}"
shift
mkdir -p "$out"
gpus="$(nvidia-smi -L | wc -l)"
if (($# > gpus)); then
    echo "$# jobs for $gpus GPUs: give at most one job per GPU" >&2
    exit 2
fi
share=$(($(nproc) / $#))
# shellcheck disable=SC2016  # expanded by the job's own shell
timed='started=$(date +%s); eval "$1"; status=$?; echo "== wall $(($(date +%s) - started)) s, exit $status"; exit "$status"'
pids=()
i=0
for job in "$@"; do
    mkdir -p "$out/job-$i"
    CUDA_VISIBLE_DEVICES="$i" OMP_NUM_THREADS=3 JOB_OUT="$out/job-$i" \
        taskset -c "$((i * share))-$(((i + 1) * share - 1))" bash -c "$timed" job "$job" >"$out/job-$i.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
done
ok=0
jobs=("$@")
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    status=$?
    ((status == 0)) || ok=1
    echo "== job $i (GPU $i, $share cores): exit $status: ${jobs[$i]}"
    tail -n 30 "$out/job-$i.log"
done
exit "$ok"
