#!/usr/bin/env bash
# Run the property suite against $FA2_KERNEL, $FA2_WORKERS_PER_GPU pytest-xdist
# workers per GPU (default: the CPU cores per GPU, as the suite's timings in
# docs/benchmarks.md ran, 16 workers on a 16-core one-GPU runner, and for a profile
# with a per-example memory budget no more than share a GPU with that budget each,
# `python -m fa2_verify.properties.gpu_shares PROFILE`: 3 per 80 GB GPU for `scale`;
# worker gwI runs
# on cuda:I mod GPUs: a worker spends most of its time on the CPU, in the golden and
# in Triton's compiler; FlexAttention's workers need about 12 GB of GPU memory
# each, docs/targets.md, so at most 6 per 80 GB GPU), with
# `--dist worksteal` (an idle worker takes tests queued for a busy one: the
# property tests differ in length by 10x, docs/benchmarks.md; the plugin orders
# them on the durations it recorded in pytest's cache, .pytest_cache: keep it
# between runs; a fresh runner orders them on ci/durations.json, a copy of those
# records from one H100), writing
# Allure results and keeping the Hypothesis example database in $FA2_OUT/examples
# (restore it there to replay old failures).  Keep $TRITON_CACHE_DIR between runs:
# on an empty cache the triton suite spends minutes compiling.  With FA2_WARMUP=1
# (and FA2_KERNEL=triton on a GPU), `fa2-verify warmup` first compiles the variants
# the profile needs in parallel, one process per CPU core; with FA2_WARMUP=background
# it compiles them beside the suite, on the cores the workers leave idle (the
# `scale` profile runs 3 workers per 80 GB GPU), and is stopped when the suite ends
# (opt-in: the suite compiles whatever is missing on its own).  With FA2_MPS=1 on a GPU it starts
# NVIDIA's Multi-Process Service for the run (and stops it at exit), so the
# workers' small golden and comparison kernels share the GPU instead of
# time-slicing it one process at a time (docs/benchmarks.md: a warm `ci` run
# on one H100 in 52.6 s instead of 77.0 s).  Opt-in: it changes how every
# process on the runner uses the GPU.  On the CPU the triton kernel runs under
# Triton's interpreter (TRITON_INTERPRET=1), with every memory access it makes
# bounds-checked (--fa2-bounds-check, docs/properties.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/common.sh
source ci/common.sh

if [[ "$FA2_DEVICE" == cuda* ]]; then
    gpus=$(nvidia-smi -L | wc -l)
    per_gpu="${FA2_WORKERS_PER_GPU:-$("$PYTHON" -m fa2_verify.properties.gpu_shares "$FA2_PROFILE")}"
    workers=$((gpus * per_gpu))
else
    workers="${FA2_WORKERS:-2}"
fi
case "${FA2_WARMUP:-0}" in
0 | 1 | background) ;;
*) echo "FA2_WARMUP=$FA2_WARMUP: use 0, 1 or background" >&2; exit 2 ;;
esac
at_exit=()
if [[ "${FA2_WARMUP:-0}" != 0 && "$FA2_KERNEL" == triton && "$FA2_DEVICE" == cuda* ]]; then
    if [[ "$FA2_WARMUP" == background ]]; then
        idle=$(($(nproc) - workers))
        # its own process group (setsid), so that stopping it stops its compiler processes too
        setsid "$PYTHON" -m fa2_verify warmup --profile "$FA2_PROFILE" --processes "$((idle > 0 ? idle : 1))" &
        at_exit+=("kill -- -$! 2>/dev/null || true")
    else
        "$PYTHON" -m fa2_verify warmup --profile "$FA2_PROFILE" --processes "$(nproc)"
    fi
fi
if [[ "${FA2_MPS:-0}" == 1 && "$FA2_DEVICE" == cuda* ]]; then
    nvidia-cuda-mps-control -d
    at_exit+=("echo quit | nvidia-cuda-mps-control")
fi
if ((${#at_exit[@]})); then
    # shellcheck disable=SC2064  # the commands are fixed now, the warm-up's pid among them
    trap "$(printf '%s; ' "${at_exit[@]}")" EXIT
fi
checks=()
# One runner's shard I/N of the suite (the nightly matrix; docs/reports-and-gate.md, "Sharding the suite over runners").
[[ -n "${FA2_SHARD:-}" ]] && checks=(--fa2-shard "$FA2_SHARD")
if [[ "$FA2_KERNEL" == triton && "$FA2_DEVICE" == cpu ]]; then
    export TRITON_INTERPRET=1
    checks+=(--fa2-bounds-check)
fi
rm -rf "$FA2_OUT/allure-results"
"$PYTHON" -m pytest --pyargs fa2_verify.properties -n "$workers" --dist worksteal \
    --fa2-kernel "$FA2_KERNEL" --fa2-device "$FA2_DEVICE" --fa2-profile "$FA2_PROFILE" \
    --fa2-examples-dir "$FA2_OUT/examples" --fa2-durations ci/durations.json \
    --alluredir "$FA2_OUT/allure-results" \
    --junitxml "$FA2_OUT/properties.xml" "${checks[@]}" "$@"
