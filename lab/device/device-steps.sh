#!/usr/bin/env bash
# Named GPU runs in one sequence, meant to run detached (setsid) across several
# device calls, each call collecting what is done so far; the steps of $FA2_STEPS
# (default "triton flash flex fa4 bench mps"), in the order given:
#   triton  benchmarks/suite_time.py, `ci` against triton, cold then warm Triton cache;
#   triton-mps  the same under CUDA MPS, as the GPU workflow runs the suite (FA2_MPS=1), then
#           cold again with the durations the first two passes recorded (`cold-known`);
#   triton-first  under CUDA MPS, one cold pass (empty Triton and pytest caches) ordered on the
#           committed ci/durations.json (--fa2-durations): a fresh runner's first run;
#   ab-cold  under CUDA MPS, cold passes of the package in $FA2_BENCH_BEFORE and of this tree,
#           taking turns twice (before, after, before, after) on one host;
#   flash   the same against torch-flash, one pass;
#   flash-mps  the same under CUDA MPS;
#   flex    flex-attention alone (lab/device/device-targets.sh): the runs of $FA2_FLEX_RUNS (default
#           `ci:0`) on $FA2_FLEX_WORKERS workers (default 16), each stopped after
#           $FA2_FLEX_TIMEOUT seconds (default 400), GPU memory logged every 15 s;
#   flexprobe  lab/probes/probe_flex_compile.py: FlexAttention's compiles and GPU memory per mode ($FA2_FLEX_PROBE_MODES);
#   flashattn  the real flash-attn built by lab/third-party/build-flash-attn.sh (carry .fa2src; ninja resumes in
#           $FA2_FLASH_ATTN_BUILD), then `run` and the property runs of $FA2_FLASHATTN_RUNS (default
#           `dev:2 ci:0 dev:1`) on $FA2_FLASHATTN_WORKERS workers (default 16), each stopped after
#           $FA2_FLASHATTN_TIMEOUT seconds (default 300);
#   fa4     flash-attn-4 alone, `ci` seed 0, installed by lab/third-party/install-fa4.sh into $FA2_FA4_SITE
#           (default /root/site);
#   bench   benchmarks/bench_before_after.py against the package in $FA2_BENCH_BEFORE
#           (default bench-before: `git archive <commit> fa2_verify | tar -x -C bench-before`);
#   mps     the triton warm pass again on the cache the triton step left, then torch-flash,
#           under CUDA MPS.
#   scale   the scale set against triton, no profile run (lab/device/device-scale.sh).
# Suite runs use $FA2_SUITE_WORKERS pytest-xdist workers (default 12) and `--dist worksteal`,
# as ci/properties.sh does.  Each step writes into $1/<step> (default gpu-out/steps)
# and its console into $1/<step>.txt; $1/done is written at the end.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
out="${1:-gpu-out/steps}"
workers="${FA2_SUITE_WORKERS:-12}"
before="${FA2_BENCH_BEFORE:-bench-before}"
mkdir -p "$out"
suite_time=(python3 benchmarks/suite_time.py --device cuda --profile ci --workers "$workers")
site="${FA2_FA4_SITE:-/root/site}"
for step in ${FA2_STEPS:-triton flash flex fa4 bench mps}; do
    start=$SECONDS
    case "$step" in
        triton) "${suite_time[@]}" --kernel triton --passes cold,warm --time-limit 280 --out "$out/triton" \
                    -- --dist worksteal ;;
        triton-mps) nvidia-cuda-mps-control -d
             "${suite_time[@]}" --kernel triton --passes cold,warm,cold-known --time-limit 280 \
                 --out "$out/triton-mps" \
                 -- --dist worksteal
             echo quit | nvidia-cuda-mps-control ;;
        triton-first) nvidia-cuda-mps-control -d
             "${suite_time[@]}" --kernel triton --passes cold --time-limit 280 --out "$out/triton-first" \
                 -- --dist worksteal --fa2-durations "$PWD/ci/durations.json"
             echo quit | nvidia-cuda-mps-control ;;
        ab-cold) nvidia-cuda-mps-control -d
             for turn in 1 2; do
                 "${suite_time[@]}" --kernel triton --passes cold --time-limit 280 --package-root "$before" \
                     --out "$out/ab-cold/before-$turn" -- --dist worksteal
                 "${suite_time[@]}" --kernel triton --passes cold --time-limit 280 \
                     --out "$out/ab-cold/after-$turn" -- --dist worksteal
             done
             echo quit | nvidia-cuda-mps-control ;;
        flash) "${suite_time[@]}" --kernel torch-flash --passes cold --time-limit 150 --out "$out/flash" \
                    -- --dist worksteal ;;
        flash-mps) nvidia-cuda-mps-control -d
             "${suite_time[@]}" --kernel torch-flash --passes cold --time-limit 150 --out "$out/flash-mps" \
                 -- --dist worksteal
             echo quit | nvidia-cuda-mps-control ;;
        flex) nvidia-smi --query-gpu=timestamp,memory.used --format=csv -l 15 >"$out/flex-memory.csv" &
             monitor=$!
             FA2_TARGETS=flex-attention FA2_TARGET_RUNS="${FA2_FLEX_RUNS:-ci:0}" \
                 FA2_TARGET_WORKERS="${FA2_FLEX_WORKERS:-16}" FA2_TARGET_TIMEOUT="${FA2_FLEX_TIMEOUT:-400}" \
                 OMP_NUM_THREADS=1 bash lab/device/device-targets.sh "$out/flex"
             kill "$monitor" ;;
        flexprobe) python3 lab/probes/probe_flex_compile.py --cases "${FA2_FLEX_PROBE_CASES:-16}" \
                       --modes "${FA2_FLEX_PROBE_MODES:-target,auto,auto-tensor}" --out "$out/flexprobe" ;;
        flashattn) bash lab/third-party/build-flash-attn.sh >"$out/flashattn-build.txt" 2>&1 &&
             eval "$(tail -n 1 "$out/flashattn-build.txt")" &&
             FA2_TARGETS=flash-attn FA2_TARGET_RUNS="${FA2_FLASHATTN_RUNS:-dev:2 ci:0 dev:1}" \
                 FA2_TARGET_WORKERS="${FA2_FLASHATTN_WORKERS:-16}" FA2_TARGET_TIMEOUT="${FA2_FLASHATTN_TIMEOUT:-300}" \
                 OMP_NUM_THREADS=1 bash lab/device/device-targets.sh "$out/flashattn" ;;
        fa4) PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH" FA2_TARGETS=flash-attn-4 \
                    FA2_TARGET_RUNS=ci:0 FA2_TARGET_WORKERS=16 FA2_TARGET_TIMEOUT=400 OMP_NUM_THREADS=1 \
                    bash lab/device/device-targets.sh "$out/fa4" ;;
        bench) python3 benchmarks/bench_before_after.py --before "$before" --repeats 2 --out "$out/bench" ;;
        mps) nvidia-cuda-mps-control -d
             "${suite_time[@]}" --kernel triton --passes warm --triton-cache "$out/triton/triton-cache" \
                 --time-limit 150 --out "$out/mps" -- --dist worksteal
             "${suite_time[@]}" --kernel torch-flash --passes cold --time-limit 150 --out "$out/mps-flash" \
                 -- --dist worksteal
             echo quit | nvidia-cuda-mps-control ;;
        scale) FA2_SCALE_TARGETS=triton FA2_SCALE_PROFILE_SECONDS=0 bash lab/device/device-scale.sh "$out/scale" ;;
        *) echo "unknown step $step" ;;
    esac >"$out/$step.txt" 2>&1
    echo "== $step: exit $? ($((SECONDS - start)) s)" >>"$out/steps.txt"
done
date >"$out/done"
