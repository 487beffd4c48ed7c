#!/usr/bin/env bash
# Issue 30's six long scale cases against triton, before and after a change, in one call on one GPU:
#   lab/device/device-six-cases.sh [BEFORE_ROOT]
# 1. `run --cases scale` on the six cases with the package in BEFORE_ROOT (default .bench-before-32,
#    `git archive f9f2fc6 fa2_verify`), then with this tree's (lab/device/device-scale.sh): kernel, golden and
#    comparison seconds per case -> $OUT/run-before.log, $OUT/run-after.log;
# 2. lab/probes/probe_comparison_phases.py on the same cases, this tree: the comparison's sub-steps
#    -> $OUT/compare-after.jsonl (FA2_SIX_PROBE=0 skips it).
# Each side starts from an empty golden cache of its own ($FA2_VERIFY_GOLDEN_CACHE under /tmp), as a first run does.
# FA2_SIX_SIDES="after" runs one side only; FA2_SIX_WARMUP=1 first runs each side's package on two small scale
# cases (bfloat16 and float16, untimed), which compiles the Triton passes it has (verify.bound_weights' two flush
# variants, golden.passes) as any run after a machine's first finds them.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/gpu-out/triton-cache}"
before=${1:-.bench-before-32}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
read -ra sides <<<"${FA2_SIX_SIDES:-before after}"
for side in "${sides[@]}"; do
    echo "== $side"
    root=""
    [[ $side == before ]] && root=$before
    if [[ "${FA2_SIX_WARMUP:-0}" == 1 ]]; then
        FA2_VERIFY_GOLDEN_CACHE="/tmp/golden-cache-warm-$side" FA2_BEFORE_ROOT=$root FA2_SCALE_TARGETS=triton \
            FA2_SCALE_PROFILE_SECONDS=0 FA2_SCALE_CASES="s4096-causal-bf16 b8300-s1-h16-fp16" \
            bash lab/device/device-scale.sh "/tmp/six-warm-$side" 2>&1 | grep -v '^$' | tail -n 1
    fi
    FA2_VERIFY_GOLDEN_CACHE="/tmp/golden-cache-$side" FA2_BEFORE_ROOT=$root FA2_SCALE_TARGETS=triton FA2_SCALE_PROFILE_SECONDS=0 FA2_SCALE_CASES="${long_cases[*]}" \
        bash lab/device/device-scale.sh "/tmp/six-$side" 2>&1 | grep -v '^$' | tail -n 3
    cp "/tmp/six-$side/run-triton.log" "$OUT/run-$side.log"
    grep -A 8 "kernel s" "$OUT/run-$side.log"
done
[[ "${FA2_SIX_PROBE:-1}" == 0 ]] && exit 0
python3 lab/probes/probe_comparison_phases.py --device cuda --kernel triton --scale-set --cases "${long_cases[@]}" \
    2>&1 | tee "$OUT/compare-after.jsonl"
