#!/usr/bin/env bash
# Run the property suite against $FA2_KERNEL, one pytest-xdist worker per GPU
# (worker gwI runs on cuda:I), writing Allure results and keeping the Hypothesis
# example database in $FA2_OUT/examples (restore it there to replay old failures).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/common.sh
source ci/common.sh

if [[ "$FA2_DEVICE" == cuda* ]]; then
    workers="$(nvidia-smi -L | wc -l)"
else
    workers="${FA2_WORKERS:-2}"
fi
rm -rf "$FA2_OUT/allure-results"
"$PYTHON" -m pytest properties -n "$workers" \
    --kernel "$FA2_KERNEL" --device "$FA2_DEVICE" --fa2-profile "$FA2_PROFILE" \
    --fa2-examples-dir "$FA2_OUT/examples" \
    --alluredir "$FA2_OUT/allure-results" \
    --junitxml "$FA2_OUT/properties.xml" "$@"
