#!/usr/bin/env bash
# Run the property suite against the correct kernels of other numerics
# (tests/variants.py: float32 P, exp2, split-KV, per-head GQA rounding, ...),
# each of which must pass: a failure is a false alarm of the error model
# (docs/properties.md, "Correct kernels of other numerics").
#   lab/false-alarms.sh [NAME ...]     (default: every kernel of tests.variants.NAMES)
# $FA2_PROFILE (default ci), $FA2_SEED (a --hypothesis-seed; default: the profile's own),
# $FA2_WORKERS (pytest-xdist workers, default 2) and $FA2_OUT (default ci-out/false-alarms)
# apply; each kernel's pytest output goes to $FA2_OUT/NAME.log and one line per
# kernel to $FA2_OUT/summary.txt.  Exits 1 if any kernel failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
python="${FA2_VENV:-.venv}/bin/python"
out="${FA2_OUT:-ci-out/false-alarms}"
mkdir -p "$out"
if [[ $# -eq 0 ]]; then
    mapfile -t names < <(PYTHONPATH=. "$python" -c 'from tests.variants import NAMES; print("\n".join(NAMES))')
else
    names=("$@")
fi
seed=()
[[ -n "${FA2_SEED:-}" ]] && seed=(--hypothesis-seed "$FA2_SEED")
status=0
for name in "${names[@]}"; do
    start=$SECONDS
    PYTHONPATH=. "$python" -m pytest --pyargs fa2_verify.properties -p no:cacheprovider -q \
        --fa2-kernel "tests.variants:$name" --fa2-device cpu --fa2-profile "${FA2_PROFILE:-ci}" \
        -n "${FA2_WORKERS:-2}" "${seed[@]}" >"$out/$name.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && status=1
    echo "$name: exit $rc, $((SECONDS - start)) s, $(grep -E '(passed|failed|error)' "$out/$name.log" | tail -n 1)" \
        | tee -a "$out/summary.txt"
done
exit "$status"
