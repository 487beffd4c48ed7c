#!/usr/bin/env bash
# The `scale` profile's throughput against triton on one GPU, by the number of pytest-xdist workers sharing it:
#   lab/device/device-scale-workers.sh SECONDS WORKERS...
# For each count W, lab/device/device-scale.sh runs the profile for SECONDS with FA2_SCALE_WORKERS=W
# (W > 1 under MPS), each run from an empty Triton cache and an empty example database, all with the
# --hypothesis-seed $FA2_SCALE_PROFILE_SEED (default 3), so the runs draw the same examples per property.
# $OUT/scale-W.md: benchmarks/observed_summary.py's tables, with examples over the run's wall time;
# $OUT/properties-W.log: the pytest log.  Prints each run's exit status and wall-time rate.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
seconds=${1:?seconds per run}
shift
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
for count in "$@"; do
    work="/tmp/scale-workers-$count"
    TRITON_CACHE_DIR="$work/triton-cache" FA2_SCALE_TARGETS="" FA2_SCALE_WORKERS="$count" \
        FA2_SCALE_PROFILE_SEED="${FA2_SCALE_PROFILE_SEED:-3}" FA2_SCALE_PROFILE_SECONDS="$seconds" \
        bash lab/device/device-scale.sh "$work" 2>&1 | grep -E '^== scale profile'
    cp "$work/scale-profile.md" "$OUT/scale-$count.md" 2>/dev/null
    cp "$work/properties-scale.log" "$OUT/properties-$count.log"
    echo "-- $count worker(s): $(grep -E 'wall time' "$OUT/scale-$count.md" 2>/dev/null)"
done
