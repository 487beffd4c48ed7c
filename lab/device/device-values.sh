#!/usr/bin/env bash
# The counter-based input values on one GPU, in one call:
#   lab/device/device-values.sh [PROFILE_SECONDS]
# 1. tests/test_counter_rng.py and tests/test_digest.py: every generator's inputs, in every dtype, the same
#    bits on the CPU and the GPU (the test skipped on a CPU-only machine) -> $OUT/tests.log;
# 2. the gate baselines of triton and torch-flash on the corpus (3 repeats, for the atomic dQ) into
#    $OUT/<kernel>-<gpu>.json, each then gated against itself -> $OUT/baselines.log;
# 3. lab/device/device-scale.sh for triton on the six long scale cases, then the `scale` profile for
#    PROFILE_SECONDS (default 0: none) -> $OUT/run-triton.log, properties-scale.log, scale-profile.md.
# The golden tables of issue 30 are lab/device/device-throughput.sh's.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
# shellcheck source=ci/common.sh
source ci/common.sh
tag="$(gpu_tag)"
python3 -m pytest -q -p no:cacheprovider tests/test_counter_rng.py tests/test_digest.py >"$OUT/tests.log" 2>&1
echo "== device-equality tests: exit $?"
tail -n 3 "$OUT/tests.log"
for kernel in triton torch-flash; do
    started=$(date +%s)
    python3 -m fa2_verify baseline --kernel "$kernel" --device cuda --repeats 3 --out "$OUT/$kernel-$tag.json" \
        >>"$OUT/baselines.log" 2>&1
    echo "== baseline $kernel: exit $? after $(($(date +%s) - started)) s"
    python3 -m fa2_verify gate --kernel "$kernel" --device cuda --baseline "$OUT/$kernel-$tag.json" 2>&1 | tail -n 2
done
FA2_SCALE_TARGETS=triton FA2_SCALE_PROFILE_SECONDS="${1:-0}" \
    FA2_SCALE_CASES="${long_cases[*]}" \
    bash lab/device/device-scale.sh /tmp/scale 2>&1 | grep -v '^$' | tail -n 25
for file in run-triton.log properties-scale.log scale-profile.md; do
    cp "/tmp/scale/$file" "$OUT/" 2>/dev/null
done
grep -A 8 "kernel s" "$OUT/run-triton.log"
