#!/usr/bin/env bash
# Every GPU claim of fa2-verify in one call, on a machine with no network and no
# install step (the project runs from the source tree through PYTHONPATH):
#   1. `run` on the fixed cases for triton and torch-flash;
#   2. the property suite (ci profile) against both (lab/device/device-properties.sh);
#   3. baselines of both on the gate corpus (3 repeats, for the atomic dQ),
#      the gate twice against each, and a degraded triton (error of out x2)
#      that the gate must fail.
# FA2_STEPS picks steps (default run,properties,gate); FA2_PROPERTIES_TIMEOUT
# caps each property-suite run in seconds (default 1800).
# Writes logs, reports and baselines under $FA2_WORK (default gpu-out) and packs
# them, golden cache aside, into $FA2_ARCHIVE (default gpu-out.tgz).
# Exit status: 0 when every step did what it must.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${FA2_WORK:-gpu-out}"
archive="${FA2_ARCHIVE:-$out.tgz}"
steps="${FA2_STEPS:-run,properties,gate}"
mkdir -p "$out/baselines"
cache="$out/golden-cache"
tag="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | grep -oiE '\b[a-z][0-9]{2,4}\b' | head -n 1 | tr '[:upper:]' '[:lower:]')"
status=0
fv=(python3 -m fa2_verify)
expect() {  # expect CODE DESCRIPTION COMMAND...
    local want="$1" what="$2"; shift 2
    "$@" >"$out/$what.log" 2>&1
    local got=$?
    tail -n 40 "$out/$what.log"
    if [[ "$got" -ne "$want" ]]; then echo "!! $what: exit $got, expected $want"; status=1; else echo "== $what: exit $got as expected"; fi
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
if [[ "$steps" == *properties* ]]; then
    expect 0 properties bash lab/device/device-properties.sh "$out"
fi
for kernel in triton torch-flash; do
    if [[ "$steps" == *run* ]]; then
        expect 0 "run-$kernel" "${fv[@]}" run --kernel "$kernel" --device cuda --report "$out/run-$kernel" \
            --markdown "$out/run-$kernel.md" --overwrite
    fi
    if [[ "$steps" == *gate* ]]; then
        baseline="$out/baselines/$kernel-$tag.json"
        expect 0 "baseline-$kernel" "${fv[@]}" baseline --kernel "$kernel" --device cuda --repeats 3 \
            --out "$baseline" --golden-cache "$cache" --overwrite
        for attempt in 1 2; do
            expect 0 "gate-$kernel-$attempt" "${fv[@]}" gate --kernel "$kernel" --device cuda --baseline "$baseline" \
                --golden-cache "$cache" --out "$out/gate-$kernel-$attempt.json" --overwrite
        done
    fi
done
if [[ "$steps" == *gate* ]]; then
    degraded="$out/baselines/degraded-triton.json"
    expect 0 baseline-degraded env FA2_DEGRADE_OUT=0 "${fv[@]}" baseline --kernel tests.degraded:TRITON --device cuda \
        --dtypes float16,bfloat16 --out "$degraded" --golden-cache "$cache" --overwrite
    expect 1 gate-degraded env FA2_DEGRADE_OUT=1 "${fv[@]}" gate --kernel tests.degraded:TRITON --device cuda \
        --dtypes float16,bfloat16 --baseline "$degraded" --golden-cache "$cache" --overwrite
fi
tar czf "$archive" --exclude=golden-cache --exclude=triton-cache --exclude='examples-*' -C "$out" .
exit "$status"
