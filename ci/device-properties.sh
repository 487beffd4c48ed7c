#!/usr/bin/env bash
# The property suite (profile $FA2_PROFILE, default ci) against triton and
# torch-flash on the GPUs of this host, from the source tree (no install step).
# With two GPUs or more the two kernels run at the same time: torch-flash on the
# last GPU, triton (which compiles a kernel per new shape class) on the others,
# one pytest-xdist worker per GPU.  With one GPU they run one after the other.
# Each run is capped at $FA2_PROPERTIES_TIMEOUT seconds (default 1800) and writes
# into $1 (default gpu-out): properties-KERNEL.log (with -rfE and Hypothesis
# statistics), properties-KERNEL.xml (JUnit) and the example database.
# Triton's compile cache is kept in $TRITON_CACHE_DIR (default
# gpu-out/triton-cache), so a second run on the same machine compiles nothing.
# Exit status: 0 when both runs pass.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/gpu-out/triton-cache}"
out="${1:-gpu-out}"
mkdir -p "$out" "$TRITON_CACHE_DIR"
gpus="$(nvidia-smi -L | wc -l)"
cap="${FA2_PROPERTIES_TIMEOUT:-1800}"

suite() {  # suite KERNEL GPU_LIST
    local kernel="$1" visible="$2" workers
    workers="$(tr ',' '\n' <<<"$visible" | wc -l)"
    CUDA_VISIBLE_DEVICES="$visible" timeout "$cap" python3 -m pytest properties -p properties.plugin \
        -n "$workers" -q -rfE --hypothesis-show-statistics -p no:cacheprovider \
        --kernel "$kernel" --device cuda --fa2-profile "${FA2_PROFILE:-ci}" \
        --fa2-examples-dir "$out/examples-$kernel" --junitxml "$out/properties-$kernel.xml" \
        >"$out/properties-$kernel.log" 2>&1
    local got=$?
    echo "== properties-$kernel on GPUs $visible: exit $got"
    return "$got"
}

all="$(seq -s, 0 $((gpus - 1)))"
if ((gpus >= 2)); then
    suite torch-flash "$((gpus - 1))" & flash=$!
    suite triton "$(seq -s, 0 $((gpus - 2)))"; triton_status=$?
    wait "$flash"; flash_status=$?
else
    suite triton "$all"; triton_status=$?
    suite torch-flash "$all"; flash_status=$?
fi
for kernel in triton torch-flash; do
    echo "---- properties-$kernel (summary)"
    grep -E '^(FAILED|ERROR)|passed|failed|examples checked|worst' "$out/properties-$kernel.log" | tail -n 30
done
((triton_status == 0 && flash_status == 0))
