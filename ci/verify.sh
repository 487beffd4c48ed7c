#!/usr/bin/env bash
# Verify $FA2_KERNEL on the fixed case set: $FA2_OUT/report/tolerance.json and a
# Markdown summary in $FA2_OUT/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/common.sh
source ci/common.sh

"$FA2_VERIFY" run --kernel "$FA2_KERNEL" --device "$FA2_DEVICE" \
    --report "$FA2_OUT/report" --markdown "$FA2_OUT/summary.md" --overwrite "$@"
