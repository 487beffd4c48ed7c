#!/usr/bin/env bash
# Races that show once in many runs, on one GPU (docs/properties.md, "Races
# that show once in many runs"): `fa2-verify race --device cuda --repeats 1000`
# for triton and torch-flash over the race-prone set (seqlen 4,224, (2000, 4000),
# GQA, causal and not, deterministic on and off; fa2_verify/app/cases/race.py).
# Writes into $1 (default $OUT/race, else gpu-out/race): race-NAME.json (the
# report: per case and output the promise, distinct results, the first differing
# element, the spread against the atomic-dQ bound) and race-NAME.log (the table
# and the broken promises).  FA2_RACE_REPEATS overrides the repeats.
# Exit status: 0 when both kernels keep every promise, else 1.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
out="${1:-${OUT:-gpu-out}/race}"
mkdir -p "$out"
ok=0
for target in triton torch-flash; do
    python3 -m fa2_verify race --kernel "$target" --device cuda --repeats "${FA2_RACE_REPEATS:-1000}" \
        --json-report "$out/race-$target.json" --overwrite >"$out/race-$target.log" 2>&1
    status=$?
    echo "== race --kernel $target: exit $status"
    tail -n 1 "$out/race-$target.log"
    grep -E 'BROKEN|error' "$out/race-$target.log" | head -n 12
    ((status == 0)) || ok=1
done
exit "$ok"
