#!/usr/bin/env bash
# The counter-based input values on one GPU, in one call:
#   lab/device/device-values.sh
# 1. tests/test_counter_rng.py and tests/test_digest.py: every generator's inputs, in every dtype, the same
#    bits on the CPU and the GPU (the test skipped on a CPU-only machine);
# 2. the gate baselines of triton and torch-flash on the corpus (3 repeats, for the atomic dQ) into
#    $OUT/<kernel>-<gpu>.json, each then gated against itself;
# 3. lab/device/device-throughput.sh 0: the golden tables and the six long scale cases (no profile).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
# shellcheck source=ci/common.sh
source ci/common.sh
tag="$(gpu_tag)"
results="$OUT"
python3 -m pytest -q -p no:cacheprovider tests/test_counter_rng.py tests/test_digest.py 2>&1 | tail -n 5
for kernel in triton torch-flash; do
    started=$(date +%s)
    python3 -m fa2_verify baseline --kernel "$kernel" --device cuda --repeats 3 --out "$OUT/$kernel-$tag.json" \
        >>"$OUT/baselines.log" 2>&1
    echo "== baseline $kernel: exit $? after $(($(date +%s) - started)) s"
    python3 -m fa2_verify gate --kernel "$kernel" --device cuda --baseline "$OUT/$kernel-$tag.json" 2>&1 | tail -n 3
done
# the device tool brings back 8 files: the throughput tables go to one file
OUT=/tmp/throughput
mkdir -p "$OUT"
OUT="$OUT" bash lab/device/device-throughput.sh 0 >/dev/null 2>&1
cat /tmp/throughput/gpu.txt /tmp/throughput/golden-*.md >"$results/golden.md" 2>/dev/null
cp /tmp/throughput/scale/run-triton.log "$results/"
cat "$results/golden.md"
grep -A 12 "kernel s" "$results/run-triton.log"
