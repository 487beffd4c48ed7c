#!/usr/bin/env bash
# Named GPU jobs for lab/device/device-gpus.sh, run one after the other on the
# GPU and cores the caller gives (CUDA_VISIBLE_DEVICES), writing under
# $JOB_OUT (default gpu-out/jobs):
#   bash lab/device/device-jobs.sh 'JOB ARG...' ['JOB ARG...' ...]
# Jobs:
#   sensitivity              python -m benchmarks.sensitivity against triton (every length, dtype, mask)
#   mutants                  the two scale mutants right at small shapes on the case each must fail
#   scale-set TARGET...      `run --cases scale` on the long 16-bit cases and b8300 (no verdict may fail)
#   scale-profile TARGET SECONDS SEED   the `scale` property profile for SECONDS (SIGINT), Hypothesis seed SEED
#   ci TARGET WORKERS [BUDGET]  the `ci` profile, one cold pass timed by benchmarks/suite_time.py
#                            (BUDGET: --fa2-time-budget seconds)
#   ci-before-after WORKERS  the `ci` profile against triton, cold, for the package in .bench-before
#                            (`git archive c767bea fa2_verify`) and for this tree
#   race                     lab/device/device-race.sh (fa2-verify race, triton and torch-flash)
# Each job's exit status is printed; the script exits 1 when any job but
# `mutants` (which must fail) exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/triton-cache-${CUDA_VISIBLE_DEVICES:-all}}"
out="${JOB_OUT:-gpu-out/jobs}"
mkdir -p "$out"
verdict_cases="sk65537-none-fp16 s131072-causal-bf16 sk131072-none-fp16 s65537-window-bf16 b8300-s1-h16-fp16"
ok=0
for job in "$@"; do
    read -ra words <<<"$job"
    name="${words[0]}" args=("${words[@]:1}")
    started=$SECONDS
    case "$name" in
    sensitivity)
        python3 -m benchmarks.sensitivity --device cuda --kernel triton --out "$out/sensitivity.md" --overwrite \
            >"$out/sensitivity.log" 2>&1 ;;
    mutants)
        OUT="$out" bash lab/device/device-verdicts.sh mutants ;;
    scale-set)
        FA2_SCALE_TARGETS="${args[*]}" FA2_SCALE_CASES="$verdict_cases" FA2_SCALE_PROFILE_SECONDS=0 \
            bash lab/device/device-scale.sh "$out/scale-set" ;;
    scale-profile)
        target="${args[0]}" seconds="${args[1]}" seed="${args[2]}"
        timeout -s INT -k 30 "$seconds" python3 -m pytest --pyargs fa2_verify.properties "${plugin[@]}" \
            -v -rfE -p no:cacheprovider --hypothesis-seed="$seed" --fa2-kernel "$target" --fa2-device cuda \
            --fa2-profile scale >"$out/scale-profile-$target.log" 2>&1
        grep -E '^(FAILED|ERROR)|passed|failed|examples checked|worst' "$out/scale-profile-$target.log" | tail -n 20
        ! grep -qE '^FAILED' "$out/scale-profile-$target.log" ;;
    ci)
        target="${args[0]}" workers="${args[1]}" budget=()
        [[ -n "${args[2]:-}" ]] && budget=(--fa2-time-budget "${args[2]}")
        python3 benchmarks/suite_time.py --device cuda --kernel "$target" --profile ci --workers "$workers" \
            --passes cold --time-limit 290 --out "$out/ci-${target##*:}" -- --dist worksteal "${budget[@]}" \
            >"$out/ci-${target##*:}.log" 2>&1
        status=$?
        tail -n 25 "$out/ci-${target##*:}.log"
        grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed)|examples' "$out/ci-${target##*:}/cold/pytest.log" | tail -n 15
        ((status == 0)) ;;
    ci-before-after)
        for side in before after; do
            root=()
            [[ $side == before ]] && root=(--package-root .bench-before)
            python3 benchmarks/suite_time.py --device cuda --kernel triton --profile ci --workers "${args[0]}" \
                --passes cold --time-limit 290 "${root[@]}" --out "$out/ci-$side" -- --dist worksteal \
                >"$out/ci-$side.log" 2>&1
            echo "-- ci against triton, $side: exit $?"
            tail -n 8 "$out/ci-$side.log"
        done ;;
    race)
        bash lab/device/device-race.sh "$out/race" ;;
    *)
        echo "unknown job: $name" >&2
        false ;;
    esac
    status=$?
    echo "== job $job: exit $status after $((SECONDS - started)) s"
    [[ $name == mutants ]] || ((status == 0)) || ok=1
done
exit "$ok"
