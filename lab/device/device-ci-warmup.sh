#!/usr/bin/env bash
# ci/properties.sh with FA2_WARMUP=background on one GPU, as a GPU runner runs it:
#   lab/device/device-ci-warmup.sh [TIME_BUDGET]
# The image's Python stands in for ci/setup.sh's venv (FA2_VENV), the plugin is loaded with -p (no install
# step) and allure-pytest comes from the wheels carried in an ignored .whl-allure (allure-pytest and
# allure-python-commons, `pip download --no-deps`).  Runs the `scale` profile's float16 tests for
# TIME_BUDGET seconds (default 150, --fa2-time-budget), one worker, the warm-up on the other cores, then
# prints the exit status, the warm-up's processes left after the run (0 expected) and the variants compiled.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
# shellcheck source=lab/device/device-common.sh
source lab/device/device-common.sh
python3 -m pip install -q --no-index --no-deps --target "${FA2_DEPS_SITE:-/root/deps}" .whl-allure/*.whl || exit 2
FA2_VENV="$(dirname "$(dirname "$(command -v python3)")")"
export FA2_VENV TRITON_CACHE_DIR=/tmp/ci-warmup-triton FA2_PROFILE=scale FA2_WARMUP=background FA2_WORKERS_PER_GPU=1 \
    FA2_OUT=/tmp/ci-warmup
start=$(date +%s)
bash ci/properties.sh "${plugin[@]}" --fa2-time-budget "${1:-150}" -k float16 >"$OUT/properties.log" 2>&1
echo "ci/properties.sh: exit $? after $(($(date +%s) - start)) s"
sleep 2
echo "warm-up processes left: $(pgrep -c -f "^$FA2_VENV/bin/python[0-9.]* (-m fa2_verify warmup|-c from multiprocessing)")"
echo "variants compiled: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l)"
grep -E "examples checked|passed|failed" "$OUT/properties.log" | tail -n 3
