#!/usr/bin/env bash
# The scale demonstration on one GPU, from the source tree (no install step):
# `fa2-verify run --cases scale` for triton, torch-flash and each scale mutant
# of tests/mutants.py (SCALE_MUTANTS), then the `scale` property profile
# against triton for $FA2_SCALE_PROFILE_SECONDS seconds (default 600).
# Each run writes into $1 (default gpu-out/scale): run-NAME.log (the verdict
# table, the failure descriptions naming each failing output, and the seconds
# per case in the kernel, the golden and the comparison), run-NAME/tolerance.json,
# properties-scale.log (-v, Hypothesis statistics, examples per second and
# the worst cases of the plugin's summary), and Hypothesis' observations of every
# finished example with their summary (benchmarks/observed_summary.py: examples per
# second and the largest shapes, also for a run the time limit stopped).  At the end it prints one table:
# target, exit status, cases passed/failed, and total kernel, golden and
# comparison seconds; then the failing outputs of each mutant.
# Dependencies the GPU image lacks come from .whl-c (lab/device/device-deps.sh).
# FA2_SCALE_TARGETS overrides the run targets (space-separated; empty: none);
# FA2_SCALE_CASES (space-separated case names) runs only those cases of the set
# (`run --case`), e.g. a mutant on the one case it must fail;
# FA2_SCALE_PROFILE_SECONDS=0 skips the profile, FA2_SCALE_PROFILE_SEED sets its
# --hypothesis-seed (several calls of a few minutes each then add up to a long search);
# FA2_SCALE_WARMUP=background compiles the profile's triton variants beside it (`fa2-verify warmup` on the
# cores the one pytest process leaves, as ci/properties.sh's FA2_WARMUP=background; its log in $1/warmup.log;
# FA2_SCALE_WARMUP_EXAMPLES draws per property, default 100: the suite runs three dtype shards of each);
# FA2_SCALE_WORKERS=W runs the profile on W pytest-xdist workers sharing the GPU (`-n W --dist worksteal`, under
# NVIDIA's MPS as ci/properties.sh's FA2_MPS=1; default 1, one process); the profile's line "examples in ... s of
# wall time" counts the examples Hypothesis observed over the run's wall-clock seconds, whatever the workers.
# FA2_SCALE_STACKS=FILE samples the profile's Python stacks with py-spy (on PATH) into FILE
# (collapsed stacks, lab/probes/stack_summary.py reads them).
# FA2_BEFORE_ROOT=DIR (relative to the repository) runs the fa2_verify package in DIR instead of this tree's
# (e.g. `git archive COMMIT fa2_verify` there): a "before" side of a comparison on the same machine.
# Exit status: 0 when triton and torch-flash pass, every mutant fails (exit 1)
# and the profile run ends without a failure.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/gpu-out/triton-cache}"
fa2=(python3 -m fa2_verify)
if [[ -n "${FA2_BEFORE_ROOT:-}" ]]; then
    # `python3 -m` puts the working directory (this tree) first on sys.path, ahead of PYTHONPATH
    fa2=(python3 -c 'import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module("fa2_verify", run_name="__main__")'
        "$PWD/$FA2_BEFORE_ROOT")
fi
out="${1:-gpu-out/scale}"
mkdir -p "$out" "$TRITON_CACHE_DIR"
mutants="$(python3 -c 'from tests.mutants import SCALE_MUTANTS; print(" ".join(f"tests.mutants:{n}" for n in SCALE_MUTANTS))')"
read -ra targets <<<"${FA2_SCALE_TARGETS-triton torch-flash $mutants}"

selected=()
for name in ${FA2_SCALE_CASES:-}; do
    selected+=(--case "$name")
done
declare -A status
for target in "${targets[@]}"; do
    name="${target##*:}"
    "${fa2[@]}" run --kernel "$target" --device cuda --cases scale "${selected[@]}" \
        --report "$out/run-$name" --overwrite >"$out/run-$name.log" 2>&1
    status[$target]=$?
    echo "== run --cases scale --kernel $target: exit ${status[$target]}"
done

printf '\n%-36s %5s %8s %8s %10s %10s %10s\n' target exit passed failed "kernel s" "golden s" "compare s"
for target in "${targets[@]}"; do
    name="${target##*:}"
    python3 - "$out/run-$name.log" "$target" "${status[$target]}" <<'EOF'
import re, sys
log, target, code = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(log).read()
counts = re.search(r": (\d+) passed, (\d+) failed", text)
passed, failed = counts.groups() if counts else ("-", "-")
totals = [0.0, 0.0, 0.0]
timing = text[text.index("kernel s"):].splitlines()[1:] if "kernel s" in text else []
for line in timing:
    cells = line.split()
    if len(cells) != 5:
        break
    for column, cell in enumerate(cells[1:4]):
        totals[column] += float(cell) if cell != "-" else 0.0
print(f"{target:<36} {code:>5} {passed:>8} {failed:>8} {totals[0]:>10.1f} {totals[1]:>10.1f} {totals[2]:>10.1f}")
EOF
done
for target in "${targets[@]}"; do
    case "$target" in tests.mutants:*)
        echo "---- $target"
        grep -E 'failing outputs|mismatches the golden' "$out/run-${target##*:}.log" | head -n 12 ;;
    esac
done

seconds="${FA2_SCALE_PROFILE_SECONDS:-600}"
if ((seconds > 0)); then
    workers=()
    if ((${FA2_SCALE_WORKERS:-1} > 1)); then
        workers=(-n "$FA2_SCALE_WORKERS" --dist worksteal)
        nvidia-cuda-mps-control -d
    fi
    started=$(date +%s)
    rm -rf .hypothesis/observed
    HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY=1 HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER=1 \
        timeout -s INT -k 30 "$seconds" python3 -m pytest --pyargs fa2_verify.properties "${plugin[@]}" \
        -v -rfE --hypothesis-show-statistics -p no:cacheprovider "${workers[@]}" \
        ${FA2_SCALE_PROFILE_SEED:+--hypothesis-seed="$FA2_SCALE_PROFILE_SEED"} \
        --fa2-kernel triton --fa2-device cuda --fa2-profile scale \
        --fa2-examples-dir "$out/examples-scale" >"$out/properties-scale.log" 2>&1 &
    suite=$!
    if [[ "${FA2_SCALE_WARMUP:-0}" == background ]]; then
        setsid "${fa2[@]}" warmup --profile scale --processes "$(($(nproc) - 2))" \
            --examples "${FA2_SCALE_WARMUP_EXAMPLES:-100}" >"$out/warmup.log" 2>&1 &
        warmup=$!
    fi
    if [[ -n "${FA2_SCALE_STACKS:-}" ]]; then
        sleep 2
        py-spy record --pid "$(pgrep -P "$suite")" ${workers[0]:+--subprocesses} --format raw --rate 50 -o "$FA2_SCALE_STACKS" >"$out/py-spy.log" 2>&1 &
    fi
    wait "$suite"
    code=$?
    wall=$(($(date +%s) - started))
    echo "== scale profile against triton: exit $code after $wall s"
    [[ -n "${warmup:-}" ]] && kill -- -"$warmup" 2>/dev/null
    ((${#workers[@]})) && { echo quit | nvidia-cuda-mps-control; }
    wait
    grep -E '^(FAILED|ERROR)|passed|failed|examples checked|worst' "$out/properties-scale.log" | tail -n 30
    cp .hypothesis/observed/*_testcases.jsonl "$out/" 2>/dev/null
    compgen -G "$out/*_testcases.jsonl" >/dev/null && python3 benchmarks/observed_summary.py --wall "$wall" "$out"/*_testcases.jsonl | tee "$out/scale-profile.md"
fi

ok=0
for target in "${targets[@]}"; do
    case "$target" in
    tests.mutants:*) ((status[$target] == 1)) || ok=1 ;;
    *) ((status[$target] == 0)) || ok=1 ;;
    esac
done
# the profile is stopped by the timeout (SIGINT: pytest exits 2 after reporting); only a failure counts
[[ -f "$out/properties-scale.log" ]] && grep -qE '^FAILED' "$out/properties-scale.log" && ok=1
exit "$ok"
