#!/usr/bin/env bash
# The `scale` profile's throughput against triton on one GPU, by the number of pytest-xdist workers sharing it:
#   lab/device/device-scale-workers.sh SECONDS WORKERS...
# For each count W, lab/device/device-scale.sh runs the profile for SECONDS with FA2_SCALE_WORKERS=W
# (W > 1 under MPS), each run from an empty Triton cache and an empty example database, all with the
# --hypothesis-seed $FA2_SCALE_PROFILE_SEED (default 3), so the runs draw the same examples per property.
# $OUT/scale-W.md: benchmarks/observed_summary.py's tables, with examples over the run's wall time;
# $OUT/properties-W.log: the pytest log.  Prints each run's exit status and wall-time rate.
# First it prints the workers per GPU `python -m fa2_verify.properties.gpu_shares scale` gives this host and
# the usage error of one worker more (`-n`, the controller's check of the workers' memory shares).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
seconds=${1:?seconds per run}
shift
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
fitting=$(python3 -m fa2_verify.properties.gpu_shares scale)
echo "gpu_shares: $fitting workers per GPU for scale"
python3 -m pytest --pyargs fa2_verify.properties "${plugin[@]}" -p no:cacheprovider --co -q -n "$((fitting + 1))" \
    --fa2-kernel triton --fa2-device cuda --fa2-profile scale 2>&1 | tail -n 2
for count in "$@"; do
    work="/tmp/scale-workers-$count"
    TRITON_CACHE_DIR="$work/triton-cache" FA2_SCALE_TARGETS="" FA2_SCALE_WORKERS="$count" \
        FA2_SCALE_PROFILE_SEED="${FA2_SCALE_PROFILE_SEED:-3}" FA2_SCALE_PROFILE_SECONDS="$seconds" \
        bash lab/device/device-scale.sh "$work" 2>&1 | grep -E '^== scale profile'
    cp "$work/scale-profile.md" "$OUT/scale-$count.md" 2>/dev/null
    cp "$work/properties-scale.log" "$OUT/properties-$count.log"
    echo "-- $count worker(s): $(grep -E 'wall time' "$OUT/scale-$count.md" 2>/dev/null)"
done
