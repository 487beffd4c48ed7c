#!/usr/bin/env bash
# Every target of $FA2_TARGETS (default: sdpa-efficient sdpa-cudnn flex-attention
# flash-attn-4 flash-attn) on the GPUs of this host, from the source tree:
#   1. `fa2-verify run` on the fixed cases (report, Markdown and log per kernel);
#   2. the property suite once per entry of $FA2_TARGET_RUNS (default "ci:0 dev:1
#      dev:2", PROFILE:SEED), $FA2_TARGET_WORKERS xdist workers (default 8), each
#      stopped (SIGINT, so pytest still reports) after $FA2_TARGET_TIMEOUT seconds
#      (default 600), JUnit XML per run;
#   3. the kernel x property table of every run (benchmarks/targets_table.py).
# FA2_TARGET_CONCURRENT=1 runs the targets side by side (one background job per
# target, each with its own workers), for small-shape runs that leave the GPU idle.
# FA2_TARGET_SELECT (a pytest -k expression) runs only the properties it selects;
# FA2_TARGET_FIXED=0 skips step 1.
# A target that cannot run here is still run: `run` then reports it unsupported
# with its reason, and the table shows why.
# Dependencies the GPU image lacks come from .whl-c (lab/device/device-deps.sh).
# Writes into $1 (default gpu-out): run-KERNEL.log/.md, properties-KERNEL-PROFILE-SEED.log/.xml,
# targets.md.  Exit status: 0 when every run and property run passed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
out="${1:-gpu-out}"
mkdir -p "$out"
read -ra targets <<<"${FA2_TARGETS:-sdpa-efficient sdpa-cudnn flex-attention flash-attn-4 flash-attn}"
read -ra runs <<<"${FA2_TARGET_RUNS:-ci:0 dev:1 dev:2}"
workers="${FA2_TARGET_WORKERS:-8}"
cap="${FA2_TARGET_TIMEOUT:-600}"
select=()
[[ -n "${FA2_TARGET_SELECT:-}" ]] && select=(-k "$FA2_TARGET_SELECT")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# One target: `run`, then each property run; prints its lines, exit 0 when all passed.
verify_target() {
    local kernel=$1 entry profile seed name start got status=0
    if [[ "${FA2_TARGET_FIXED:-1}" != 0 ]]; then
        start=$SECONDS
        python3 -m fa2_verify run --kernel "$kernel" --device cuda --report "$out/run-$kernel" \
            --markdown "$out/run-$kernel.md" --overwrite >"$out/run-$kernel.log" 2>&1
        got=$?
        echo "== run $kernel: exit $got ($((SECONDS - start)) s)"
        tail -n 16 "$out/run-$kernel.log"
        ((got == 0)) || status=1
    fi
    for entry in "${runs[@]}"; do
        profile="${entry%%:*}" seed="${entry##*:}" name="$kernel-${entry/:/-}"
        start=$SECONDS
        timeout -s INT -k 30 "$cap" python3 -m pytest --pyargs fa2_verify.properties "${plugin[@]}" "${select[@]}" \
            -n "$workers" -rfEs -p no:cacheprovider --hypothesis-seed="$seed" \
            --fa2-kernel "$kernel" --fa2-device cuda --fa2-profile "$profile" \
            --fa2-examples-dir "$out/examples-$name" --junitxml "$out/properties-$name.xml" \
            >"$out/properties-$name.log" 2>&1
        got=$?
        echo "== properties $name: exit $got ($((SECONDS - start)) s)"
        grep -E '^(FAILED|ERROR)|passed|failed|examples checked' "$out/properties-$name.log" | tail -n 8
        ((got == 0)) || status=1
    done
    return "$status"
}

status=0
if [[ "${FA2_TARGET_CONCURRENT:-0}" == 1 ]]; then
    pids=()
    for kernel in "${targets[@]}"; do
        verify_target "$kernel" >"$out/target-$kernel.txt" 2>&1 &
        pids+=($!)
    done
    for index in "${!pids[@]}"; do
        wait "${pids[$index]}" || status=1
        cat "$out/target-${targets[$index]}.txt"
    done
else
    for kernel in "${targets[@]}"; do
        verify_target "$kernel" || status=1
    done
fi
xmls=()
for kernel in "${targets[@]}"; do
    for entry in "${runs[@]}"; do
        xml="$out/properties-$kernel-${entry/:/-}.xml"
        [[ -f "$xml" ]] && xmls+=("$xml")
    done
done
((${#xmls[@]})) && python3 benchmarks/targets_table.py "${xmls[@]}" >"$out/targets.md" && cat "$out/targets.md"
exit "$status"
