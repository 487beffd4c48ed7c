#!/usr/bin/env bash
# The property suite (profile $FA2_PROFILE, default ci; $FA2_TRITON_PROFILE and
# $FA2_FLASH_PROFILE pick one per kernel) against triton and torch-flash on the
# GPUs of this host, from the source tree (no install step).  $FA2_PYTEST_ARGS
# is passed on to both pytest runs (e.g. --hypothesis-seed=2 with a random
# profile).
# With two GPUs or more the two kernels run at the same time: torch-flash on the
# last GPU, triton on the others; with one GPU they run one after the other.
# FA2_KERNELS=triton or FA2_KERNELS=torch-flash runs one kernel on every GPU.
# Several pytest-xdist workers share each GPU ($FA2_TRITON_WORKERS per GPU for
# triton, default 7, and $FA2_FLASH_WORKERS for torch-flash, default 4): a
# worker is mostly on the CPU (the golden, and Triton compiling a kernel for each
# new shape class), and the GPUs have memory to spare for these shapes.
# OMP_NUM_THREADS (default 3) keeps the workers from oversubscribing the cores.
# Each run is stopped (SIGINT, so pytest still reports) after
# $FA2_PROPERTIES_TIMEOUT seconds (default 1800) and writes into $1 (default
# gpu-out): properties-KERNEL.log (-v, -rfE and Hypothesis statistics),
# properties-KERNEL.xml (JUnit) and the example database.
# Triton's compile cache is kept in $TRITON_CACHE_DIR (default
# gpu-out/triton-cache), so a second run on the same machine compiles nothing.
# Exit status: 0 when both runs pass.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/gpu-out/triton-cache}"
out="${1:-gpu-out}"
mkdir -p "$out" "$TRITON_CACHE_DIR"
gpus="$(nvidia-smi -L | wc -l)"
cap="${FA2_PROPERTIES_TIMEOUT:-1800}"

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-3}"

read -ra extra <<<"${FA2_PYTEST_ARGS:-}"

suite() {  # suite KERNEL GPU_LIST WORKERS_PER_GPU PROFILE
    local kernel="$1" visible="$2" profile="$4" workers
    workers=$(($(tr ',' '\n' <<<"$visible" | wc -l) * $3))
    CUDA_VISIBLE_DEVICES="$visible" timeout -s INT -k 30 "$cap" python3 -m pytest --pyargs fa2_verify.properties "${plugin[@]}" \
        -n "$workers" -v -rfE --durations=0 --hypothesis-show-statistics -p no:cacheprovider \
        --fa2-kernel "$kernel" --fa2-device cuda --fa2-profile "$profile" "${extra[@]}" \
        --fa2-examples-dir "$out/examples-$kernel" --junitxml "$out/properties-$kernel.xml" \
        >"$out/properties-$kernel.log" 2>&1
    local got=$?
    echo "== properties-$kernel ($profile profile) on GPUs $visible: exit $got"
    return "$got"
}

all="$(seq -s, 0 $((gpus - 1)))"
triton_workers="${FA2_TRITON_WORKERS:-7}"
flash_workers="${FA2_FLASH_WORKERS:-4}"
triton_profile="${FA2_TRITON_PROFILE:-${FA2_PROFILE:-ci}}"
flash_profile="${FA2_FLASH_PROFILE:-${FA2_PROFILE:-ci}}"
triton_status=0 flash_status=0
case "${FA2_KERNELS:-triton,torch-flash}" in
triton,torch-flash | torch-flash,triton)
    kernels=(triton torch-flash)
    if ((gpus >= 2)); then
        suite torch-flash "$((gpus - 1))" "$flash_workers" "$flash_profile" & flash=$!
        suite triton "$(seq -s, 0 $((gpus - 2)))" "$triton_workers" "$triton_profile"; triton_status=$?
        wait "$flash"; flash_status=$?
    else
        suite triton "$all" "$triton_workers" "$triton_profile"; triton_status=$?
        suite torch-flash "$all" "$flash_workers" "$flash_profile"; flash_status=$?
    fi ;;
triton) kernels=(triton); suite triton "$all" "$triton_workers" "$triton_profile"; triton_status=$? ;;
torch-flash) kernels=(torch-flash); suite torch-flash "$all" "$flash_workers" "$flash_profile"; flash_status=$? ;;
*) echo "FA2_KERNELS=$FA2_KERNELS: name triton, torch-flash or both (comma-separated)" >&2; exit 2 ;;
esac
for kernel in "${kernels[@]}"; do
    echo "---- properties-$kernel (summary)"
    grep -E '^(FAILED|ERROR)|passed|failed|examples checked' "$out/properties-$kernel.log" | tail -n 30
done
((triton_status == 0 && flash_status == 0))
