#!/usr/bin/env bash
# The statistical and local verdicts on one GPU, from the source tree, in steps
# named on the command line (each writes under $OUT, default gpu-out/verdicts):
#   mutants      the two scale mutants that are right at small shapes, each on
#                the one scale case it must fail (KEYS_PAST_65536_IGNORED on
#                sk65537-none-fp16, LAST_QUERY_TILE_STALE on s131072-causal-bf16),
#                through lab/device/device-scale.sh: the failure messages name
#                the verdict, its score and the rows or keys
#   correct      `run --cases scale` for each target of $FA2_VERDICT_TARGETS
#                (default triton) on $FA2_VERDICT_CASES (default: the five long
#                16-bit cases and b8300-s1-h16-fp16): no verdict may fail
#   sensitivity  python -m benchmarks.sensitivity against triton
#                ($FA2_SENSITIVITY_ARGS adds options, e.g. --lengths)
#   layout       the layout property (ci profile) against each target of
#                $FA2_LAYOUT_TARGETS (default torch-flash sdpa-efficient sdpa-cudnn)
# Exit status: the largest of the steps' own exit statuses is not meaningful
# (mutants must fail); read the logs.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
out="${OUT:-gpu-out}/verdicts"
mkdir -p "$out"
export FA2_SCALE_PROFILE_SECONDS=0
cases="${FA2_VERDICT_CASES:-sk65537-none-fp16 s131072-causal-bf16 sk131072-none-fp16 s65537-window-bf16 b8300-s1-h16-fp16}"
for step in "$@"; do
    case "$step" in
    mutants)
        FA2_SCALE_TARGETS=tests.mutants:KEYS_PAST_65536_IGNORED FA2_SCALE_CASES=sk65537-none-fp16 \
            bash lab/device/device-scale.sh "$out/mutant-keys"
        FA2_SCALE_TARGETS=tests.mutants:LAST_QUERY_TILE_STALE FA2_SCALE_CASES=s131072-causal-bf16 \
            bash lab/device/device-scale.sh "$out/mutant-stale"
        ;;
    correct)
        FA2_SCALE_TARGETS="${FA2_VERDICT_TARGETS:-triton}" FA2_SCALE_CASES="$cases" \
            bash lab/device/device-scale.sh "$out/correct"
        ;;
    sensitivity)
        read -ra extra <<<"${FA2_SENSITIVITY_ARGS:-}"
        python3 -m benchmarks.sensitivity --device cuda --kernel triton --out "$out/sensitivity.md" --overwrite \
            "${extra[@]}" 2>&1 | tee "$out/sensitivity.log"
        ;;
    layout)
        for target in ${FA2_LAYOUT_TARGETS:-torch-flash sdpa-efficient sdpa-cudnn}; do
            timeout -s INT 240 python3 -m pytest --pyargs fa2_verify.properties "${plugin[@]}" -k layout \
                --fa2-kernel "$target" --fa2-device cuda --fa2-profile ci -n 4 -p no:cacheprovider -rfE \
                >"$out/layout-$target.log" 2>&1
            echo "== layout property --fa2-kernel $target: exit $? ($(tail -1 "$out/layout-$target.log"))"
        done
        ;;
    *)
        echo "unknown step: $step (mutants, correct, sensitivity, layout)" >&2
        exit 2
        ;;
    esac
done
