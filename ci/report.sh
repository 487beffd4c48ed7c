#!/usr/bin/env bash
# Turn $FA2_OUT/allure-results into the Allure 3 HTML report $FA2_OUT/allure-report; with
# $FA2_OUT/shards/*/allure-results (the runner shards of one run), merge them first.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/common.sh
source ci/common.sh

results=("$FA2_OUT/allure-results")
merged=()
if [[ -d "$FA2_OUT/shards" ]]; then
    # The nightly report job: each runner shard's artifact in $FA2_OUT/shards/<artifact>/, merged into
    # $FA2_OUT/allure-results (refused unless they are every shard of one run, each test in one of them).
    results=("$FA2_OUT"/shards/*/allure-results)
    merged=(--merged-results "$FA2_OUT/allure-results")
fi
"$FA2_VERIFY" report "${results[@]}" "${merged[@]}" --out "$FA2_OUT/allure-report" \
    --name "fa2-verify: $FA2_KERNEL on $FA2_DEVICE" --overwrite "$@"
