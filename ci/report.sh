#!/usr/bin/env bash
# Turn $FA2_OUT/allure-results into the Allure 3 HTML report $FA2_OUT/allure-report.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/common.sh
source ci/common.sh

"$FA2_VERIFY" report "$FA2_OUT/allure-results" --out "$FA2_OUT/allure-report" \
    --name "fa2-verify: $FA2_KERNEL on $FA2_DEVICE" --overwrite "$@"
